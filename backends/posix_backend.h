// PosixBackend: the remote tier as a directory, typically on a parallel filesystem (Lustre, GPFS,
// NFS) that every node mounts. Each object is one file; a Put writes a private temporary file and
// renames it over the final name, so readers on any node see the old object or the new one.
//
// Layout under the root. An object store allows "a/b" and "a/b/c" side by side, a directory tree
// does not (b cannot be a file and a directory), so files and directories live in disjoint name
// spaces: every directory name ends in ".d". Key "chunks/ab/0f3c" is the file
// ROOT/chunks.d/ab.d/0f3c. A file component that itself ends in ".d" or ".e" gets ".e" appended
// ("x.d" -> "x.d.e"), and any component that starts with '.' or '%' gets a '%' in front (".x" ->
// "%.x"), so that names starting with '.' belong to the filesystem and to us: ROOT/.tmp/ holds the
// temporary files of Puts in flight, and NFS's ".nfsXXXX" leftovers are never mistaken for objects.
// A key component longer than about 250 bytes does not fit a file name (NAME_MAX): kNameTooLong.
//
// Thread-safe, and safe to share one root among many processes on many nodes: temporary names
// carry the host, the pid and a random tag; directories emptied by a Delete are removed, and a Put
// whose parent directory vanished under it (a concurrent Delete pruned it) makes it again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>

#include "backends/backend.h"
#include "common/log.h"

namespace ckptfs {

struct PosixBackendOptions {
  // fsync each object before its rename and the directory after it, so that OK means durable
  // (the Backend contract). Turn off only for throwaway data (benchmarks of the layers above).
  bool fsync = true;
  // Open removes temporary files older than this from ROOT/.tmp/: the leftovers of a Put whose
  // process died. The age is by mtime, which every write of a live Put refreshes, and it has to
  // be generous because another node may be writing into the same ROOT/.tmp/ right now; a live
  // Put that stalls longer than this loses its temporary file and fails (kIo), it never corrupts.
  std::chrono::seconds stale_temp_age = std::chrono::minutes(30);
};

class PosixBackend : public Backend {
 public:
  // `root` must be an existing directory (kNotFound / kNotDir otherwise: a typo in a mount
  // option should not silently create a tree somewhere else). Creates ROOT/.tmp/ if missing and
  // clears its stale files.
  static Result<std::unique_ptr<PosixBackend>> Open(const std::string& root,
                                                    const PosixBackendOptions& options = {});

  Status Put(const std::string& key, const void* data, size_t len) override;
  // link(2) of a complete temporary file: atomic and exclusive, also on NFS and Lustre. Where
  // the filesystem has no hard links, an O_EXCL create written in place: exclusive, not atomic.
  Status PutIfAbsent(const std::string& key, const void* data, size_t len) override;
  Result<size_t> Get(const std::string& key, uint64_t offset, void* buf, size_t len) override;
  // One open file, so never the kCorrupt of the default when a Put replaces the object meanwhile.
  Result<std::string> GetObject(const std::string& key) override;
  Result<ObjectInfo> Head(const std::string& key) override;
  // Unlinks the file, then removes the directories it leaves empty, up to the root. Not fsynced:
  // an object that comes back after a crash is garbage that the next GC pass deletes again.
  Status Delete(const std::string& key) override;
  // A depth-first walk that reads one directory at a time (sorted by the keys its entries stand
  // for, which is byte order of the whole keys) and skips subtrees that cannot match `prefix` or
  // lie wholly at or before `start_after`. Memory: the entries of the directories on the current
  // path, never the whole listing.
  Status List(const std::string& prefix, const std::string& start_after,
              const std::function<bool(const ObjectInfo&)>& fn) override;
  std::string Describe() const override;

  // Where `key` lives ("ROOT/chunks.d/ab.d/0f3c"), for tests and `ckptfs fsck`.
  // REQUIRES: CheckKey(key).ok().
  std::string PathOf(const std::string& key) const;
  const std::string& root() const { return root_; }

 private:
  PosixBackend(std::string root, const PosixBackendOptions& options, std::string temp_tag);
  Result<int> OpenObject(const std::string& key) const;
  // pread until len bytes or the end of the file, through EINTR and short reads.
  Result<size_t> ReadAt(int fd, char* buf, size_t len, uint64_t offset,
                        const std::string& key) const;
  Status MakeParents(const std::string& key) const;
  Status WriteTemp(const std::string& tmp, const void* data, size_t len) const;
  // Put (rename over the key) or PutIfAbsent (link, kExists when the key exists).
  Status Place(const std::string& key, const void* data, size_t len, bool exclusive);
  Status SyncDir(const std::string& dir) const;
  void PruneParents(const std::string& key) const;
  Status Walk(const std::string& dir, const std::string& key_prefix, const std::string& prefix,
              const std::string& start_after, const std::function<bool(const ObjectInfo&)>& fn,
              bool* stop) const;

  const std::string root_;      // no trailing '/'
  const std::string temp_dir_;  // ROOT/.tmp
  const PosixBackendOptions options_;
  const std::string temp_tag_;  // "<host>.<pid>.<random>": unique among the root's sharers
  std::atomic<uint64_t> temp_seq_{0};
  Logger log_;
  // Shared by a Put between making its parent directories and renaming into them, exclusive while
  // a Delete prunes: within this process a Put never loses a directory it just made. The only
  // lock; nothing else is taken while it is held.
  mutable std::shared_mutex prune_mu_;
};

}  // namespace ckptfs
