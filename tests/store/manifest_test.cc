#include "store/manifest.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "tests/test_util.h"

namespace ckptfs {
namespace {

ChunkId Id(uint64_t n) { return ChunkId{n * 0x9e3779b97f4a7c15ull + 1, n}; }

// Three chunks and two holes, lengths of every varint width.
Manifest Sample() {
  Manifest m;
  m.Append({Id(1), 100});
  m.AppendHole(28);
  m.Append({Id(2), 1ull << 20});
  m.Append({Id(3), 1});
  m.AppendHole(5ull << 40);
  m.Append({Id(4), 300000});
  return m;
}

TEST(ManifestTest, AppendTracksSizeAndStarts) {
  Manifest m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.size(), 0u);
  m.Append({Id(1), 10});
  m.Append({Id(2), 20});
  m.Append({Id(3), 0});  // empty extents are dropped
  ASSERT_EQ(m.extents().size(), 2u);
  EXPECT_EQ(m.size(), 30u);
  EXPECT_EQ(m.StartOf(0), 0u);
  EXPECT_EQ(m.StartOf(1), 10u);
  EXPECT_FALSE(m.extents()[0].hole());
}

TEST(ManifestTest, HolesMergeOnlyWithATrailingHole) {
  Manifest m;
  m.AppendHole(0);
  EXPECT_TRUE(m.empty());
  m.AppendHole(10);
  m.AppendHole(5);
  ASSERT_EQ(m.extents().size(), 1u);
  EXPECT_TRUE(m.extents()[0].hole());
  EXPECT_EQ(m.extents()[0].len, 15u);
  m.Append({Id(1), 7});
  m.AppendHole(3);
  m.AppendHole(4);
  ASSERT_EQ(m.extents().size(), 3u);
  EXPECT_EQ(m.extents()[2].len, 7u);
  EXPECT_EQ(m.StartOf(2), 22u);
  EXPECT_EQ(m.size(), 29u);
}

TEST(ManifestTest, PopBackUndoesAppend) {
  Manifest m = Sample();
  const uint64_t size = m.size();
  const size_t n = m.extents().size();
  m.Append({Id(9), 50});
  m.PopBack();
  EXPECT_EQ(m.size(), size);
  EXPECT_EQ(m.extents().size(), n);
  EXPECT_EQ(m, Sample());
  while (!m.empty()) m.PopBack();
  EXPECT_EQ(m.size(), 0u);
}

TEST(ManifestTest, FindAtBoundaries) {
  Manifest m;
  m.Append({Id(1), 100});  // [0, 100)
  m.AppendHole(50);        // [100, 150)
  m.Append({Id(2), 1});    // [150, 151)
  m.Append({Id(3), 49});   // [151, 200)
  EXPECT_EQ(m.Find(0), 0u);
  EXPECT_EQ(m.Find(99), 0u);
  EXPECT_EQ(m.Find(100), 1u);
  EXPECT_EQ(m.Find(149), 1u);
  EXPECT_EQ(m.Find(150), 2u);
  EXPECT_EQ(m.Find(151), 3u);
  EXPECT_EQ(m.Find(199), 3u);
  EXPECT_EQ(m.Find(200), 4u);  // past the end: extents().size()
  EXPECT_EQ(m.Find(~0ull), 4u);
  EXPECT_EQ(Manifest().Find(0), 0u);
  // Every offset maps to the extent that holds it.
  for (uint64_t off = 0; off < m.size(); ++off) {
    size_t i = m.Find(off);
    ASSERT_LT(i, m.extents().size());
    EXPECT_LE(m.StartOf(i), off);
    EXPECT_LT(off, m.StartOf(i) + m.extents()[i].len);
  }
}

TEST(ManifestTest, SeekDataAndHole) {
  Manifest m;
  m.AppendHole(100);       // [0, 100)
  m.Append({Id(1), 50});   // [100, 150)
  m.Append({Id(2), 50});   // [150, 200)
  m.AppendHole(100);       // [200, 300)
  m.Append({Id(3), 10});   // [300, 310)
  EXPECT_EQ(m.Seek(0, true), 100u);
  EXPECT_EQ(m.Seek(0, false), 0u);
  EXPECT_EQ(m.Seek(99, false), 99u);
  EXPECT_EQ(m.Seek(120, true), 120u);
  EXPECT_EQ(m.Seek(120, false), 200u);  // across two chunks
  EXPECT_EQ(m.Seek(200, true), 300u);
  EXPECT_EQ(m.Seek(305, false), 310u);  // the end counts as a hole
  EXPECT_EQ(m.Seek(309, true), 309u);
  EXPECT_EQ(m.Seek(310, true), std::nullopt);  // at the end: ENXIO
  EXPECT_EQ(m.Seek(310, false), std::nullopt);
  Manifest tail;
  tail.Append({Id(4), 10});
  tail.AppendHole(90);
  EXPECT_EQ(tail.Seek(10, true), std::nullopt);  // only a hole follows
  EXPECT_EQ(tail.Seek(10, false), 10u);
  EXPECT_EQ(Manifest().Seek(0, true), std::nullopt);
  // Against a byte-by-byte scan.
  for (uint64_t off = 0; off < m.size(); ++off) {
    for (bool data : {true, false}) {
      std::optional<uint64_t> want;
      for (uint64_t at = off; at < m.size() && !want; ++at) {
        if (m.extents()[m.Find(at)].hole() != data) want = at;
      }
      if (!want && !data) want = m.size();
      EXPECT_EQ(m.Seek(off, data), want) << off << " " << data;
    }
  }
}

TEST(ManifestTest, EncodeDecodeRoundTrip) {
  for (const Manifest& m : {Manifest(), Sample()}) {
    auto d = Manifest::Decode(m.Encode());
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, m);
    EXPECT_EQ(d->size(), m.size());
    for (size_t i = 0; i < m.extents().size(); ++i) EXPECT_EQ(d->StartOf(i), m.StartOf(i));
  }
}

TEST(ManifestTest, RoundTripsHugeLengths) {
  Manifest m;
  m.Append({Id(1), (1ull << 63) - 1});
  m.AppendHole(1ull << 62);
  m.Append({Id(2), 0x7f});
  m.Append({Id(3), 0x80});
  m.Append({Id(4), 0x3fff});
  m.Append({Id(5), 0x4000});
  auto d = Manifest::Decode(m.Encode());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(*d, m);
  EXPECT_EQ(d->size(), m.size());

  Manifest max;
  max.Append({Id(7), ~0ull});  // 10-byte varint
  auto dm = Manifest::Decode(max.Encode());
  ASSERT_TRUE(dm.ok());
  EXPECT_EQ(dm->extents()[0].len, ~0ull);
}

TEST(ManifestTest, RoundTripsManyRandomExtents) {
  test::SplitMix64 rng(3);
  Manifest m;
  for (int i = 0; i < 5000; ++i) {
    if (rng.Below(4) == 0) {
      m.AppendHole(1 + rng.Below(1 << 20));
    } else {
      m.Append({ChunkId{rng.Next() | 1, rng.Next()}, 1 + rng.Below(64 << 20)});
    }
  }
  auto d = Manifest::Decode(m.Encode());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, m);
  EXPECT_EQ(d->size(), m.size());
}

TEST(ManifestTest, EveryTruncationIsCorrupt) {
  const std::string enc = Sample().Encode();
  for (size_t n = 0; n < enc.size(); ++n) {
    auto d = Manifest::Decode(std::string_view(enc).substr(0, n));
    ASSERT_FALSE(d.ok()) << "prefix of " << n << " bytes decoded";
    EXPECT_EQ(d.status().code(), Code::kCorrupt) << n;
  }
}

TEST(ManifestTest, GarbageIsCorrupt) {
  const std::string good = Sample().Encode();
  auto corrupt = [](std::string s) {
    auto d = Manifest::Decode(s);
    return !d.ok() && d.status().code() == Code::kCorrupt;
  };
  EXPECT_TRUE(corrupt(good + '\0'));                                    // trailing bytes
  EXPECT_TRUE(corrupt(std::string("\x02\x00", 2)));                     // unknown version
  EXPECT_TRUE(corrupt(std::string("\x00\x00", 2)));                     // version 0
  EXPECT_TRUE(corrupt(std::string("\x01\x01\x02\x05", 4)));             // unknown tag
  EXPECT_TRUE(corrupt(std::string("\x01\x01\x00\x00", 4)));             // zero-length hole
  EXPECT_TRUE(corrupt(std::string("\x01\xff\xff\xff\xff\x0f", 6)));     // count beyond the input
  EXPECT_TRUE(corrupt(std::string("\x01") + std::string(11, '\xff')));  // endless varint
  std::string endless_len("\x01\x01\x00", 3);
  endless_len += std::string(11, '\x80');
  EXPECT_TRUE(corrupt(endless_len));
  // A well-formed empty manifest is not garbage.
  EXPECT_TRUE(Manifest::Decode(std::string("\x01\x00", 2)).ok());

  // Random bytes after a valid version byte either decode to a manifest that round-trips, or are
  // rejected as corrupt: never any other code.
  test::SplitMix64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string s(1 + rng.Below(64), '\0');
    for (char& c : s) c = static_cast<char>(rng.Next());
    s[0] = 1;
    auto d = Manifest::Decode(s);
    if (d.ok()) {
      auto again = Manifest::Decode(d->Encode());
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *d);
    } else {
      EXPECT_EQ(d.status().code(), Code::kCorrupt);
    }
  }
}

}  // namespace
}  // namespace ckptfs
