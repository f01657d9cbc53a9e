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

ChunkingOptions Sizes(uint32_t min, uint32_t avg, uint32_t max) {
  ChunkingOptions o;
  o.min_bytes = min;
  o.avg_bytes = avg;
  o.max_bytes = max;
  return o;
}

ChunkingOptions SmallOptions() { return Sizes(4 << 10, 16 << 10, 64 << 10); }
// The smallest chunks the options allow.
ChunkingOptions TinyOptions() { return Sizes(4 << 10, 8 << 10, 16 << 10); }

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

// Candidates of data[0..) found in `parts` pieces, each with the bytes before it as history (as
// FileWriter::PlanAhead does); false if a piece had too many. `list` covers the pieces up to it.
bool FindAhead(const Chunker& c, const std::vector<uint8_t>& data, size_t parts,
               CutCandidates* list) {
  list->Clear();
  list->begin = list->end = 63;  // a byte is listed once 63 bytes precede it
  for (size_t k = 0; k < parts; ++k) {
    const size_t b = data.size() * k / parts, e = data.size() * (k + 1) / parts;
    if (!c.FindCandidates(data.data() + b, e - b, b, b, &list->at)) return false;
    list->end = e;
  }
  return true;
}

// CutAll, reading each chunk's cut off candidates found ahead where they cover it.
std::vector<size_t> CutAhead(const std::vector<uint8_t>& data, const ChunkingOptions& opts,
                             size_t parts, size_t* from_list) {
  Chunker c(opts);
  CutCandidates list;
  FindAhead(c, data, parts, &list);
  std::vector<size_t> cuts;
  *from_list = 0;
  size_t start = 0;
  while (start < data.size()) {
    const size_t len = data.size() - start;
    const size_t end = std::min<size_t>(len, opts.max_bytes);
    size_t cut;
    if (end > c.CandidatesFrom() && list.Covers(start + c.CandidatesFrom(), start + end)) {
      cut = c.FindCutWith(list, start, data.data() + start, len);
      ++*from_list;
    } else {
      cut = c.FindCut(data.data() + start, len);
    }
    if (cut == 0) {
      cut = len;
      c.Reset();
    }
    cuts.push_back(cut);
    start += cut;
  }
  return cuts;
}

TEST(ChunkerTest, CandidatesFoundAheadGiveTheSameCuts) {
  for (const ChunkingOptions& opts : {ChunkingOptions{}, SmallOptions(), TinyOptions()}) {
    // Random bytes, with a run of zeros and a repeated short pattern in the middle.
    std::vector<uint8_t> data = test::RandomBytes(opts.max_bytes * 6, kSeed + 20);
    std::fill(data.begin() + opts.max_bytes, data.begin() + opts.max_bytes + opts.avg_bytes * 3, 0);
    for (size_t i = opts.max_bytes * 3; i < opts.max_bytes * 4; ++i) data[i] = "ckptfs"[i % 6];
    const std::vector<size_t> want = CutAll(data, opts);
    for (size_t parts : {1, 2, 3, 7}) {
      size_t from_list = 0;
      EXPECT_EQ(CutAhead(data, opts, parts, &from_list), want)
          << "avg " << opts.avg_bytes << ", " << parts << " parts";
      EXPECT_GT(from_list, want.size() / 2) << "the candidates were hardly used";
    }
  }
}

TEST(ChunkerTest, FindCutWithAgreesWithFindCutAtAnyStartAndLength) {
  // Chunk starts that are no cut of the sequence, and lengths around every bound: below min,
  // within the 63 scanned bytes after it, short of a cut (0: more bytes), past max. The smallest
  // chunks make a candidate among the first 63 bytes after min likely at some start: there the
  // scan's hash covers fewer bytes than the candidate's, and only the scan is right.
  for (const auto& [opts, rounds] : {std::pair{SmallOptions(), 400}, std::pair{TinyOptions(), 6000}}) {
    const std::vector<uint8_t> data = test::RandomBytes(1 << 20, kSeed + 21);
    Chunker ahead(opts), plain(opts);
    CutCandidates list;
    ASSERT_TRUE(FindAhead(ahead, data, 3, &list));
    test::SplitMix64 rng(kSeed + 22);
    const size_t lens[] = {0, opts.min_bytes, opts.min_bytes + 1, opts.min_bytes + 30,
                           opts.min_bytes + 63, opts.min_bytes + 64, opts.avg_bytes,
                           opts.avg_bytes + 1, opts.max_bytes - 1, opts.max_bytes,
                           opts.max_bytes + 4096};
    size_t zeros = 0, cuts = 0;
    for (int round = 0; round < rounds; ++round) {
      const size_t start = rng.Next() % (data.size() - 2 * opts.max_bytes);
      for (size_t len : lens) {
        plain.Reset();
        const size_t want = plain.FindCut(data.data() + start, len);
        ASSERT_EQ(ahead.FindCutWith(list, start, data.data() + start, len), want)
            << "avg " << opts.avg_bytes << ", start " << start << ", length " << len;
        (want ? cuts : zeros)++;
      }
    }
    EXPECT_GT(zeros, 400u);  // both outcomes were checked
    EXPECT_GT(cuts, 400u);
  }
}

TEST(ChunkerTest, CandidatesDoNotDependOnWhereTheBytesWereSplit) {
  // One list found in a single piece, and again in pieces of random sizes (each warmed up on the
  // bytes before it): the same candidates.
  const ChunkingOptions opts = TinyOptions();
  const std::vector<uint8_t> data = test::RandomBytes(4 << 20, kSeed + 24);
  Chunker c(opts);
  std::vector<uint64_t> whole, pieces;
  ASSERT_TRUE(c.FindCandidates(data.data(), data.size(), 0, 0, &whole));
  test::SplitMix64 rng(kSeed + 25);
  size_t pieces_n = 0;
  for (size_t b = 0; b < data.size(); ++pieces_n) {
    const size_t n = std::min<size_t>(data.size() - b, 64 + rng.Next() % 4000);
    ASSERT_TRUE(c.FindCandidates(data.data() + b, n, b, b, &pieces));
    b += n;
  }
  EXPECT_GT(pieces_n, 1000u);
  EXPECT_GT(whole.size(), 1000u);
  EXPECT_EQ(pieces, whole);
}

TEST(ChunkerTest, TooManyCandidatesAreRefusedAndScanned) {
  // A two-byte pattern whose window hashes meet the large mask: every other byte, or every byte,
  // is a candidate. The list refuses it; the chunks are still the scanned ones.
  const ChunkingOptions opts = TinyOptions();
  Chunker c(opts);
  std::vector<uint8_t> dense;
  for (unsigned ab = 0; ab < 65536 && dense.empty(); ++ab) {
    std::vector<uint8_t> v(8192);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i % 2 ? ab >> 8 : ab);
    std::vector<uint64_t> out;
    if (!c.FindCandidates(v.data(), v.size(), 0, 0, &out)) {
      EXPECT_TRUE(out.empty());
      dense = v;
    }
  }
  ASSERT_FALSE(dense.empty()) << "no two-byte pattern is dense under these options";
  std::vector<uint8_t> data = test::RandomBytes(opts.max_bytes * 8, kSeed + 23);
  for (size_t i = 0; i < opts.max_bytes * 2; ++i) data[opts.max_bytes * 3 + i] = dense[i % 2];
  CutCandidates list;
  EXPECT_FALSE(FindAhead(c, data, 4, &list));
  size_t from_list = 0;
  EXPECT_EQ(CutAhead(data, opts, 4, &from_list), CutAll(data, opts));
  EXPECT_GT(from_list, 0u);  // the pieces before the dense one were used
}

}  // namespace
}  // namespace ckptfs
