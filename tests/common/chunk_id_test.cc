#include "common/chunk_id.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckptfs {
namespace {

TEST(ChunkIdTest, OfIsXxh3With128Bits) {
  for (size_t len : {0, 1, 15, 16, 17, 240, 241, 4096, 100000}) {
    std::vector<uint8_t> data = test::RandomBytes(len, 42 + len);
    XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
    ChunkId id = ChunkId::Of(data.data(), data.size());
    EXPECT_EQ(id.hi, h.high64) << len;
    EXPECT_EQ(id.lo, h.low64) << len;
  }
}

TEST(ChunkIdTest, OfEmptyIsNotTheZeroId) {
  // The zero id means "hole" in a manifest; no real chunk may map to it.
  EXPECT_FALSE(ChunkId::Of("", 0).IsZero());
  EXPECT_TRUE(ChunkId{}.IsZero());
}

TEST(ChunkIdTest, HexIsHiThenLoLowercase) {
  ChunkId id{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(id.Hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(ChunkId{}.Hex(), std::string(32, '0'));
}

TEST(ChunkIdTest, HexRoundTrip) {
  test::SplitMix64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    ChunkId id{rng.Next(), rng.Next()};
    auto back = ChunkId::FromHex(id.Hex());
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, id);
  }
}

TEST(ChunkIdTest, FromHexRejectsBadInput) {
  const std::string good = "0123456789abcdeffedcba9876543210";
  ASSERT_TRUE(ChunkId::FromHex(good).has_value());
  EXPECT_FALSE(ChunkId::FromHex("").has_value());
  EXPECT_FALSE(ChunkId::FromHex(good.substr(1)).has_value());                      // 31 digits
  EXPECT_FALSE(ChunkId::FromHex(good + "0").has_value());                          // 33 digits
  EXPECT_FALSE(ChunkId::FromHex("0123456789ABCDEFfedcba9876543210").has_value());  // uppercase
  for (char bad : {'g', 'G', 'x', ' ', '-', '/', ':', '`', '@', '\0'}) {
    for (size_t pos : {size_t{0}, size_t{15}, size_t{16}, size_t{31}}) {
      std::string s = good;
      s[pos] = bad;
      EXPECT_FALSE(ChunkId::FromHex(s).has_value()) << "char " << int(bad) << " at " << pos;
    }
  }
  // Not NUL-terminated input: only the view's bytes count.
  std::string longer = good + "zz";
  EXPECT_TRUE(ChunkId::FromHex(std::string_view(longer).substr(0, 32)).has_value());
}

TEST(ChunkIdTest, BytesRoundTripAndBigEndian) {
  ChunkId id{0x0102030405060708ull, 0x090a0b0c0d0e0f10ull};
  uint8_t b[16];
  id.ToBytes(b);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b[i], i + 1) << i;
  EXPECT_EQ(ChunkId::FromBytes(b), id);

  test::SplitMix64 rng(9);
  for (int i = 0; i < 1000; ++i) {
    ChunkId r{rng.Next(), rng.Next()};
    r.ToBytes(b);
    EXPECT_EQ(ChunkId::FromBytes(b), r);
  }
}

TEST(ChunkIdTest, BytesSortLikeHexAndLikeIds) {
  // LMDB compares keys with memcmp: the byte form must order like Hex() and operator<=>.
  test::SplitMix64 rng(11);
  std::vector<ChunkId> ids;
  for (int i = 0; i < 500; ++i) {
    ChunkId id{rng.Next(), rng.Next()};
    if (i % 5 == 0) id.hi = ids.empty() ? 0 : ids.back().hi;  // equal hi: lo decides
    ids.push_back(id);
  }
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    const ChunkId& a = ids[i];
    const ChunkId& b = ids[i + 1];
    uint8_t ab[16], bb[16];
    a.ToBytes(ab);
    b.ToBytes(bb);
    int bytes = std::memcmp(ab, bb, 16);
    int hex = a.Hex().compare(b.Hex());
    EXPECT_EQ(bytes < 0, hex < 0);
    EXPECT_EQ(bytes == 0, hex == 0);
    EXPECT_EQ(bytes < 0, a < b);
  }
}

TEST(ChunkIdTest, HashSpreadsIds) {
  ChunkIdHash h;
  ChunkId a{1, 2}, b{2, 1};
  EXPECT_NE(h(a), h(b));
  EXPECT_EQ(h(a), h(ChunkId{1, 2}));
}

}  // namespace
}  // namespace ckptfs
