// MemoryBudget: a daemon-wide bound on bytes held in memory by many users at once (the files'
// write queues, their reorder windows), so that 64 files written at once cannot hold gigabytes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace ckptfs {

// Thread-safe. Take blocks (back-pressure); TryTake lets the caller fall back (a reorder window
// spills to its staging file instead). A request larger than the whole limit is let in alone,
// when nothing else is taken, so that it cannot wait forever.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  void Take(uint64_t n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return Fits(n); });
    Add(n);
  }
  bool TryTake(uint64_t n) {
    std::lock_guard lock(mu_);
    if (!Fits(n)) return false;
    Add(n);
    return true;
  }
  void Release(uint64_t n) {
    if (n == 0) return;
    {
      std::lock_guard lock(mu_);
      used_ -= n;
    }
    cv_.notify_all();
  }
  uint64_t used() const {
    std::lock_guard lock(mu_);
    return used_;
  }
  uint64_t peak() const {
    std::lock_guard lock(mu_);
    return peak_;
  }
  uint64_t limit() const { return limit_; }

 private:
  bool Fits(uint64_t n) const { return used_ == 0 || used_ + n <= limit_; }
  void Add(uint64_t n) {
    used_ += n;
    if (used_ > peak_) peak_ = used_;
  }

  const uint64_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t used_ = 0, peak_ = 0;  // guarded by mu_
};

}  // namespace ckptfs
