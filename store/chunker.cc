#include "store/chunker.h"

#include <algorithm>
#include <array>
#include <bit>

namespace ckptfs {
namespace {

// 256 fixed pseudo-random words (splitmix64 from a constant seed). Changing the seed or the
// generator changes every boundary: the golden-vector test guards it.
constexpr std::array<uint64_t, 256> MakeGear() {
  std::array<uint64_t, 256> g{};
  uint64_t x = 0x636b707466732121ull;  // "ckptfs!!"
  for (auto& v : g) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    v = z ^ (z >> 31);
  }
  return g;
}
constexpr std::array<uint64_t, 256> kGear = MakeGear();

// `bits` one-bits at the top of the word: the gear hash shifts left, so its top bits depend on
// the most recent 64 bytes.
constexpr uint64_t TopMask(int bits) { return bits <= 0 ? 0 : ~0ull << (64 - bits); }

}  // namespace

Chunker::Chunker(const ChunkingOptions& opts) : opts_(opts) {
  int bits = std::countr_zero(opts.avg_bytes);
  mask_small_ = TopMask(bits + 2);
  mask_large_ = TopMask(bits - 2);
}

size_t Chunker::FindCut(const uint8_t* data, size_t len) {
  const size_t min = opts_.min_bytes, avg = opts_.avg_bytes, max = opts_.max_bytes;
  if (len <= min) return 0;
  size_t i = std::max(pos_, min);
  uint64_t h = pos_ < min ? 0 : hash_;
  const size_t end = std::min(len, max);
  const size_t normal_end = std::min(end, avg);
  for (; i < normal_end; ++i) {
    h = (h << 1) + kGear[data[i]];
    if ((h & mask_small_) == 0) {
      Reset();
      return i + 1;
    }
  }
  for (; i < end; ++i) {
    h = (h << 1) + kGear[data[i]];
    if ((h & mask_large_) == 0) {
      Reset();
      return i + 1;
    }
  }
  if (end == max) {
    Reset();
    return max;
  }
  pos_ = i;
  hash_ = h;
  return 0;
}

}  // namespace ckptfs
