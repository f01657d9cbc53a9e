// FileWriter::CutAhead: a staging file cut with its content-defined cut candidates found ahead on
// other threads gives the chunks it gives without them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "store/chunker.h"
#include "store/file_writer.h"
#include "tests/store/file_writer_util.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using namespace fwtest;  // NOLINT: the sink, scanners and helpers shared with file_writer_test

// A short pattern that, repeated, gives a candidate every few bytes under `opts`: a part of it
// is refused and scanned in line.
Bytes DensePattern(const ChunkingOptions& opts) {
  Chunker c(opts);
  test::SplitMix64 rng(77);
  for (int tries = 0; tries < 1000000; ++tries) {
    const uint64_t word = rng.Next();
    Bytes v(4096);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(word >> (8 * (i % 4)));
    std::vector<uint64_t> out;
    if (!c.FindCandidates(v.data(), v.size(), 0, 0, &out)) return Bytes(v.begin(), v.begin() + 4);
  }
  return {};
}

// A staging file cut with help (its cut candidates found ahead on a pool, FileWriter::CutAhead)
// gives the chunks it gives without: random bytes, a run of zeros, a pattern with a candidate
// every few bytes (refused, scanned in line), a hole, and tensors a scanner reveals (content-
// defined chunks end where a tensor starts; a hole makes the scanner lose its place, so one
// tensor comes before it).
TEST(FileWriterCutAheadTest, AStagingFileCutWithHelpGivesTheSameChunks) {
  test::TempDir dir;
  const ChunkingOptions opts;  // chunks of about 1 MiB; a staging file is read 16 MiB at a time
  constexpr size_t kMiB = 1 << 20;
  const Bytes dense = DensePattern(opts);
  ASSERT_EQ(dense.size(), 4u) << "no dense four-byte pattern found";
  Bytes want = test::RandomBytes(44 * kMiB, 31);
  std::fill(want.begin() + 6 * kMiB, want.begin() + 8 * kMiB, 0);
  // Within one part of the plan that covers it, with random bytes in the part after: that part's
  // candidates are listed, the dense one's are not, and the list must end before the dense part.
  for (size_t i = 8 * kMiB + kMiB / 2; i < 9 * kMiB + kMiB / 2; ++i) want[i] = dense[i % 4];
  std::fill(want.begin() + 20 * kMiB, want.begin() + 23 * kMiB, 0);  // the hole
  const std::vector<ByteRange> tensors = {{3 * kMiB + 12345, 5 * kMiB + 777},
                                          {30 * kMiB + 12345, 35 * kMiB + 777}};
  const std::string path = dir.Sub("staged");
  {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    for (auto [b, e] : {std::pair{size_t{0}, 20 * kMiB}, std::pair{23 * kMiB, want.size()}}) {
      ASSERT_EQ(::pwrite(fd, want.data() + b, e - b, static_cast<off_t>(b)),
                static_cast<ssize_t>(e - b));
    }
    ::close(fd);
  }
  struct Cut {
    std::vector<std::pair<std::string, uint64_t>> extents;
    uint64_t from_candidates = 0, refused = 0;
  };
  auto cut = [&](ThreadPool* pool) {
    Cut out;
    MemSink sink(dir.path());
    Metrics metrics;
    FileWriter w(Manifest(), &sink, opts, 1 << 20, &metrics, FakeScanners(tensors));
    w.CutAhead(pool, 4);
    int fd = ::open(path.c_str(), O_RDONLY);
    EXPECT_TRUE(w.AdoptFile(fd, want.size()).ok());
    ::close(fd);
    auto m = w.Finish();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return out;
    EXPECT_TRUE(SameBytes(sink.Reassemble(*m), want));
    EXPECT_GE(Holes(*m), 1u);
    EXPECT_TRUE(Cuts(*m).count(tensors[0].begin)) << "no cut where the first tensor starts";
    out.from_candidates = w.cuts_from_candidates();
    EXPECT_EQ(metrics.cut_ahead_cuts.Get(), out.from_candidates);
    out.refused = metrics.cut_ahead_refused.Get();
    for (const Extent& e : m->extents()) out.extents.emplace_back(e.hole() ? "hole" : e.id.Hex(), e.len);
    return out;
  };
  const Cut plain = cut(nullptr);
  ThreadPool pool(3);
  const Cut helped = cut(&pool);
  ASSERT_EQ(helped.extents.size(), plain.extents.size());
  EXPECT_TRUE(helped.extents == plain.extents) << "the chunks differ with help";
  EXPECT_EQ(plain.from_candidates, 0u);
  EXPECT_GT(helped.from_candidates, 15u) << "the candidates found ahead were hardly used";
  EXPECT_GE(helped.refused, 1u) << "the dense pattern was not refused";
}

}  // namespace
}  // namespace ckptfs
