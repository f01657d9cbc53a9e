// Backing files of FUSE passthrough: the kernel reads and writes a staging file of the local
// tier itself for handles opened with its backing id. The kernel wants one backing file per inode
// at a time, so the id registered for an inode is shared by all its handles and unregistered
// with the last of them. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "fs/fuse_version.h"

namespace ckptfs::fs {

class BackingFiles {
 public:
  // Whether this build's libfuse can open files in passthrough mode at all.
  static constexpr bool kSupported = kFusePassthrough;

  // The backing id for handle fh of ino, registering fd (the store's staging file) when the
  // inode has none; 0 when the kernel refuses (logged by libfuse).
  int Acquire(fuse_req_t req, uint64_t ino, uint64_t fh, int fd);
  // Whether handle fh was opened in passthrough mode.
  bool Has(uint64_t fh);
  // Handle fh was released (any handle: those not acquired here are ignored).
  void Release(fuse_req_t req, uint64_t fh);

 private:
  struct Backing {
    int id = 0;
    int handles = 0;
  };
  std::mutex mu_;
  std::unordered_map<uint64_t, Backing> by_ino_;     // guarded by mu_
  std::unordered_map<uint64_t, uint64_t> handles_;  // fh -> ino, guarded by mu_
};

}  // namespace ckptfs::fs
