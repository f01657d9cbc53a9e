#include "fs/backing.h"

namespace ckptfs::fs {

int BackingFiles::Acquire([[maybe_unused]] fuse_req_t req, uint64_t ino, uint64_t fh,
                          [[maybe_unused]] int fd) {
#if defined(FUSE_CAP_PASSTHROUGH)
  std::lock_guard lock(mu_);
  Backing& b = by_ino_[ino];
  if (b.handles == 0) {
    b.id = fuse_passthrough_open(req, fd);
    if (b.id <= 0) {
      by_ino_.erase(ino);
      return 0;
    }
  }
  // The store hands out one staging file per inode while any of its handles is open.
  ++b.handles;
  handles_[fh] = ino;
  return b.id;
#else
  (void)ino;
  (void)fh;
  return 0;
#endif
}

bool BackingFiles::Has(uint64_t fh) {
  std::lock_guard lock(mu_);
  return handles_.count(fh) > 0;
}

void BackingFiles::Release([[maybe_unused]] fuse_req_t req, uint64_t fh) {
#if defined(FUSE_CAP_PASSTHROUGH)
  std::lock_guard lock(mu_);
  auto h = handles_.find(fh);
  if (h == handles_.end()) return;
  auto b = by_ino_.find(h->second);
  handles_.erase(h);
  if (b == by_ino_.end() || --b->second.handles > 0) return;
  fuse_passthrough_close(req, b->second.id);
  by_ino_.erase(b);
#else
  (void)fh;
#endif
}

}  // namespace ckptfs::fs
