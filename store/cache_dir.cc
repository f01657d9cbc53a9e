#include "store/cache_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace ckptfs {
namespace {

Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      std::string p = path.substr(0, i);
      if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::FromErrno(errno, "mkdir " + p);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CacheDir>> CacheDir::Open(const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(MakeDirs(dir + "/staging"));
  RETURN_IF_ERROR(MakeDirs(dir + "/passthrough"));
  const std::string lock_path = dir + "/lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return Status::FromErrno(errno, "open " + lock_path);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return Status(Code::kBusy, "cache directory " + dir + " is in use by another ckptfs daemon");
    }
    return Status::FromErrno(err, "lock " + lock_path);
  }
  const std::string clean_path = dir + "/clean";
  const bool existed = ::access((dir + "/meta").c_str(), F_OK) == 0;
  const bool clean = !existed || ::access(clean_path.c_str(), F_OK) == 0;
  ::unlink(clean_path.c_str());
  return std::unique_ptr<CacheDir>(new CacheDir(dir, lock_fd, clean));
}

CacheDir::~CacheDir() { ::close(lock_fd_); }

void CacheDir::ClearSpills() const {
  if (DIR* d = ::opendir((dir_ + "/staging").c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ::unlinkat(::dirfd(d), e->d_name, 0);
    }
    ::closedir(d);
  }
}

void CacheDir::NoteOwner() const {
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) == 0) {
    [[maybe_unused]] ssize_t n = ::pwrite(lock_fd_, pid.data(), pid.size(), 0);
  }
}

void CacheDir::MarkClean() const {
  const int fd = ::open((dir_ + "/clean").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

}  // namespace ckptfs
