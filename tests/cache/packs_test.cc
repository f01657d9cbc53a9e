// Chunks kept as extents of packs (cache/packs.h) through the local tier's calls (ChunkCache).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "cache/packs.h"
#include "common/log.h"
#include "tests/cache/cache_test_util.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Chunk = test::TestChunk;
using test::MakeChunk;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

using test::Allocated;

class PacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = MakeIoEngine(IoEngineOptions{});
    ASSERT_TRUE(e.ok());
    engine_ = std::move(*e);
    root_ = dir_.path();
    ASSERT_EQ(::mkdir((root_ + "/passthrough").c_str(), 0700), 0);
    Open();
  }
  void TearDown() override { cache_.reset(); }

  void Open() {
    cache_.reset();
    auto c = ChunkCache::Open(root_, engine_.get(), 0, &metrics_);  // no RAM tier: every Get reads
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(*c);
  }

  // A staging file holding `chunks` back to back (each at a 1 MiB boundary plus 100 bytes, so
  // that ranges start and end inside blocks), and their entries.
  std::vector<Packs::Entry> Stage(const std::string& name, const std::vector<Chunk>& chunks) {
    const int fd = ::open(StagingPath(name).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    std::vector<Packs::Entry> out;
    uint64_t at = 100;
    for (const Chunk& c : chunks) {
      EXPECT_EQ(::pwrite(fd, c.bytes.data(), c.bytes.size(), static_cast<off_t>(at)),
                static_cast<ssize_t>(c.bytes.size()));
      out.push_back(Packs::Entry{c.id, at, c.bytes.size()});
      at += c.bytes.size();
    }
    ::fsync(fd);
    ::close(fd);
    return out;
  }
  std::string StagingPath(const std::string& name) { return root_ + "/passthrough/" + name; }
  std::string PackPath(const std::string& name) {
    return root_ + "/chunks/packs/" + name + ".pack";
  }
  std::string IndexPath(const std::string& name) {
    return root_ + "/chunks/packs/" + name + ".idx";
  }

  void ExpectReadsBack(const Chunk& c) { test::ExpectReadsBack(*cache_, c); }
  // The chunks ForEach lists.
  std::vector<ChunkId> Listed() { return test::Listed(*cache_); }

  test::TempDir dir_;
  std::string root_;
  std::unique_ptr<IoEngine> engine_;
  Metrics metrics_;
  std::unique_ptr<ChunkCache> cache_;
};

TEST_F(PacksTest, AnAdoptedStagingFileServesItsChunksVerified) {
  const std::vector<Chunk> chunks{MakeChunk(1 << 20, 1), MakeChunk(300000, 2), MakeChunk(5, 3)};
  auto entries = Stage("7.1", chunks);
  auto skipped = cache_->AdoptPack(StagingPath("7.1"), "7.1", entries);
  ASSERT_TRUE(skipped.ok()) << skipped.status().ToString();
  EXPECT_TRUE(skipped->empty());
  EXPECT_EQ(metrics_.chunk_bytes_written.Get(), 0u) << "no byte is written again";
  struct stat a, b;
  ASSERT_EQ(::stat(StagingPath("7.1").c_str(), &a), 0);
  ASSERT_EQ(::stat(PackPath("7.1").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino) << "the pack is the staging file itself";
  for (const Chunk& c : chunks) {
    EXPECT_TRUE(cache_->Contains(c.id));
    EXPECT_TRUE(cache_->OnDisk(c.id));
    EXPECT_FALSE(Exists(cache_->PathOf(c.id))) << "no chunk file";
    EXPECT_TRUE(cache_->Verify(c.id, c.bytes.size()).ok());
    ExpectReadsBack(c);
    // Put of a chunk a pack holds finds it there.
    auto put = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
    ASSERT_TRUE(put.ok());
    EXPECT_FALSE(*put);
  }
  EXPECT_EQ(Listed().size(), 3u);
  EXPECT_EQ(cache_->usage().disk_bytes, (1u << 20) + 300000u + 5u);
  EXPECT_TRUE(cache_->SyncChunks({chunks[0].id, chunks[2].id}).ok());

  // The staging file's name goes (the seal's commit): the pack stays, and so after a restart.
  ASSERT_EQ(::unlink(StagingPath("7.1").c_str()), 0);
  Open();
  for (const Chunk& c : chunks) ExpectReadsBack(c);
  EXPECT_EQ(cache_->usage().disk_bytes, 0u) << "no backend: the disk map is not kept";
  EXPECT_EQ(Listed().size(), 3u);
}

TEST_F(PacksTest, ChunksStoredAlreadyAreNotRecordedAgainAndArePunchedOnceThePackIsAlone) {
  const Chunk file = MakeChunk(2 << 20, 1), shared = MakeChunk(2 << 20, 2),
              own = MakeChunk(2 << 20, 3);
  ASSERT_TRUE(cache_->Put(file.id, file.bytes.data(), file.bytes.size()).ok());
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("1.1"), "1.1", Stage("1.1", {shared})).ok());
  auto skipped = cache_->AdoptPack(StagingPath("2.1"), "2.1", Stage("2.1", {file, shared, own}));
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, (std::vector<size_t>{0, 1})) << "a chunk file and another pack's extent";
  const uint64_t before = Allocated(PackPath("2.1"));
  ASSERT_GE(before, 6u << 20);
  std::vector<Packs::Range> punch{{100, 2 << 20}, {100 + (2 << 20), 2 << 20}};
  ASSERT_TRUE(cache_->PunchPack("2.1", punch).ok());
  EXPECT_EQ(Allocated(PackPath("2.1")), before) << "the staging file's name is still there";
  ASSERT_EQ(::unlink(StagingPath("2.1").c_str()), 0);
  ASSERT_TRUE(cache_->PunchPack("2.1", punch).ok());
  EXPECT_LE(Allocated(PackPath("2.1")), (2u << 20) + (16u << 10)) << "only `own` keeps its room";
  ExpectReadsBack(own);
  ExpectReadsBack(file);
  ExpectReadsBack(shared);
}

TEST_F(PacksTest, AStagingFileSealedAgainNeverHasItsLiveExtentsPunched) {
  // A seal adopted the file and did not commit (another file named its chunks meanwhile, so they
  // stay); the file is sealed again and finds every chunk stored, in this very pack.
  const std::vector<Chunk> chunks{MakeChunk(1 << 20, 1), MakeChunk(1 << 20, 2)};
  const auto entries = Stage("8.1", chunks);
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("8.1"), "8.1", entries).ok());
  auto again = cache_->AdoptPack(StagingPath("8.1"), "8.1", entries);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, (std::vector<size_t>{0, 1}));
  ASSERT_EQ(::unlink(StagingPath("8.1").c_str()), 0);
  const uint64_t before = Allocated(PackPath("8.1"));
  std::vector<Packs::Range> punch;
  for (size_t i : *again) punch.push_back(Packs::Range{entries[i].offset, entries[i].len});
  ASSERT_TRUE(cache_->PunchPack("8.1", punch).ok());
  EXPECT_EQ(Allocated(PackPath("8.1")), before);
  for (const Chunk& c : chunks) ExpectReadsBack(c);
}

TEST_F(PacksTest, RemovePunchesTheExtentAndThePackGoesWithItsLast) {
  const std::vector<Chunk> chunks{MakeChunk(1 << 20, 1), MakeChunk(1 << 20, 2)};
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("3.1"), "3.1", Stage("3.1", chunks)).ok());
  // While the staging file is still named, a removal records the drop and leaves its bytes.
  ASSERT_TRUE(cache_->Remove(chunks[0].id).ok());
  EXPECT_FALSE(cache_->Contains(chunks[0].id));
  EXPECT_EQ(cache_->Get(chunks[0].id, chunks[0].bytes.size()).status().code(), Code::kNotFound);
  const uint64_t before = Allocated(PackPath("3.1"));
  ASSERT_EQ(::unlink(StagingPath("3.1").c_str()), 0);
  Open();
  EXPECT_FALSE(cache_->Contains(chunks[0].id)) << "the drop outlives a restart";
  ExpectReadsBack(chunks[1]);
  // Alone, the pack's ranges are punched as they go; with the last the pack goes.
  const Chunk more = MakeChunk(1 << 20, 3);
  ASSERT_TRUE(cache_->Remove(chunks[1].id).ok());
  EXPECT_FALSE(Exists(PackPath("3.1")));
  EXPECT_FALSE(Exists(IndexPath("3.1")));
  EXPECT_GT(before, 0u);
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("4.1"), "4.1", Stage("4.1", {chunks[0], more})).ok());
  ASSERT_EQ(::unlink(StagingPath("4.1").c_str()), 0);
  const uint64_t whole = Allocated(PackPath("4.1"));
  ASSERT_TRUE(cache_->Remove(more.id).ok());
  EXPECT_LT(Allocated(PackPath("4.1")), whole - (1u << 20) + (16u << 10));
  ExpectReadsBack(chunks[0]);
  Open();
  ExpectReadsBack(chunks[0]);
  EXPECT_FALSE(cache_->Contains(more.id));
}

TEST_F(PacksTest, RecoveryDropsExtentsOfMissingOrShortPacksAndTornRecords) {
  const std::vector<Chunk> a{MakeChunk(1 << 20, 1), MakeChunk(1 << 20, 2)};
  const std::vector<Chunk> b{MakeChunk(1 << 20, 3)};
  const std::vector<Chunk> c{MakeChunk(1 << 20, 4), MakeChunk(1 << 20, 5)};
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("a"), "a", Stage("a", a)).ok());
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("b"), "b", Stage("b", b)).ok());
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("c"), "c", Stage("c", c)).ok());
  for (const char* n : {"a", "b", "c"}) ASSERT_EQ(::unlink(StagingPath(n).c_str()), 0);
  cache_.reset();
  // a: cut short inside its second chunk; b: gone; c: half a record appended to its index.
  ASSERT_EQ(::truncate(PackPath("a").c_str(), 100 + (1 << 20) + 1000), 0);
  ASSERT_EQ(::unlink(PackPath("b").c_str()), 0);
  {
    const int fd = ::open(IndexPath("c").c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "+CKPACK", 7), 7);
    ::close(fd);
  }
  // And a pack whose seal died before it recorded anything.
  ASSERT_EQ(::link(PackPath("c").c_str(), PackPath("d").c_str()), 0);
  Open();
  ExpectReadsBack(a[0]);
  EXPECT_FALSE(cache_->Contains(a[1].id));
  EXPECT_EQ(cache_->Get(a[1].id, a[1].bytes.size()).status().code(), Code::kNotFound);
  EXPECT_FALSE(cache_->Contains(b[0].id));
  EXPECT_FALSE(Exists(IndexPath("b")));
  ExpectReadsBack(c[0]);
  ExpectReadsBack(c[1]);
  EXPECT_FALSE(Exists(PackPath("d")));
  EXPECT_EQ(Listed().size(), 3u);
  // The torn record was cut: records appended after it count.
  ASSERT_TRUE(cache_->Remove(c[0].id).ok());
  Open();
  EXPECT_FALSE(cache_->Contains(c[0].id));
  ExpectReadsBack(c[1]);
  EXPECT_EQ(test::Names(root_ + "/chunks/packs"),
            (std::vector<std::string>{"a.idx", "a.pack", "c.idx", "c.pack"}));
}

TEST_F(PacksTest, ACorruptExtentIsCaughtDroppedAndStoredAnew) {
  const std::vector<Chunk> chunks{MakeChunk(1 << 20, 1), MakeChunk(70000, 2)};
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("5.1"), "5.1", Stage("5.1", chunks)).ok());
  ASSERT_EQ(::unlink(StagingPath("5.1").c_str()), 0);
  {
    const int fd = ::open(PackPath("5.1").c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const uint8_t bad = static_cast<uint8_t>(chunks[0].bytes[5000] ^ 0xff);
    ASSERT_EQ(::pwrite(fd, &bad, 1, 100 + 5000), 1);
    ::close(fd);
  }
  EXPECT_EQ(cache_->Verify(chunks[0].id, chunks[0].bytes.size()).code(), Code::kCorrupt);
  EXPECT_EQ(metrics_.chunk_verify_failures.Get(), 1u);
  EXPECT_FALSE(cache_->Contains(chunks[0].id)) << "dropped, so that it is stored anew";
  EXPECT_EQ(cache_->Get(chunks[0].id, chunks[0].bytes.size()).status().code(), Code::kNotFound);
  ExpectReadsBack(chunks[1]);
  auto put = cache_->Put(chunks[0].id, chunks[0].bytes.data(), chunks[0].bytes.size());
  ASSERT_TRUE(put.ok());
  EXPECT_TRUE(*put) << "written as a chunk file";
  ExpectReadsBack(chunks[0]);
  Open();
  ExpectReadsBack(chunks[0]);
  ExpectReadsBack(chunks[1]);
}

TEST_F(PacksTest, ScanListsWhatAnUnmountedCacheDirectoryHolds) {
  const std::vector<Chunk> chunks{MakeChunk(4096, 1), MakeChunk(4096, 2)};
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("6.1"), "6.1", Stage("6.1", chunks)).ok());
  ASSERT_TRUE(cache_->Remove(chunks[0].id).ok());
  auto all = Packs::Scan(root_ + "/chunks/packs");
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all.begin()->first, chunks[1].id);
  EXPECT_EQ(all.begin()->second.first, PackPath("6.1"));
  EXPECT_EQ(all.begin()->second.second.offset, 100u + 4096u);
}

// A read that found bad bytes in an extent drops that extent only: meanwhile the chunk may have
// been dropped there and stored anew in another pack, whose good extent stays.
TEST_F(PacksTest, ADropForAnExtentAlreadyGoneLeavesTheChunksNewExtent) {
  auto packs = Packs::Open(root_ + "/chunks/packs-direct", GetLogger("test"));
  ASSERT_TRUE(packs.ok()) << packs.status().ToString();
  const Chunk c = MakeChunk(300 << 10, 41), d = MakeChunk(200 << 10, 42);
  ASSERT_TRUE((*packs)->Adopt(StagingPath("one"), "one", Stage("one", {c, d})).ok());
  const auto stale = (*packs)->Locate(c.id);
  ASSERT_TRUE(stale);
  ASSERT_TRUE((*packs)->Drop(c.id).ok());  // c freed: its range in "one" goes, d stays
  ASSERT_TRUE((*packs)->Adopt(StagingPath("two"), "two", Stage("two", {c})).ok());
  const auto fresh = (*packs)->Locate(c.id);
  ASSERT_TRUE(fresh);
  ASSERT_NE(fresh->first, stale->first);
  ASSERT_TRUE((*packs)->Drop(c.id, stale).ok());
  const auto still = (*packs)->Locate(c.id);
  ASSERT_TRUE(still);
  EXPECT_EQ(still->first, fresh->first);
  ASSERT_TRUE((*packs)->Drop(c.id, fresh).ok());
  EXPECT_FALSE((*packs)->Contains(c.id));
  EXPECT_TRUE((*packs)->Contains(d.id));
}

}  // namespace
}  // namespace ckptfs
