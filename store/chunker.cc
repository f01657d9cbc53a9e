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

constexpr std::array<uint64_t, 256> MakeGearShifted() {
  std::array<uint64_t, 256> g{};
  for (size_t i = 0; i < 256; ++i) g[i] = kGear[i] << 1;
  return g;
}
constexpr std::array<uint64_t, 256> kGearShifted = MakeGearShifted();

// `bits` one-bits just below the top bit: the gear hash shifts left, so these bits depend on the
// most recent 63 bytes. Bit 63 stays out of the mask so that a mask shifted left by one loses
// nothing, which the two-bytes-at-a-time scan relies on.
constexpr uint64_t HighMask(int bits) {
  return bits <= 0 ? 0 : (((1ull << bits) - 1) << (63 - bits));
}

// Scans data[i..end) two bytes per step. The hash after byte i+1 is (h << 2) + (G[b_i] << 1) +
// G[b_i+1]: the serial chain is one shift and one add per two bytes, with the table lookups off
// the chain. The hash after byte i is checked through its left shift, (h << 2) + (G[b_i] << 1),
// against the mask shifted left by one. Returns the cut (one past the byte whose hash matched) or
// 0, leaving the hash and position for the next call.
inline size_t Scan(const uint8_t* data, size_t& i, size_t end, uint64_t& h, uint64_t mask) {
  const uint64_t mask2 = mask << 1;
  for (; i + 2 <= end; i += 2) {
    uint64_t a = (h << 2) + kGearShifted[data[i]];
    h = a + kGear[data[i + 1]];
    if ((a & mask2) == 0) {
      h = a >> 1;  // the hash after byte i, so that a resumed scan stays exact
      ++i;
      return i;
    }
    if ((h & mask) == 0) {
      i += 2;
      return i;
    }
  }
  if (i < end) {
    h = (h << 1) + kGear[data[i]];
    ++i;
    if ((h & mask) == 0) return i;
  }
  return 0;
}

}  // namespace

Chunker::Chunker(const ChunkingOptions& opts) : opts_(opts) {
  int bits = std::countr_zero(opts.avg_bytes);
  mask_small_ = HighMask(bits + 2);
  mask_large_ = HighMask(bits - 2);
}

size_t Chunker::FindCut(const uint8_t* data, size_t len) {
  const size_t min = opts_.min_bytes, avg = opts_.avg_bytes, max = opts_.max_bytes;
  if (len <= min) return 0;
  size_t i = std::max(pos_, min);
  uint64_t h = pos_ < min ? 0 : hash_;
  const size_t end = std::min(len, max);
  const size_t normal_end = std::min(end, avg);
  if (i < normal_end) {
    if (size_t cut = Scan(data, i, normal_end, h, mask_small_)) {
      Reset();
      return cut;
    }
  }
  if (i < end) {
    if (size_t cut = Scan(data, i, end, h, mask_large_)) {
      Reset();
      return cut;
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

bool Chunker::FindCandidates(const uint8_t* data, size_t len, size_t history, uint64_t begin,
                             std::vector<uint64_t>* out) const {
  const size_t warm = std::min(history, kExactBytes);
  uint64_t h = 0;
  for (size_t k = warm; k > 0; --k) h = (h << 1) + kGear[data[-static_cast<std::ptrdiff_t>(k)]];
  // The bytes with fewer than 63 before them are hashed, not listed.
  size_t j = 0;
  for (const size_t first = std::min(kExactBytes - warm, len); j < first; ++j) {
    h = (h << 1) + kGear[data[j]];
  }
  // A byte meets the large mask with odds 4 / avg_bytes: four times that, and the list is refused.
  const size_t had = out->size();
  const size_t most = had + len / std::max<size_t>(opts_.avg_bytes / 16, 1) + 64;
  // Scan stops at each byte that meets the mask, with the hash after it: listed, then on.
  while (size_t past = Scan(data, j, len, h, mask_large_)) {
    if (out->size() == most) {
      out->resize(had);
      return false;
    }
    out->push_back((begin + past - 1) << 1 | ((h & mask_small_) == 0 ? 1 : 0));
  }
  return true;
}

size_t Chunker::FindCutWith(const CutCandidates& c, uint64_t pos, const uint8_t* data,
                            size_t len) {
  Reset();
  const size_t min = opts_.min_bytes, avg = opts_.avg_bytes, max = opts_.max_bytes;
  if (len <= min) return 0;
  const size_t end = std::min(len, max);
  // The first bytes as FindCut scans them.
  const size_t exact_end = std::min(end, CandidatesFrom());
  size_t i = min;
  uint64_t h = 0;
  if (i < std::min(exact_end, avg)) {
    if (size_t cut = Scan(data, i, std::min(exact_end, avg), h, mask_small_)) return cut;
  }
  if (i < exact_end) {
    if (size_t cut = Scan(data, i, exact_end, h, mask_large_)) return cut;
  }
  // The rest from the list: the first candidate that meets the mask of its place in the chunk.
  const uint64_t to = pos + end;
  auto it = std::lower_bound(c.at.begin(), c.at.end(), (pos + exact_end) << 1);
  for (; it != c.at.end() && (*it >> 1) < to; ++it) {
    const auto at = static_cast<size_t>((*it >> 1) - pos);
    if (at >= avg || (*it & 1)) return at + 1;
  }
  return end == max ? max : 0;
}

}  // namespace ckptfs
