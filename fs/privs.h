// Set-user-ID and set-group-ID bits: which a write, a truncation or a chown clears, as the
// kernel's VFS decides for a local filesystem (docs/posix.md).
//
// The mount takes FUSE_HANDLE_KILLPRIV_V2 where the kernel offers it: the kernel then no longer
// asks for security.capability before every write (one round trip per write(2) otherwise, a
// quarter of a passthrough writer's time) and leaves clearing the bits to the daemon. It says
// when: a SETATTR that changes nothing (a write, an fallocate or chown(-1, -1) that must clear
// them), one with FATTR_KILL_SUIDGID (a truncation or chown by a caller without CAP_FSETID), a
// chown. An O_TRUNC open is the one case libfuse does not pass on (FUSE_OPEN_KILL_SUIDGID): the
// daemon decides it from the caller. File capabilities stay the kernel's: it still removes
// security.capability itself.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

namespace ckptfs::fs {

// What the kernel would check of a caller: CAP_FSETID and group membership.
struct CallerPrivs {
  bool fsetid = false;  // holds CAP_FSETID in the daemon's user namespace
  uint32_t fsgid = UINT32_MAX;
  std::vector<uint32_t> groups;
  bool InGroupOrCapable(uint32_t gid) const;
};

// The privileges of process (or thread) `pid` from /proc. A caller that cannot be read (gone,
// pid 0 from another PID namespace, /proc with hidepid) has none; one in another user namespace
// has no CAP_FSETID (its capabilities there do not count for this filesystem's files).
CallerPrivs PrivsOf(pid_t pid);

// The set-id bits of `mode` that a write or truncation by `who` clears: none for a caller with
// CAP_FSETID, else set-user-ID, and set-group-ID where the group may execute the file or the
// caller is not in the file's group `gid`.
uint32_t SetidClearedByWrite(uint32_t mode, uint32_t gid, const CallerPrivs& who);

// The bits a chown by `who` clears (also what the kernel asks for with a SETATTR that changes
// nothing): set-user-ID always, set-group-ID as for a write unless `who` may keep it.
uint32_t SetidClearedByChown(uint32_t mode, uint32_t gid, const CallerPrivs& who);

// The kernel removes security.capability itself (REMOVEXATTR) when a write must, then sends the
// same empty SETATTR it sends when set-id bits must go: even for a writer with CAP_FSETID,
// whose bits stay. The removals just seen, so that the SETATTR after one is told apart.
class CapsRemovals {
 public:
  void Note(uint64_t ino, pid_t pid);
  // Whether `pid` removed ino's capabilities just before (forgotten once asked).
  bool Take(uint64_t ino, pid_t pid);

 private:
  static constexpr size_t kKept = 64;
  std::mutex mu_;
  std::deque<std::pair<uint64_t, pid_t>> recent_;  // guarded by mu_, newest last
};

}  // namespace ckptfs::fs
