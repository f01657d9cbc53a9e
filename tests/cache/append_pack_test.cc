// Chunks the local tier stores itself appended to packs (ChunkCache::AppendToPacks,
// cache/append_pack.h): puts and fetches, concurrent puts, rotation, drops, and the states a
// crash leaves (bytes without their record, records of a short pack, a torn record).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "backends/mem_backend.h"
#include "cache/append_pack.h"
#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "cache/packs.h"
#include "tests/cache/cache_test_util.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Chunk = test::TestChunk;
using test::MakeChunk;

uint64_t Size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

using test::Allocated;

class AppendPackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = MakeIoEngine(IoEngineOptions{});
    ASSERT_TRUE(e.ok());
    engine_ = std::move(*e);
    root_ = dir_.path();
    Open();
  }
  void TearDown() override { cache_.reset(); }

  // The cache (no RAM tier: every Get reads the disk), appending to packs of `bound` bytes.
  void Open(uint64_t bound = 0) {
    cache_.reset();
    auto c = ChunkCache::Open(root_, engine_.get(), 0, &metrics_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(*c);
    cache_->AppendToPacks(bound);
  }
  std::string PacksDir() { return root_ + "/chunks/packs"; }
  // The pack files (".pack"), full paths, sorted.
  std::vector<std::string> PackFiles() {
    std::vector<std::string> out;
    for (const std::string& n : test::Names(PacksDir())) {
      if (n.size() > 5 && n.substr(n.size() - 5) == ".pack") out.push_back(PacksDir() + "/" + n);
    }
    return out;
  }
  size_t ChunkFiles() {
    size_t n = 0;
    for (const std::string& sub : test::Names(root_ + "/chunks")) {
      if (sub.size() == 2) n += test::Names(root_ + "/chunks/" + sub).size();
    }
    return n;
  }
  void Put(const Chunk& c) {
    auto r = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  void ExpectReadsBack(const Chunk& c) { test::ExpectReadsBack(*cache_, c); }
  std::vector<ChunkId> Listed() { return test::Listed(*cache_); }

  test::TempDir dir_;
  std::string root_;
  std::unique_ptr<IoEngine> engine_;
  Metrics metrics_;
  std::unique_ptr<ChunkCache> cache_;
};

TEST_F(AppendPackTest, PutsAreAppendedToOnePackNotChunkFilesAndReadBackVerified) {
  // Buffered (small) and direct (at least 256 KiB) puts, and a chunk put twice.
  const std::vector<Chunk> chunks{MakeChunk(5, 1), MakeChunk(300000, 2), MakeChunk(1 << 20, 3),
                                  MakeChunk((3 << 20) + 17, 4), MakeChunk(4096, 5)};
  for (const Chunk& c : chunks) Put(c);
  auto again = cache_->Put(chunks[1].id, chunks[1].bytes.data(), chunks[1].bytes.size());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "stored already";
  EXPECT_EQ(ChunkFiles(), 0u);
  ASSERT_EQ(PackFiles().size(), 1u);
  EXPECT_EQ(cache_->pack_count(), 1u);
  EXPECT_EQ(metrics_.chunks_written.Get(), chunks.size());
  uint64_t total = 0;
  for (const Chunk& c : chunks) {
    total += c.bytes.size();
    EXPECT_TRUE(cache_->Contains(c.id));
    EXPECT_TRUE(cache_->HasWhole(c.id, c.bytes.size()));
    ExpectReadsBack(c);
  }
  EXPECT_EQ(Listed().size(), chunks.size());
  EXPECT_EQ(cache_->usage().disk_bytes, total);
  // The large ones, on block boundaries, were read direct, as chunk files are.
  EXPECT_EQ(metrics_.cache_direct_read_bytes.Get(),
            chunks[1].bytes.size() + chunks[2].bytes.size() + chunks[3].bytes.size());
  // Each extent starts on a 4 KiB boundary.
  for (const auto& [id, at] : Packs::Scan(PacksDir())) EXPECT_EQ(at.second.offset % 4096, 0u);
  ASSERT_TRUE(cache_->SyncChunks({chunks[0].id, chunks[3].id}).ok());

  // A restart reads them from the pack, and appends to a new one.
  Open();
  for (const Chunk& c : chunks) ExpectReadsBack(c);
  const Chunk more = MakeChunk(70000, 6);
  Put(more);
  ExpectReadsBack(more);
  EXPECT_EQ(PackFiles().size(), 2u);
  EXPECT_EQ(ChunkFiles(), 0u);
}

TEST_F(AppendPackTest, ConcurrentPutsEachWriteTheirOwnRange) {
  constexpr int kThreads = 8, kPerThread = 40;
  std::vector<std::vector<Chunk>> chunks(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const size_t len = (i % 3 == 0) ? 300000 + i * 1000 : 100 + i * 997;  // direct and buffered
      chunks[t].push_back(MakeChunk(len, 1000 * t + i));
    }
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (const Chunk& c : chunks[t]) {
        auto r = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
        EXPECT_TRUE(r.ok() && *r);
      }
    });
  }
  for (auto& th : threads) th.join();
  // No two extents overlap, and every chunk reads back, before and after a restart.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [id, at] : Packs::Scan(PacksDir())) {
    ranges.emplace_back(at.second.offset, at.second.offset + at.second.len);
  }
  ASSERT_EQ(ranges.size(), static_cast<size_t>(kThreads * kPerThread));
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  for (const auto& v : chunks) {
    for (const Chunk& c : v) ExpectReadsBack(c);
  }
  Open();
  for (const auto& v : chunks) {
    for (const Chunk& c : v) ExpectReadsBack(c);
  }
}

TEST_F(AppendPackTest, ConcurrentPutsOfOneChunkRecordOneExtent) {
  const Chunk c = MakeChunk(500000, 7);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] { EXPECT_TRUE(cache_->Put(c.id, c.bytes.data(), c.bytes.size()).ok()); });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(Packs::Scan(PacksDir()).size(), 1u);
  EXPECT_EQ(metrics_.chunks_written.Get(), 1u);
  ExpectReadsBack(c);
  // The room of the copies not recorded was given back.
  EXPECT_LE(Allocated(PackFiles().at(0)), 2 * DirectBlocks(c.bytes.size()));
}

TEST_F(AppendPackTest, ANewPackStartsAtTheBound) {
  Open(1 << 20);
  std::vector<Chunk> chunks;
  for (int i = 0; i < 10; ++i) chunks.push_back(MakeChunk(300000, 10 + i));
  chunks.push_back(MakeChunk(3 << 20, 99));  // larger than the bound: a pack of its own
  for (const Chunk& c : chunks) Put(c);
  const auto packs = PackFiles();
  EXPECT_GE(packs.size(), 4u);
  for (const std::string& p : packs) {
    EXPECT_TRUE(Size(p) <= (1u << 20) || Size(p) == DirectBlocks(3 << 20)) << p << " " << Size(p);
  }
  for (const Chunk& c : chunks) ExpectReadsBack(c);
  Open(1 << 20);
  for (const Chunk& c : chunks) ExpectReadsBack(c);
  EXPECT_EQ(PackFiles().size(), packs.size());
}

TEST_F(AppendPackTest, DropsPunchAndAPackGoesWithItsLastExtentOnceNoLongerAppendedTo) {
  Open(1 << 20);
  std::vector<Chunk> first, second;
  for (int i = 0; i < 3; ++i) first.push_back(MakeChunk(300000, 20 + i));
  for (const Chunk& c : first) Put(c);
  ASSERT_EQ(PackFiles().size(), 1u);
  const std::string full = PackFiles()[0];
  for (int i = 0; i < 2; ++i) second.push_back(MakeChunk(300000, 30 + i));
  for (const Chunk& c : second) Put(c);  // the first pack is full: a second one
  ASSERT_EQ(PackFiles().size(), 2u);

  const uint64_t before = Allocated(full);
  ASSERT_TRUE(cache_->Remove(first[0].id).ok());
  EXPECT_LE(Allocated(full), before - 290000) << "the extent's room is punched";
  ExpectReadsBack(first[1]);
  ASSERT_TRUE(cache_->Remove(first[1].id).ok());
  ASSERT_TRUE(cache_->Remove(first[2].id).ok());
  EXPECT_EQ(PackFiles().size(), 1u) << "the full pack went with its last extent";
  EXPECT_FALSE(cache_->Contains(first[2].id));

  // The open pack stays with no extent: puts still land in it.
  const std::string open = PackFiles()[0];
  for (const Chunk& c : second) ASSERT_TRUE(cache_->Remove(c.id).ok());
  EXPECT_EQ(PackFiles(), std::vector<std::string>{open});
  const Chunk late = MakeChunk(1000, 40);
  Put(late);
  EXPECT_EQ(PackFiles(), std::vector<std::string>{open});
  ExpectReadsBack(late);
  ASSERT_TRUE(cache_->Remove(late.id).ok());
  cache_.reset();
  EXPECT_TRUE(PackFiles().empty()) << "ended with no extent: it goes";
  EXPECT_TRUE(test::Names(PacksDir()).empty());
}

TEST_F(AppendPackTest, ACrashLeavesNoExtentWithoutItsBytesAndNothingUnrecordedCounts) {
  const Chunk a = MakeChunk(1 << 20, 50), b = MakeChunk(1 << 20, 51), c = MakeChunk(70000, 52);
  Put(a);
  Put(b);
  Put(c);
  const std::string pack = PackFiles().at(0);
  const auto extents = Packs::Scan(PacksDir());
  cache_.reset();
  // A power loss kept b's record but not all of its bytes nor c's: the pack ends inside b.
  ASSERT_EQ(::truncate(pack.c_str(), static_cast<off_t>(extents.at(b.id).second.offset + 1000)), 0);
  // A pack created by a put that died before its record, and an index torn mid-record.
  {
    const int fd = ::open((PacksDir() + "/append.1.pack").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "xyz", 3, 0), 3);
    ::close(fd);
    const int idx = ::open((PacksDir() + "/append.1.idx").c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_EQ(::write(idx, "+CKPACK", 7), 7);
    ::close(idx);
  }
  Open();
  ExpectReadsBack(a);
  EXPECT_FALSE(cache_->Contains(b.id));
  EXPECT_FALSE(cache_->Contains(c.id));
  EXPECT_EQ(cache_->Get(b.id, b.bytes.size()).status().code(), Code::kNotFound);
  EXPECT_EQ(Listed(), std::vector<ChunkId>{a.id});
  EXPECT_EQ(PackFiles(), std::vector<std::string>{pack}) << "the pack with no record went";
  // b and c are stored anew, in a new pack, and read back.
  Put(b);
  Put(c);
  ExpectReadsBack(b);
  ExpectReadsBack(c);
  Open();
  ExpectReadsBack(a);
  ExpectReadsBack(b);
  ExpectReadsBack(c);
}

TEST_F(AppendPackTest, BytesWrittenWithoutTheirRecordAreNoChunk) {
  const Chunk a = MakeChunk(70000, 55), lost = MakeChunk(8192, 56);
  Put(a);
  const std::string pack = PackFiles().at(0);
  cache_.reset();
  // A put whose bytes were written into its room past the last extent, and then the daemon died.
  {
    const int fd = ::open(pack.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, lost.bytes.data(), lost.bytes.size(), 1 << 20), 8192);
    ::close(fd);
  }
  Open();
  EXPECT_EQ(Listed(), std::vector<ChunkId>{a.id});
  EXPECT_FALSE(cache_->Contains(lost.id));
  ExpectReadsBack(a);
  // Stored anew, in a pack of its own: the old one is never appended to again.
  auto put = cache_->Put(lost.id, lost.bytes.data(), lost.bytes.size());
  ASSERT_TRUE(put.ok() && *put);
  ExpectReadsBack(lost);
  EXPECT_EQ(PackFiles().size(), 2u);
  EXPECT_EQ(Packs::Scan(PacksDir()).at(lost.id).second.offset, 0u);
}

TEST_F(AppendPackTest, AfterAnUncleanStartAPutCountsOnAnExtentOnlyOnceVerified) {
  const Chunk good = MakeChunk(300000, 57), lost = MakeChunk(300000, 58);
  Put(good);
  Put(lost);
  const auto at = Packs::Scan(PacksDir()).at(lost.id);
  cache_.reset();
  // A power loss kept lost's record but not its bytes: a hole inside the pack reads zeros.
  {
    const int fd = ::open(at.first.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const std::vector<uint8_t> zeros(at.second.len, 0);
    ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), static_cast<off_t>(at.second.offset)),
              static_cast<ssize_t>(zeros.size()));
    ::close(fd);
  }
  Open();
  cache_->DistrustPacks();
  const uint64_t written = metrics_.chunks_written.Get();
  // A later save of the same bytes writes them anew instead of counting on the hole...
  auto put = cache_->Put(lost.id, lost.bytes.data(), lost.bytes.size());
  ASSERT_TRUE(put.ok());
  EXPECT_TRUE(*put);
  ExpectReadsBack(lost);
  ASSERT_TRUE(cache_->SyncChunks({lost.id}).ok());
  // ... and counts on a sound extent, read once.
  put = cache_->Put(good.id, good.bytes.data(), good.bytes.size());
  ASSERT_TRUE(put.ok());
  EXPECT_FALSE(*put);
  EXPECT_EQ(metrics_.chunks_written.Get(), written + 1);
  Open();
  ExpectReadsBack(lost);
  ExpectReadsBack(good);
}

TEST_F(AppendPackTest, ACorruptAppendedExtentIsDroppedAndStoredAnew) {
  const Chunk a = MakeChunk(300000, 60), b = MakeChunk(300000, 61);
  Put(a);
  Put(b);
  const auto at = Packs::Scan(PacksDir()).at(a.id);
  {
    const int fd = ::open(at.first.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "!", 1, static_cast<off_t>(at.second.offset + 5)), 1);
    ::close(fd);
  }
  EXPECT_EQ(cache_->Get(a.id, a.bytes.size()).status().code(), Code::kCorrupt);
  EXPECT_FALSE(cache_->Contains(a.id));
  ExpectReadsBack(b);  // its neighbour's bytes were not punched
  Put(a);
  ExpectReadsBack(a);
}

TEST_F(AppendPackTest, FetchedChunksAreAppendedToAPack) {
  MemBackend mem;
  cache_->AttachRemote({&mem}, 0);
  const Chunk c = MakeChunk(700000, 70), small = MakeChunk(3000, 71);
  for (const Chunk& x : {c, small}) {
    ASSERT_TRUE(mem.Put(ChunkCache::ObjectKey(x.id), x.bytes.data(), x.bytes.size()).ok());
  }
  ExpectReadsBack(c);
  ExpectReadsBack(small);
  EXPECT_EQ(metrics_.remote_fetches.Get(), 2u);
  EXPECT_EQ(ChunkFiles(), 0u);
  EXPECT_EQ(Packs::Scan(PacksDir()).size(), 2u);
  EXPECT_TRUE(cache_->OnDisk(c.id));
  Open();
  cache_->AttachRemote({&mem}, 0);
  ExpectReadsBack(c);
  ExpectReadsBack(small);
  EXPECT_EQ(metrics_.remote_fetches.Get(), 2u) << "read from the pack, not fetched again";
}

TEST_F(AppendPackTest, EvictionDropsAppendedExtentsTheTierHolds) {
  MemBackend mem;
  cache_->AttachRemote({&mem}, 1 << 20);
  std::vector<Chunk> chunks;
  for (int i = 0; i < 6; ++i) chunks.push_back(MakeChunk(300000, 80 + i));
  for (const Chunk& c : chunks) {
    Put(c);
    cache_->MarkRemote(c.id, 0);
  }
  EXPECT_GT(cache_->Evict(), 0u);
  EXPECT_LE(cache_->usage().disk_bytes, 1u << 20);
  uint64_t listed = 0;
  ASSERT_TRUE(cache_->ForEach([&](const ChunkId&, uint64_t n) { listed += n; }).ok());
  EXPECT_EQ(listed, cache_->usage().disk_bytes);
  EXPECT_FALSE(cache_->Contains(chunks[0].id)) << "the least recently used went first";
}

}  // namespace
}  // namespace ckptfs
