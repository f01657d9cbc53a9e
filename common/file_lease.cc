#include "common/file_lease.h"

#include <fcntl.h>

#include <cerrno>
#include <csignal>
#include <mutex>

namespace ckptfs {
namespace {

Openers Probe(int fd, int type) {
  static std::once_flag ignore_sigio;
  std::call_once(ignore_sigio, [] { ::signal(SIGIO, SIG_IGN); });
  if (::fcntl(fd, F_SETLEASE, type) == 0) {
    (void)::fcntl(fd, F_SETLEASE, F_UNLCK);
    return Openers::kNone;
  }
  return errno == EAGAIN ? Openers::kSome : Openers::kUnknown;
}

}  // namespace

Openers OtherOpeners(int fd) { return Probe(fd, F_WRLCK); }

Openers WritersOf(int ro_fd) { return Probe(ro_fd, F_RDLCK); }

}  // namespace ckptfs
