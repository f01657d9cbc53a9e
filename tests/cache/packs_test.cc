// Chunks kept as extents of packs (cache/packs.h) through the local tier's calls (ChunkCache).
#include "cache/packs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
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
  // Pack `name` of eight 256 KiB chunks (seeds from `seed`), its staging name gone, with all but
  // its first `keep` chunks removed: sparse, for compaction.
  std::vector<Chunk> SparsePack(const std::string& name, uint64_t seed, int keep) {
    std::vector<Chunk> chunks;
    for (int i = 0; i < 8; ++i) chunks.push_back(MakeChunk(256 << 10, seed + i));
    EXPECT_TRUE(cache_->AdoptPack(StagingPath(name), name, Stage(name, chunks)).ok());
    EXPECT_EQ(::unlink(StagingPath(name).c_str()), 0);
    std::vector<ChunkId> going;
    for (int i = keep; i < 8; ++i) going.push_back(chunks[i].id);
    for (const Status& st : cache_->RemoveMany(going)) EXPECT_TRUE(st.ok());
    return chunks;
  }
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
  uint64_t total = 0;
  for (const Chunk& c : chunks) total += c.bytes.size();
  EXPECT_EQ(metrics_.chunk_bytes_written.Get(), total) << "new chunks stored";
  EXPECT_EQ(metrics_.chunk_adopted_bytes.Get(), total) << "all kept in place: no byte written again";
  EXPECT_EQ(metrics_.chunk_direct_write_bytes.Get(), 0u);
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

// A daemon stopped between a seal's commit and its punch leaves the chunks stored elsewhere
// unpunched in the pack: the next Open punches every range no live extent covers, whole blocks
// only (a live neighbour's bytes are never touched), and never in a pack with another name.
TEST_F(PacksTest, OpenPunchesWhatASealStoppedBeforeItsPunchLeft) {
  const Chunk file = MakeChunk(2 << 20, 1), own = MakeChunk(1 << 20, 2), tiny = MakeChunk(3000, 3),
              own2 = MakeChunk(1 << 20, 4);
  ASSERT_TRUE(cache_->Put(file.id, file.bytes.data(), file.bytes.size()).ok());
  ASSERT_TRUE(cache_->Put(tiny.id, tiny.bytes.data(), tiny.bytes.size()).ok());
  // own | file (stored already) | own2 | tiny (stored already, within two blocks) | own.
  const Chunk last = MakeChunk(1 << 20, 5);
  auto entries = Stage("9.1", {own, file, own2, tiny, last});
  auto skipped = cache_->AdoptPack(StagingPath("9.1"), "9.1", entries);
  ASSERT_TRUE(skipped.ok());
  ASSERT_EQ(*skipped, (std::vector<size_t>{1, 3}));
  // A second pack whose staging file is still named: never punched.
  const Chunk other = MakeChunk(1 << 20, 6);
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("9.2"), "9.2", Stage("9.2", {other, file})).ok());
  // And an extent dropped while the staging file was named: recorded, not punched.
  ASSERT_TRUE(cache_->Remove(own2.id).ok());
  ASSERT_EQ(::unlink(StagingPath("9.1").c_str()), 0);  // the commit; then the daemon stops
  const uint64_t before = Allocated(PackPath("9.1")), kept = Allocated(PackPath("9.2"));
  Open();
  const uint64_t after = Allocated(PackPath("9.1"));
  EXPECT_LE(after, before - (3u << 20) + (8u << 10)) << "file's and own2's ranges are punched";
  EXPECT_EQ(Allocated(PackPath("9.2")), kept) << "its staging file is still named";
  EXPECT_FALSE(cache_->Contains(own2.id));
  for (const Chunk& c : {own, file, tiny, last, other}) ExpectReadsBack(c);
  // Nothing left to punch: a second start changes nothing.
  Open();
  EXPECT_EQ(Allocated(PackPath("9.1")), after);
  for (const Chunk& c : {own, last}) ExpectReadsBack(c);
}

// Many drops at once (eviction, reclaim) sync a pack's index once, not once per extent; the
// drops still outlive a restart and their ranges are punched.
TEST_F(PacksTest, DropManySyncsEachPackIndexOnce) {
  auto packs = Packs::Open(root_ + "/chunks/packs-direct", GetLogger("test"));
  ASSERT_TRUE(packs.ok()) << packs.status().ToString();
  std::vector<Chunk> a, b;
  for (int i = 0; i < 20; ++i) {
    a.push_back(MakeChunk(64 << 10, 100 + i));
    b.push_back(MakeChunk(64 << 10, 200 + i));
  }
  ASSERT_TRUE((*packs)->Adopt(StagingPath("a"), "a", Stage("a", a)).ok());
  ASSERT_TRUE((*packs)->Adopt(StagingPath("b"), "b", Stage("b", b)).ok());
  for (const char* n : {"a", "b"}) ASSERT_EQ(::unlink(StagingPath(n).c_str()), 0);
  const std::string pack_b = root_ + "/chunks/packs-direct/b.pack";
  const uint64_t whole = Allocated(pack_b);
  // One by one: one sync each.
  uint64_t syncs = (*packs)->index_syncs();
  for (int i = 0; i < 19; ++i) ASSERT_TRUE((*packs)->Drop(a[i].id).ok());
  EXPECT_EQ((*packs)->index_syncs() - syncs, 19u);
  // At once: one sync for the pack.
  std::vector<ChunkId> ids;
  for (int i = 0; i < 19; ++i) ids.push_back(b[i].id);
  syncs = (*packs)->index_syncs();
  ASSERT_TRUE((*packs)->DropMany(ids).ok());
  EXPECT_EQ((*packs)->index_syncs() - syncs, 1u);
  EXPECT_LE(Allocated(pack_b), whole - 19 * (64u << 10) + (8u << 10))
      << "neighbours dropped together are punched as one range";
  for (int i = 0; i < 19; ++i) EXPECT_FALSE((*packs)->Contains(b[i].id));
  packs->reset();
  packs = Packs::Open(root_ + "/chunks/packs-direct", GetLogger("test"));
  ASSERT_TRUE(packs.ok());
  for (int i = 0; i < 19; ++i) {
    EXPECT_FALSE((*packs)->Contains(a[i].id));
    EXPECT_FALSE((*packs)->Contains(b[i].id));
  }
  EXPECT_TRUE((*packs)->Contains(a[19].id));
  EXPECT_TRUE((*packs)->Contains(b[19].id));
}

TEST_F(PacksTest, RemoveManyThroughTheCacheDropsEveryExtentAndChunkFile) {
  const std::vector<Chunk> chunks{MakeChunk(300 << 10, 1), MakeChunk(300 << 10, 2),
                                  MakeChunk(300 << 10, 3)};
  const Chunk file = MakeChunk(100 << 10, 4);
  ASSERT_TRUE(cache_->Put(file.id, file.bytes.data(), file.bytes.size()).ok());
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("r"), "r", Stage("r", chunks)).ok());
  ASSERT_EQ(::unlink(StagingPath("r").c_str()), 0);
  const auto st = cache_->RemoveMany({chunks[0].id, file.id, chunks[1].id, file.id});
  ASSERT_EQ(st.size(), 4u);
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(cache_->Contains(chunks[0].id));
  EXPECT_FALSE(cache_->Contains(chunks[1].id));
  EXPECT_FALSE(cache_->Contains(file.id));
  ExpectReadsBack(chunks[2]);
  Open();
  EXPECT_FALSE(cache_->Contains(chunks[0].id));
  ExpectReadsBack(chunks[2]);
}

// A pack left holding under a quarter of its size moves its last chunks into chunk files and
// goes; a denser one stays as it is.
TEST_F(PacksTest, CompactionMovesTheLastChunksOfASparsePackIntoChunkFiles) {
  std::vector<Chunk> sparse, dense;
  for (int i = 0; i < 8; ++i) sparse.push_back(MakeChunk(256 << 10, 10 + i));
  for (int i = 0; i < 4; ++i) dense.push_back(MakeChunk(256 << 10, 30 + i));
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("s"), "s", Stage("s", sparse)).ok());
  ASSERT_TRUE(cache_->AdoptPack(StagingPath("d"), "d", Stage("d", dense)).ok());
  EXPECT_EQ(cache_->CompactPacks(), 0u) << "nothing dropped yet";
  for (const char* n : {"s", "d"}) ASSERT_EQ(::unlink(StagingPath(n).c_str()), 0);
  // s keeps 1 of 8 (an eighth), d 3 of 4.
  std::vector<ChunkId> going{dense[0].id};
  for (int i = 1; i < 8; ++i) going.push_back(sparse[i].id);
  for (const Status& st : cache_->RemoveMany(going)) ASSERT_TRUE(st.ok());
  EXPECT_EQ(cache_->CompactPacks(), 256u << 10);
  EXPECT_TRUE(Exists(cache_->PathOf(sparse[0].id))) << "moved into its chunk file";
  EXPECT_FALSE(Exists(PackPath("s"))) << "the pack goes with its last extent";
  EXPECT_FALSE(Exists(IndexPath("s")));
  EXPECT_TRUE(Exists(PackPath("d")));
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(Exists(cache_->PathOf(dense[i].id)));
  EXPECT_EQ(cache_->CompactPacks(), 0u) << "done";
  ExpectReadsBack(sparse[0]);
  for (int i = 1; i < 4; ++i) ExpectReadsBack(dense[i]);
  Open();
  ExpectReadsBack(sparse[0]);
  EXPECT_EQ(cache_->pack_count(), 1u);
}

// Eviction and reclaim leave compaction to the cache's own thread (CompactSoon): it runs passes
// until one moves nothing, and the cache's end waits for it.
TEST_F(PacksTest, CompactSoonCompactsBehindTheCallerAndTheCacheWaitsForIt) {
  const std::vector<Chunk> chunks = SparsePack("b", 70, 1);
  cache_->CompactSoon();
  for (int i = 0; i < 500 && Exists(PackPath("b")); ++i) ::usleep(10000);
  EXPECT_FALSE(Exists(PackPath("b"))) << "compacted away behind the caller";
  EXPECT_TRUE(Exists(cache_->PathOf(chunks[0].id)));
  ExpectReadsBack(chunks[0]);
  // Asked and ended at once: the destructor joins the thread (the sanitizers' builds check it).
  cache_->CompactSoon();
  cache_.reset();
  Open();
  ExpectReadsBack(chunks[0]);
}

// Compaction reads an extent, writes it as a chunk file, then renames that into place; a removal
// of the chunk in between (eviction, reclaim) must not be undone by the rename, and the move is
// no new chunk (the written counters and the disk map stay).
TEST_F(PacksTest, ACompactionMoveOfAChunkRemovedMeanwhileLeavesNoChunkFile) {
  const std::vector<Chunk> chunks = SparsePack("m", 90, 2);
  const uint64_t written = metrics_.chunk_bytes_written.Get();
  const uint64_t stored = cache_->usage().disk_bytes;
  const Packs::Entry first{chunks[0].id, 100, chunks[0].bytes.size()};  // where Stage put them
  const Packs::Entry second{chunks[1].id, 100 + chunks[0].bytes.size(), chunks[1].bytes.size()};
  ASSERT_TRUE(cache_->RemoveMany({chunks[0].id}).front().ok());  // after its bytes were read
  auto moved = cache_->MoveIntoChunkFile("m", first, chunks[0].bytes.data());
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_FALSE(*moved);
  EXPECT_FALSE(Exists(cache_->PathOf(chunks[0].id))) << "the removal stands";
  EXPECT_FALSE(cache_->Contains(chunks[0].id));

  moved = cache_->MoveIntoChunkFile("m", second, chunks[1].bytes.data());
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_TRUE(*moved);
  EXPECT_TRUE(Exists(cache_->PathOf(chunks[1].id)));
  EXPECT_EQ(metrics_.chunk_bytes_written.Get(), written) << "a move is no new chunk";
  EXPECT_EQ(cache_->usage().disk_bytes, stored - chunks[0].bytes.size());
  ExpectReadsBack(chunks[1]);
}

// The state a crash in the middle of a compaction leaves before its '-' records: chunk files
// written and the extents still recorded (the next pass finishes the move). After the '-'
// records the chunk files are durable (synced first); a range recorded dropped and not yet
// punched is what OpenPunchesWhatASealStoppedBeforeItsPunchLeft covers.
TEST_F(PacksTest, ACompactionStoppedAtAnyStepLeavesEachChunkInAHome) {
  const std::vector<Chunk> chunks = SparsePack("c", 50, 2);
  // Stopped after writing chunk 0's file (a chunk file of right length, wrong bytes, too:
  // compaction never trusts a file it did not write) and before any '-' record.
  cache_.reset();
  std::vector<uint8_t> bad = chunks[1].bytes;
  bad[10] ^= 0xff;
  for (const auto& [c, bytes] :
       {std::make_pair(chunks[0], chunks[0].bytes), std::make_pair(chunks[1], bad)}) {
    const std::string path = root_ + "/chunks/" + c.id.Hex().substr(0, 2) + "/" + c.id.Hex();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  Open();
  ExpectReadsBack(chunks[0]);
  EXPECT_EQ(cache_->CompactPacks(), 512u << 10);
  EXPECT_FALSE(Exists(PackPath("c")));
  ExpectReadsBack(chunks[0]);
  ExpectReadsBack(chunks[1]);  // rewritten from its verified extent
  Open();
  ExpectReadsBack(chunks[0]);
  ExpectReadsBack(chunks[1]);
}
// An index append cut short (a full disk: the bytes that fit in its last block, then ENOSPC; here
// the file size limit) leaves no partial record behind: a later record appended after one would
// be read from the wrong offset, and Open, cutting the index at the partial record, would bring
// back an extent dropped and punched since.
TEST_F(PacksTest, AnAppendCutShortLeavesNoPartialRecordBehind) {
  const Chunk c = MakeChunk(64 << 10, 51), d = MakeChunk(64 << 10, 52);
  const auto entries = Stage("9.1", {c, d});
  {
    auto packs = Packs::Open(root_ + "/chunks/packs", GetLogger("test"));
    ASSERT_TRUE(packs.ok()) << packs.status().ToString();
    ASSERT_TRUE((*packs)->Adopt(StagingPath("9.1"), "9.1", entries).ok());
    ASSERT_EQ(::unlink(StagingPath("9.1").c_str()), 0);
    struct stat st;
    ASSERT_EQ(::stat(IndexPath("9.1").c_str(), &st), 0);
    struct rlimit old;
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    const auto old_signal = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit cut = old;
    cut.rlim_cur = static_cast<rlim_t>(st.st_size) + 20;  // 20 bytes of the next record fit
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &cut), 0);
    const Status failed = (*packs)->Drop(c.id);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
    ::signal(SIGXFSZ, old_signal);
    ASSERT_FALSE(failed.ok());
    EXPECT_TRUE((*packs)->Contains(c.id)) << "not dropped: the drop failed";
    ASSERT_TRUE((*packs)->Drop(c.id).ok());  // tried again: recorded, and its range punched
  }
  Open();
  EXPECT_FALSE(cache_->Contains(c.id)) << "a dropped extent must not come back over its hole";
  ExpectReadsBack(d);
}

// A staging file adopted by a seal that did not commit, one of whose chunks another file named
// meanwhile, is sealed again cut otherwise (a remount with other chunking options after a
// crash): its new extents overlap the one that stayed. Dropping that one later must not punch
// bytes the new ones hold.
TEST_F(PacksTest, DroppingAnExtentNeverPunchesAnOverlappingLiveOne) {
  for (const bool restart : {false, true}) {
    const std::string name = restart ? "11.1" : "10.1";
    const Chunk whole = MakeChunk(1 << 20, restart ? 62 : 61);
    ASSERT_TRUE(cache_->AdoptPack(StagingPath(name), name, Stage(name, {whole})).ok());
    const size_t cut = 600 << 10;
    Chunk head{std::vector<uint8_t>(whole.bytes.begin(), whole.bytes.begin() + cut), {}};
    Chunk tail{std::vector<uint8_t>(whole.bytes.begin() + cut, whole.bytes.end()), {}};
    head.id = ChunkId::Of(head.bytes.data(), head.bytes.size());
    tail.id = ChunkId::Of(tail.bytes.data(), tail.bytes.size());
    const std::vector<Packs::Entry> second{{head.id, 100, cut},
                                           {tail.id, 100 + cut, tail.bytes.size()}};
    auto again = cache_->AdoptPack(StagingPath(name), name, second);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    ASSERT_TRUE(again->empty());
    ASSERT_EQ(::unlink(StagingPath(name).c_str()), 0);  // the second seal's commit
    if (restart) Open();
    ASSERT_TRUE(cache_->Remove(whole.id).ok());  // the other file is deleted
    ExpectReadsBack(head);
    ExpectReadsBack(tail);
    Open();
    ExpectReadsBack(head);
    ExpectReadsBack(tail);
  }
}

// A chunk file a machine crash cut short, and the chunk's extent a seal stored since (it did not
// trust that file): a read moves the bad file aside and is served from the extent.
TEST_F(PacksTest, AShortChunkFileDoesNotHideTheChunksExtent) {
  const Chunk c = MakeChunk(300 << 10, 71);
  {
    const int fd = ::open(cache_->PathOf(c.id).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, c.bytes.data(), 4096), 4096);
    ::close(fd);
  }
  EXPECT_FALSE(cache_->HasWhole(c.id, c.bytes.size()));
  auto skipped = cache_->AdoptPack(StagingPath("12.1"), "12.1", Stage("12.1", {c}));
  ASSERT_TRUE(skipped.ok()) << skipped.status().ToString();
  ASSERT_TRUE(skipped->empty());
  EXPECT_TRUE(cache_->Verify(c.id, c.bytes.size()).ok());
  EXPECT_FALSE(Exists(cache_->PathOf(c.id))) << "moved aside";
  ExpectReadsBack(c);
}

// A crash tears the index's last record at any byte: Open cuts it there, and records appended
// after that (a drop, recorded and punched) still count after the next restart.
TEST_F(PacksTest, AnIndexTornAtAnyByteOfItsLastRecordIsCutThere) {
  const Chunk c = MakeChunk(64 << 10, 81), d = MakeChunk(64 << 10, 82), e = MakeChunk(64 << 10, 83);
  const auto entries = Stage("13.1", {c, d, e});
  std::string whole;
  {
    auto packs = Packs::Open(root_ + "/chunks/packs-torn", GetLogger("test"));
    ASSERT_TRUE(packs.ok());
    ASSERT_TRUE((*packs)->Adopt(StagingPath("13.1"), "13.1", entries).ok());
    whole = test::ReadFileBytes(root_ + "/chunks/packs-torn/13.1.idx");
  }
  ASSERT_EQ(whole.size() % 3, 0u);
  const size_t record = whole.size() / 3;
  const std::string dir = root_ + "/chunks/packs-torn";
  for (size_t cut = 2 * record; cut < whole.size(); ++cut) {
    SCOPED_TRACE(cut);
    {
      const int fd = ::open((dir + "/13.1.idx").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::write(fd, whole.data(), cut), static_cast<ssize_t>(cut));
      ::close(fd);
    }
    if (::link(StagingPath("13.1").c_str(), (dir + "/13.1.pack").c_str()) != 0) {
      ASSERT_EQ(errno, EEXIST);
    }
    {
      auto packs = Packs::Open(dir, GetLogger("test"));
      ASSERT_TRUE(packs.ok()) << packs.status().ToString();
      EXPECT_TRUE((*packs)->Contains(c.id));
      EXPECT_TRUE((*packs)->Contains(d.id));
      EXPECT_FALSE((*packs)->Contains(e.id));
      ASSERT_TRUE((*packs)->Drop(c.id).ok());
    }
    auto packs = Packs::Open(dir, GetLogger("test"));
    ASSERT_TRUE(packs.ok());
    EXPECT_FALSE((*packs)->Contains(c.id));
    EXPECT_TRUE((*packs)->Contains(d.id));
    EXPECT_FALSE((*packs)->Contains(e.id));
  }
}

}  // namespace
}  // namespace ckptfs
