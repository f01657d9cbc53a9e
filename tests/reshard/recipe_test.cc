// Recipe: the pieces Walk hands out make exactly the bytes the segments describe, for every read
// range, and AddGather folds what it can without changing those bytes.
#include "reshard/recipe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckptfs::reshard {
namespace {

std::string Source(size_t n, uint64_t seed) {
  auto b = test::RandomBytes(n, seed);
  return std::string(b.begin(), b.end());
}

// Builds a recipe and, beside it, the file's bytes by the definition in recipe.h: row r of a
// gather is its parts' bytes [offset + r * stride, + len) one after the other.
class Builder {
 public:
  explicit Builder(std::vector<std::string> sources) : sources_(std::move(sources)) {}
  void Literal(const std::string& b) {
    recipe.AddLiteral(b);
    expected += b;
  }
  void Gather(uint64_t rows, const std::vector<Part>& parts) {
    recipe.AddGather(rows, parts);
    for (uint64_t r = 0; r < rows; ++r) {
      for (const Part& p : parts)
        expected += sources_[p.source].substr(p.offset + r * p.stride, p.len);
    }
  }
  // The bytes Walk makes for [offset, offset + len); checks every piece on the way.
  std::string Read(uint64_t offset, uint64_t len, size_t* pieces = nullptr) const {
    std::string out;
    size_t n = 0;
    Status st = recipe.Walk(offset, len, [&](const Piece& p) -> Status {
      ++n;
      EXPECT_GT(p.len, 0u) << "empty piece at " << offset << "+" << len;
      if (p.literal) {
        out.append(reinterpret_cast<const char*>(p.literal), p.len);
      } else {
        EXPECT_LT(p.source, sources_.size());
        EXPECT_LE(p.offset + p.len, sources_[p.source].size()) << "piece past its source";
        out += sources_[p.source].substr(p.offset, p.len);
      }
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (pieces) *pieces = n;
    return out;
  }

  Recipe recipe;
  std::string expected;

 private:
  std::vector<std::string> sources_;
};

TEST(Recipe, EmptyRecipeWalksNothing) {
  Recipe r;
  EXPECT_EQ(r.size(), 0u);
  int calls = 0;
  ASSERT_TRUE(r.Walk(0, 100, [&](const Piece&) {
                 ++calls;
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(calls, 0);
}

TEST(Recipe, ZeroLengthPiecesAreDropped) {
  Recipe r;
  r.AddLiteral("");
  r.AddGather(0, {Part{0, 0, 8, 8}});
  r.AddGather(5, {Part{0, 0, 0, 8}});
  r.AddGather(3, {});
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.segment_count(), 0u);
  EXPECT_EQ(r.next_literal(), 0u);
  // A zero-length part among others is dropped, the others stay.
  r.AddGather(2, {Part{0, 0, 3, 10}, Part{1, 5, 0, 1}, Part{1, 0, 2, 4}});
  ASSERT_EQ(r.segment_count(), 1u);
  EXPECT_EQ(r.segments()[0].parts.size(), 2u);
  EXPECT_EQ(r.segments()[0].row_len, 5u);
  EXPECT_EQ(r.size(), 10u);
}

TEST(Recipe, LiteralsConcatenate) {
  Builder b({});
  b.Literal("hello, ");
  b.Literal("");
  b.Literal("world");
  EXPECT_EQ(b.recipe.size(), 12u);
  EXPECT_EQ(b.recipe.segment_count(), 2u);
  EXPECT_EQ(b.Read(0, 12), "hello, world");
  EXPECT_EQ(b.Read(5, 4), ", wo");
  EXPECT_EQ(b.Read(7, 1000), "world");  // clipped at the end
  EXPECT_EQ(b.Read(12, 10), "");
  EXPECT_EQ(b.Read(100, 10), "");
  EXPECT_EQ(b.Read(3, 0), "");
}

// A file mixing literals with gathers of several shapes: multi-part rows with different strides,
// a stride-0 repeat, a part inside a row that starts mid-source, single-byte parts.
Builder MixedFile() {
  Builder b({Source(300, 1), Source(200, 2), Source(50, 3)});
  b.Literal("HEAD");
  // 4 rows of [src0 5 bytes pitch 20 | src1 3 bytes pitch 7 | src2 1 byte pitch 0].
  b.Gather(4, {Part{0, 10, 5, 20}, Part{1, 1, 3, 7}, Part{2, 49, 1, 0}});
  b.Literal("x");
  // Vocabulary padding: the same row 5 times.
  b.Gather(5, {Part{1, 100, 6, 0}});
  // A dim-1 slice: 3 rows, 2 parts from two "shards" of pitch 16, each 4 bytes.
  b.Gather(3, {Part{0, 200, 4, 16}, Part{1, 150, 4, 16}});
  b.Literal("MID");
  b.Gather(1, {Part{2, 0, 50, 50}});
  b.Gather(7, {Part{0, 0, 1, 3}});
  b.Literal("TAIL!");
  return b;
}

TEST(Recipe, WalkMakesTheDefinedBytes) {
  Builder b = MixedFile();
  ASSERT_EQ(b.recipe.size(), b.expected.size());
  EXPECT_EQ(b.Read(0, b.recipe.size()), b.expected);
}

TEST(Recipe, EveryPartialReadMatches) {
  const Builder b = MixedFile();
  const uint64_t n = b.recipe.size();
  for (uint64_t off = 0; off <= n + 1; ++off) {
    for (uint64_t len = 0; off + len <= n + 2; ++len) {
      const std::string want = off >= n ? "" : b.expected.substr(off, len);
      ASSERT_EQ(b.Read(off, len), want) << "offset " << off << " len " << len;
    }
  }
}

TEST(Recipe, PiecesAreAsLargeAsTheLayoutAllows) {
  Builder b({Source(64, 7)});
  b.Gather(3, {Part{0, 0, 4, 8}, Part{0, 32, 2, 8}});
  size_t pieces = 0;
  EXPECT_EQ(b.Read(0, b.recipe.size(), &pieces), b.expected);
  EXPECT_EQ(pieces, 6u);  // one per part per row
  EXPECT_EQ(b.Read(1, 2, &pieces), b.expected.substr(1, 2));
  EXPECT_EQ(pieces, 1u);
  EXPECT_EQ(b.Read(3, 4, &pieces), b.expected.substr(3, 4));  // spans a part and a row boundary
  EXPECT_EQ(pieces, 3u);
}

TEST(Recipe, WalkSegmentsMatchesWalkOfTheirRange) {
  const Builder b = MixedFile();
  const size_t n = b.recipe.segment_count();
  for (size_t first = 0; first <= n; ++first) {
    for (size_t last = first; last <= n + 1; ++last) {
      std::string got;
      ASSERT_TRUE(b.recipe
                      .WalkSegments(first, last,
                                    [&](const Piece& p) {
                                      if (p.literal) {
                                        got.append(reinterpret_cast<const char*>(p.literal), p.len);
                                      } else {
                                        got += "<" + std::to_string(p.source) + ":" +
                                               std::to_string(p.offset) + "+" +
                                               std::to_string(p.len) + ">";
                                      }
                                      return Status::Ok();
                                    })
                      .ok());
      const uint64_t from = first < n ? b.recipe.SegmentStart(first) : b.recipe.size();
      const uint64_t to = last < n ? b.recipe.SegmentStart(last) : b.recipe.size();
      std::string want;
      ASSERT_TRUE(b.recipe
                      .Walk(from, to - from,
                            [&](const Piece& p) {
                              if (p.literal) {
                                want.append(reinterpret_cast<const char*>(p.literal), p.len);
                              } else {
                                want += "<" + std::to_string(p.source) + ":" +
                                        std::to_string(p.offset) + "+" + std::to_string(p.len) +
                                        ">";
                              }
                              return Status::Ok();
                            })
                      .ok());
      EXPECT_EQ(got, want) << first << ".." << last;
    }
  }
}

TEST(Recipe, WalkStopsAtTheFirstError) {
  const Builder b = MixedFile();
  int calls = 0;
  Status st = b.recipe.Walk(0, b.recipe.size(), [&](const Piece&) -> Status {
    if (++calls == 3) return IoError("boom");
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_EQ(st.message(), "boom");
  EXPECT_EQ(calls, 3);
}

TEST(Recipe, SegmentStartsAreCumulative) {
  const Builder b = MixedFile();
  uint64_t at = 0;
  for (size_t i = 0; i < b.recipe.segment_count(); ++i) {
    EXPECT_EQ(b.recipe.SegmentStart(i), at);
    at += b.recipe.segments()[i].size();
  }
  EXPECT_EQ(at, b.recipe.size());
}

TEST(Recipe, HugeRepeatAddressesRowsWithoutOverflow) {
  // 2^33 rows of a 3-byte stride-0 part and of a strided part: offsets past 4 GiB are exact.
  Recipe r;
  const uint64_t rows = uint64_t{1} << 33;
  r.AddLiteral("ab");
  r.AddGather(rows, {Part{0, 7, 3, 0}, Part{1, 100, 2, 5}});
  EXPECT_EQ(r.size(), 2 + rows * 5);
  const uint64_t row = rows - 3;
  std::vector<Piece> got;
  ASSERT_TRUE(r.Walk(2 + row * 5 + 1, 6, [&](const Piece& p) {
                 got.push_back(p);
                 return Status::Ok();
               }).ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].source, 0u);
  EXPECT_EQ(got[0].offset, 8u);  // stride 0: the same bytes on every row
  EXPECT_EQ(got[0].len, 2u);
  EXPECT_EQ(got[1].source, 1u);
  EXPECT_EQ(got[1].offset, 100 + row * 5);
  EXPECT_EQ(got[1].len, 2u);
  EXPECT_EQ(got[2].source, 0u);
  EXPECT_EQ(got[2].offset, 7u);
  EXPECT_EQ(got[2].len, 2u);
}

TEST(Recipe, ConsecutiveRowsFoldIntoOneRange) {
  Builder b({Source(100, 4)});
  b.Gather(5, {Part{0, 10, 6, 6}});
  ASSERT_EQ(b.recipe.segment_count(), 1u);
  const Segment& s = b.recipe.segments()[0];
  EXPECT_EQ(s.rows, 1u);
  ASSERT_EQ(s.parts.size(), 1u);
  EXPECT_EQ(s.parts[0].offset, 10u);
  EXPECT_EQ(s.parts[0].len, 30u);
  EXPECT_EQ(b.Read(0, 100), b.expected);
}

TEST(Recipe, AdjacentSingleRangesMerge) {
  Builder b({Source(100, 5), Source(100, 6)});
  b.Gather(1, {Part{0, 10, 5, 5}});
  b.Gather(1, {Part{0, 15, 7, 7}});  // continues it
  b.Gather(2, {Part{0, 22, 4, 4}});  // folds to one range, then continues it
  ASSERT_EQ(b.recipe.segment_count(), 1u);
  EXPECT_EQ(b.recipe.segments()[0].parts[0].len, 20u);
  EXPECT_EQ(b.recipe.segments()[0].row_len, 20u);
  EXPECT_EQ(b.recipe.size(), 20u);
  EXPECT_EQ(b.Read(0, 100), b.expected);
  // Walking the merged range is one piece.
  size_t pieces = 0;
  b.Read(0, 20, &pieces);
  EXPECT_EQ(pieces, 1u);
}

TEST(Recipe, NonAdjacentRangesStaySeparate) {
  Builder b({Source(100, 5), Source(100, 6)});
  b.Gather(1, {Part{0, 10, 5, 5}});
  b.Gather(1, {Part{1, 15, 5, 5}});  // another source at the offset that would continue
  b.Gather(1, {Part{1, 21, 5, 5}});  // a gap of one byte
  b.Gather(1, {Part{1, 20, 5, 5}});  // backwards
  b.Literal("L");
  b.Gather(1, {Part{1, 25, 5, 5}});  // would continue, but a literal lies between
  b.Gather(3, {Part{1, 30, 2, 0}});  // a repeat is not a range
  b.Gather(1, {Part{1, 32, 2, 2}});  // the repeat's rows are not merged into
  b.Gather(2, {Part{0, 0, 2, 3}, Part{0, 2, 1, 3}});
  b.Gather(1, {Part{0, 6, 4, 4}});  // multi-part rows are not merged into
  EXPECT_EQ(b.recipe.segment_count(), 10u);
  EXPECT_EQ(b.Read(0, 1000), b.expected);
}

TEST(Recipe, PatchLiteralWritesLittleEndian) {
  Builder b({Source(10, 1)});
  b.Literal("0123456789");
  b.Gather(1, {Part{0, 0, 4, 4}});
  const size_t second = b.recipe.next_literal();
  EXPECT_EQ(second, 1u);
  b.Literal("abcdefgh");
  b.recipe.PatchLiteral(second, 2, 0x44332211u);
  b.recipe.PatchLiteral(0, 6, 0xdeadbeefu);
  std::string want = b.expected;
  want.replace(16, 4, "\x11\x22\x33\x44");
  want.replace(6, 4, "\xef\xbe\xad\xde");
  EXPECT_EQ(b.Read(0, 100), want);
  EXPECT_EQ(b.recipe.size(), want.size());
}

}  // namespace
}  // namespace ckptfs::reshard
