// OpenTable: the files the store has in use, by inode: one OpenFile (store/open_file.h) per file
// open through a handle or pinned by the store's own work (a seal, a change through a handle), so
// that every user of a file shares one entry. It also hands out the handle numbers and remembers
// the files whose next open must drop what the kernel cached of them.
//
// Thread-safe. mu_ guards files_ and stale_pages_ (and OpenFile::opens); next_fh_ is atomic.
// Lock order: mu_ is a leaf. Callers may hold a file's mu or the namespace lock when they call
// in (commits mark pages stale under mu; unlink asks IsOpen under it); nothing is called
// under mu_, and no OpenFile lock is taken here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "store/open_file.h"

namespace ckptfs {

class OpenTable {
 public:
  // The entry of ino, or null when the file is not in use.
  std::shared_ptr<OpenFile> Find(uint64_t ino);
  // The entry of ino, created if absent, with one more open counted.
  std::shared_ptr<OpenFile> Pin(uint64_t ino);
  // Drops one open of ino; true when it was the last (the entry is gone, or was never there).
  bool Unpin(uint64_t ino);
  bool IsOpen(uint64_t ino);
  // Every entry now (Close commits each).
  std::vector<std::pair<uint64_t, std::shared_ptr<OpenFile>>> All();
  size_t size();

  // A new file handle, unique for the store's life (never 0: 0 stands for "any").
  uint64_t NewHandle() { return next_fh_++; }

  // The file's uncommitted bytes were dropped while the kernel may hold them in its page cache.
  void MarkStale(uint64_t ino);
  // Whether ino was marked stale since the last call (the mark goes): its opener drops the
  // kernel's cached pages.
  bool TakeStale(uint64_t ino);

 private:
  Mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenFile>> files_ GUARDED_BY(mu_);
  std::unordered_set<uint64_t> stale_pages_ GUARDED_BY(mu_);
  std::atomic<uint64_t> next_fh_{1};
};

}  // namespace ckptfs
