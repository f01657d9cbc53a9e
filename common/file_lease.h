// Who else has a file open, as the kernel's file leases (fcntl F_SETLEASE) tell it. A lease is
// granted only when no conflicting open exists anywhere in the system, counting open file
// descriptions the caller cannot see: another process's descriptor, a mapping kept after its
// descriptor's close (FUSE passthrough hands mmap to the backing file itself), a descriptor
// left from a daemon that died. Each probe takes the lease and gives it back at once.
//
// A lease being held makes the kernel signal its holder (SIGIO) when another process opens the
// file; the first probe sets SIGIO to be ignored in this process, so that an open racing a probe
// costs nothing (it waits for the lease's release, microseconds).
#pragma once

namespace ckptfs {

enum class Openers {
  kNone,     // the lease was granted
  kSome,     // refused: such an open exists (EAGAIN)
  kUnknown,  // refused for another reason (leases disabled, a filesystem without them)
};

// Whether any open file description other than fd's has the file open, for reading or writing
// (a write lease on fd).
Openers OtherOpeners(int fd);

// Whether any open file description has the file open for writing (a read lease). `ro_fd` must
// be opened read-only, and the caller must hold no writable description of the file itself, or
// the answer is always kSome.
Openers WritersOf(int ro_fd);

}  // namespace ckptfs
