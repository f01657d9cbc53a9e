// Hands a view file's bytes to the page cache in whole pages.
//
// The kernel marks a page of a FUSE file valid only when one store (fuse_lowlevel_notify_store)
// covers all of it, from its first byte to its last or to the end of the file. The CRC pass reads
// a view file's records, which start and end anywhere, and the zip headers between them are
// patched only when every CRC is known; a page that holds a record boundary would therefore be
// stored in part, stay invalid, and cost its reader a FUSE read of a source chunk. ViewPages
// passes on the whole pages of what it takes at once, keeps the partial ends, and once the
// headers are final fills in the remaining pages from those ends and the recipe's literal bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/recipe.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

class ViewPages {
 public:
  // A file of `size` bytes whose pages of `page` bytes (a power of two) go to `out`.
  ViewPages(uint64_t size, size_t page, ViewBytesFn out);

  // Takes bytes [offset, offset + len) of the file: their whole pages go to `out` now, the rest
  // is kept for Finish. Thread-safe; `out` may run on several threads at once.
  void Take(uint64_t offset, const uint8_t* data, size_t len);
  // As a ViewBytesFn that calls Take; `this` must outlive it.
  ViewBytesFn Sink();

  // Sends every page not yet sent whose bytes are all known, from the kept ends and the literal
  // bytes of `recipe` (with its CRCs patched): contiguous pages together, up to 1 MiB at once.
  // A page with bytes that were never taken stays unsent (its reader gets it through FUSE).
  // REQUIRES: no Take runs meanwhile.
  void Finish(const Recipe& recipe);

  // Pages sent so far (for tests and logs).
  uint64_t pages_sent() const;

 private:
  // Copies bytes [offset, offset + len) of the file from the kept ends into out; false when a
  // byte of them was not kept.
  bool CopyKept(uint64_t offset, uint64_t len, uint8_t* out) const;
  void MarkSent(uint64_t first_page, uint64_t end_page);

  const uint64_t size_;
  const size_t page_;
  const ViewBytesFn out_;
  mutable std::mutex mu_;
  std::vector<bool> sent_;                // per page; guarded by mu_
  std::map<uint64_t, std::string> kept_;  // file offset -> bytes of a partial page; guarded by mu_
};

}  // namespace ckptfs::reshard
