/* An LD_PRELOAD shim for the failing-disk tests: while the file named by
 * $CKPTFS_TEST_LMDB_FAULT exists, every write to and sync of an LMDB data file (a path ending
 * in "/data.mdb") fails with EIO, as a failing disk under the metadata would. Other files are
 * untouched. Test-only: built beside the tests, never linked into ckptfs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int failing(int fd) {
  const char* trigger = getenv("CKPTFS_TEST_LMDB_FAULT");
  struct stat st;
  if (!trigger || stat(trigger, &st) != 0) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 9) return 0;
  path[n] = '\0';
  if (strcmp(path + n - 9, "/data.mdb") != 0) return 0;
  errno = EIO;
  return 1;
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  return failing(fd) ? -1 : NEXT(pwrite)(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  return failing(fd) ? -1 : NEXT(pwrite64)(fd, buf, n, off);
}
ssize_t write(int fd, const void* buf, size_t n) {
  return failing(fd) ? -1 : NEXT(write)(fd, buf, n);
}
ssize_t writev(int fd, const struct iovec* iov, int cnt) {
  return failing(fd) ? -1 : NEXT(writev)(fd, iov, cnt);
}
ssize_t pwritev(int fd, const struct iovec* iov, int cnt, off_t off) {
  return failing(fd) ? -1 : NEXT(pwritev)(fd, iov, cnt, off);
}
ssize_t pwritev64(int fd, const struct iovec* iov, int cnt, off_t off) {
  return failing(fd) ? -1 : NEXT(pwritev64)(fd, iov, cnt, off);
}
int fdatasync(int fd) { return failing(fd) ? -1 : NEXT(fdatasync)(fd); }
int fsync(int fd) { return failing(fd) ? -1 : NEXT(fsync)(fd); }
