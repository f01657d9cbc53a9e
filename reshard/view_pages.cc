#include "reshard/view_pages.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace ckptfs::reshard {

ViewPages::ViewPages(uint64_t size, size_t page, ViewBytesFn out)
    : size_(size), page_(page), out_(std::move(out)), sent_((size + page - 1) / page, false) {}

void ViewPages::Take(uint64_t offset, const uint8_t* data, size_t len) {
  const uint64_t end = std::min(offset + len, size_);
  if (offset >= end) return;
  // Whole pages: from the first page boundary at or after offset to the last one at or before
  // end, or to end itself when it is the end of the file (the kernel takes a short last page).
  const uint64_t first = (offset + page_ - 1) / page_ * page_;
  const uint64_t last = end == size_ ? end : end / page_ * page_;
  if (first < last) out_(first, data + (first - offset), last - first);  // outside mu_: a copy
  std::lock_guard lock(mu_);
  if (first < last) MarkSent(first / page_, (last + page_ - 1) / page_);
  // The partial ends (or all of it, when no page lies wholly inside).
  const uint64_t head_end = std::min(first, end);
  if (offset < head_end) {
    kept_[offset].assign(reinterpret_cast<const char*>(data), head_end - offset);
  }
  const uint64_t tail = std::max(first, last);
  if (tail < end && tail >= head_end) {
    kept_[tail].assign(reinterpret_cast<const char*>(data + (tail - offset)), end - tail);
  }
}

ViewBytesFn ViewPages::Sink() {
  return [this](uint64_t offset, const uint8_t* data, size_t len) { Take(offset, data, len); };
}

void ViewPages::MarkSent(uint64_t first_page, uint64_t end_page) {
  for (uint64_t p = first_page; p < end_page; ++p) sent_[p] = true;
}

bool ViewPages::CopyKept(uint64_t offset, uint64_t len, uint8_t* out) const {
  while (len > 0) {
    auto it = kept_.upper_bound(offset);
    if (it == kept_.begin()) return false;
    --it;
    const uint64_t at = offset - it->first;
    if (at >= it->second.size()) return false;
    const uint64_t n = std::min<uint64_t>(len, it->second.size() - at);
    std::memcpy(out, it->second.data() + at, n);
    out += n;
    offset += n;
    len -= n;
  }
  return true;
}

void ViewPages::Finish(const Recipe& recipe) {
  constexpr uint64_t kBatch = 1 << 20;
  std::lock_guard lock(mu_);
  std::string batch;
  uint64_t batch_at = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    out_(batch_at, reinterpret_cast<const uint8_t*>(batch.data()), batch.size());
    MarkSent(batch_at / page_, (batch_at + batch.size() + page_ - 1) / page_);
    batch.clear();
  };
  std::string page(page_, '\0');
  for (uint64_t p = 0; p < sent_.size(); ++p) {
    if (sent_[p]) continue;
    const uint64_t at = p * page_, n = std::min<uint64_t>(page_, size_ - at);
    uint64_t pos = 0;
    Status st = recipe.Walk(at, n, [&](const Piece& pc) -> Status {
      uint8_t* to = reinterpret_cast<uint8_t*>(page.data()) + pos;
      if (pc.literal) {
        std::memcpy(to, pc.literal, pc.len);
      } else if (!CopyKept(at + pos, pc.len, to)) {
        return NotFound("bytes not taken");
      }
      pos += pc.len;
      return Status::Ok();
    });
    if (!st.ok() || pos != n) {
      flush();
      continue;
    }
    if (!batch.empty() && batch_at + batch.size() != at) flush();
    if (batch.empty()) batch_at = at;
    batch.append(page.data(), n);
    if (batch.size() >= kBatch) flush();
  }
  flush();
  kept_.clear();
}

uint64_t ViewPages::pages_sent() const {
  std::lock_guard lock(mu_);
  return static_cast<uint64_t>(std::count(sent_.begin(), sent_.end(), true));
}

}  // namespace ckptfs::reshard
