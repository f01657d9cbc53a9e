#include "store/chunker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <set>
#include <vector>

#include "common/chunk_id.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

constexpr uint64_t kSeed = 0x5eed0fc4u;

// Chunk lengths of `data` fed in one piece (the last chunk is whatever is left).
std::vector<size_t> CutAll(const std::vector<uint8_t>& data, const ChunkingOptions& opts) {
  Chunker c(opts);
  std::vector<size_t> cuts;
  size_t start = 0;
  while (start < data.size()) {
    size_t cut = c.FindCut(data.data() + start, data.size() - start);
    if (cut == 0) {
      cut = data.size() - start;
      c.Reset();
    }
    cuts.push_back(cut);
    start += cut;
  }
  return cuts;
}

// The same, but bytes arrive in random-sized pieces and each scan resumes the previous one.
std::vector<size_t> CutStreaming(const std::vector<uint8_t>& data, const ChunkingOptions& opts,
                                 uint64_t seed, size_t max_piece) {
  test::SplitMix64 rng(seed);
  Chunker c(opts);
  std::vector<size_t> cuts;
  size_t start = 0;  // the pending chunk begins here
  size_t avail = 0;  // bytes fed so far
  while (avail < data.size()) {
    avail = std::min(data.size(), avail + 1 + rng.Below(max_piece));
    while (true) {
      size_t cut = c.FindCut(data.data() + start, avail - start);
      if (cut == 0) break;
      EXPECT_LE(start + cut, avail);
      cuts.push_back(cut);
      start += cut;
    }
  }
  if (start < data.size()) cuts.push_back(data.size() - start);
  return cuts;
}

std::vector<size_t> Offsets(const std::vector<size_t>& cuts) {
  std::vector<size_t> off;
  size_t pos = 0;
  for (size_t c : cuts) off.push_back(pos += c);
  return off;
}

std::multiset<ChunkId> Ids(const std::vector<uint8_t>& data, const std::vector<size_t>& cuts) {
  std::multiset<ChunkId> ids;
  size_t pos = 0;
  for (size_t c : cuts) {
    ids.insert(ChunkId::Of(data.data() + pos, c));
    pos += c;
  }
  return ids;
}

ChunkingOptions SmallOptions() {
  ChunkingOptions o;
  o.min_bytes = 4 << 10;
  o.avg_bytes = 16 << 10;
  o.max_bytes = 64 << 10;
  return o;
}

TEST(ChunkerTest, GoldenCutsWithDefaultOptions) {
  // Guards the gear table and the cut rule: any change moves every boundary of every stored file
  // and breaks dedup against existing chunks. Recompute only for a deliberate format change.
  const std::vector<uint8_t> data = test::RandomBytes(16 << 20, kSeed);
  std::vector<size_t> cuts = CutAll(data, ChunkingOptions{});
  const std::vector<size_t> kGolden = {1081176, 1082921, 338014,  1308569, 1061973, 1235109,
                                       1342890, 312808,  1280501, 1551887, 572653,  1726620};
  ASSERT_GE(cuts.size(), kGolden.size());
  for (size_t i = 0; i < kGolden.size(); ++i) EXPECT_EQ(cuts[i], kGolden[i]) << "chunk " << i;
}

TEST(ChunkerTest, GoldenCutsWithSmallOptions) {
  const std::vector<uint8_t> data = test::RandomBytes(1 << 20, kSeed + 1);
  std::vector<size_t> cuts = CutAll(data, SmallOptions());
  const std::vector<size_t> kGolden = {19224, 19748, 20001, 16896, 17612, 20358,
                                       17578, 30470, 19907, 21036, 20056, 26578};
  ASSERT_GE(cuts.size(), kGolden.size());
  for (size_t i = 0; i < kGolden.size(); ++i) EXPECT_EQ(cuts[i], kGolden[i]) << "chunk " << i;
}

// The algorithm written plainly, one byte at a time: gear hash h = (h << 1) + G[byte], with G the
// first 256 outputs of splitmix64 seeded with "ckptfs!!"; no cut before min_bytes; before
// avg_bytes a cut needs the log2(avg)+2 bits below the top bit of h clear, from then on
// log2(avg)-2 bits; a forced cut at max_bytes.
std::vector<size_t> ReferenceCuts(const std::vector<uint8_t>& data, const ChunkingOptions& o) {
  uint64_t gear[256];
  test::SplitMix64 rng(0x636b707466732121ull);
  for (uint64_t& g : gear) g = rng.Next();
  const int bits = std::countr_zero(o.avg_bytes);
  auto mask = [](int b) { return ((1ull << b) - 1) << (63 - b); };
  std::vector<size_t> cuts;
  size_t start = 0;
  while (start < data.size()) {
    const size_t left = data.size() - start;
    size_t cut = std::min<size_t>(left, o.max_bytes);
    uint64_t h = 0;
    for (size_t i = o.min_bytes; i < std::min<size_t>(left, o.max_bytes); ++i) {
      h = (h << 1) + gear[data[start + i]];
      if ((h & mask(i < o.avg_bytes ? bits + 2 : bits - 2)) == 0) {
        cut = i + 1;
        break;
      }
    }
    cuts.push_back(cut);
    start += cut;
  }
  return cuts;
}

TEST(ChunkerTest, AgreesWithAPlainReferenceImplementation) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions()}) {
    for (uint64_t seed : {kSeed, kSeed + 10, kSeed + 11}) {
      const std::vector<uint8_t> data = test::RandomBytes(8 << 20, seed);
      EXPECT_EQ(CutAll(data, opts), ReferenceCuts(data, opts)) << "avg " << opts.avg_bytes;
    }
  }
}

TEST(ChunkerTest, ChunksStayWithinBounds) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions()}) {
    const std::vector<uint8_t> data = test::RandomBytes(16 << 20, kSeed + 2);
    std::vector<size_t> cuts = CutAll(data, opts);
    ASSERT_GT(cuts.size(), 4u);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      EXPECT_GE(cuts[i], opts.min_bytes) << i;
      EXPECT_LE(cuts[i], opts.max_bytes) << i;
    }
    EXPECT_GE(cuts.back(), 1u);
    EXPECT_LE(cuts.back(), opts.max_bytes);
    // Random data: the average lands near avg_bytes (loosely: between min and max).
    const double mean = double(data.size()) / double(cuts.size());
    EXPECT_GT(mean, opts.min_bytes);
    EXPECT_LT(mean, opts.max_bytes);
  }
}

TEST(ChunkerTest, UniformBytesCutAtMax) {
  // Zero bytes: the gear hash of one byte repeated settles on a fixed value that does not match the
  // mask, so every chunk must be exactly max_bytes: the upper bound is enforced, not only likely.
  ChunkingOptions opts = SmallOptions();
  std::vector<uint8_t> data(opts.max_bytes * 5 + 123, 0);
  std::vector<size_t> cuts = CutAll(data, opts);
  ASSERT_EQ(cuts.size(), 6u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(cuts[i], opts.max_bytes);
  EXPECT_EQ(cuts[5], 123u);
}

TEST(ChunkerTest, NoCutAtOrBelowMin) {
  ChunkingOptions opts = SmallOptions();
  std::vector<uint8_t> data = test::RandomBytes(opts.min_bytes, kSeed);
  Chunker c(opts);
  for (size_t len = 0; len <= opts.min_bytes; len += 512)
    EXPECT_EQ(c.FindCut(data.data(), len), 0u);
}

TEST(ChunkerTest, StreamingMatchesOneShot) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions()}) {
    const std::vector<uint8_t> data = test::RandomBytes(8 << 20, kSeed + 3);
    std::vector<size_t> oneshot = CutAll(data, opts);
    for (uint64_t seed : {1, 2, 3}) {
      for (size_t piece : {size_t{97}, size_t{8192}, size_t{300000}}) {
        EXPECT_EQ(CutStreaming(data, opts, seed * 1000 + piece, piece), oneshot)
            << "seed " << seed << " piece " << piece << " avg " << opts.avg_bytes;
      }
    }
  }
}

// After an edit at `at` that changes the length by `shift` bytes, the boundaries past the first
// few chunks must be the same content positions: same later chunks, same ids.
void ExpectResync(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after, size_t at,
                  ptrdiff_t shift, const ChunkingOptions& opts) {
  std::vector<size_t> b = Offsets(CutAll(before, opts));
  std::vector<size_t> a = Offsets(CutAll(after, opts));
  ASSERT_GT(b.size(), 10u);
  std::set<size_t> a_set(a.begin(), a.end());
  // Boundaries before the edit are untouched.
  size_t i = 0;
  for (; i < b.size() && b[i] <= at; ++i) EXPECT_TRUE(a_set.count(b[i])) << b[i];
  // Within two chunks after the edit the cuts line up again, and from then on all of them do.
  size_t first_match = b.size();
  for (size_t j = i; j < b.size(); ++j) {
    if (a_set.count(b[j] + shift)) {
      first_match = j;
      break;
    }
  }
  ASSERT_LE(first_match, i + 2) << "no resync within two chunks of the edit";
  for (size_t j = first_match; j < b.size(); ++j) {
    EXPECT_TRUE(a_set.count(b[j] + shift)) << "boundary " << j << " moved";
  }
  EXPECT_LE(a.size(), b.size() + 2);
  EXPECT_GE(a.size() + 2, b.size());

  // Dedup survives: all but a couple of chunk ids are shared.
  std::multiset<ChunkId> ib = Ids(before, CutAll(before, opts));
  std::multiset<ChunkId> ia = Ids(after, CutAll(after, opts));
  std::vector<ChunkId> shared;
  std::set_intersection(ib.begin(), ib.end(), ia.begin(), ia.end(), std::back_inserter(shared));
  EXPECT_GE(shared.size() + 3, ib.size());
}

TEST(ChunkerTest, StableUnderInsertion) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions()}) {
    const std::vector<uint8_t> before = test::RandomBytes(opts.avg_bytes * 16, kSeed + 4);
    std::vector<uint8_t> after = before;
    const std::vector<uint8_t> ins = test::RandomBytes(100, kSeed + 5);
    const size_t at = 1000;
    after.insert(after.begin() + at, ins.begin(), ins.end());
    ExpectResync(before, after, at, 100, opts);
  }
}

TEST(ChunkerTest, StableUnderDeletion) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions()}) {
    const std::vector<uint8_t> before = test::RandomBytes(opts.avg_bytes * 16, kSeed + 6);
    std::vector<uint8_t> after = before;
    const size_t at = opts.min_bytes + 777;  // inside the first chunk's scanned region
    after.erase(after.begin() + at, after.begin() + at + 333);
    ExpectResync(before, after, at, -333, opts);
  }
}

}  // namespace
}  // namespace ckptfs
