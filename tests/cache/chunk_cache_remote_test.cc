// The local tier in front of a backend (an in-memory one, with faults where a test wants them):
// misses fetched and verified, corrupt copies refetched, eviction of what the backend holds only,
// least recently used first, pins kept.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/fault_backend.h"
#include "backends/mem_backend.h"
#include "cache/chunk_cache.h"
#include "cache/io_engine.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Chunk = test::TestChunk;
using test::MakeChunk;

class RemoteCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = MakeIoEngine(IoEngineOptions{});
    ASSERT_TRUE(e.ok());
    engine_ = std::move(*e);
  }
  void Open(uint64_t disk_limit, Backend* backend) {
    auto c = ChunkCache::Open(dir_.path(), engine_.get(), 1 << 20, &metrics_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(*c);
    cache_->AttachRemote({backend}, disk_limit);
  }
  void Upload(const Chunk& c) {
    ASSERT_TRUE(mem_.Put(ChunkCache::ObjectKey(c.id), c.bytes.data(), c.bytes.size()).ok());
  }
  bool Reads(const Chunk& c) {
    auto r = cache_->Get(c.id, c.bytes.size());
    return r.ok() && (*r)->size == c.bytes.size() &&
           std::equal(c.bytes.begin(), c.bytes.end(), (*r)->bytes.get());
  }

  test::TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
  Metrics metrics_;
  MemBackend mem_;
  std::unique_ptr<ChunkCache> cache_;
};

TEST_F(RemoteCacheTest, MissIsFetchedVerifiedAndKept) {
  Open(0, &mem_);
  const Chunk c = MakeChunk(100'000, 1);
  Upload(c);
  EXPECT_FALSE(cache_->Contains(c.id));
  EXPECT_TRUE(Reads(c));
  EXPECT_TRUE(cache_->Contains(c.id));  // kept on disk
  EXPECT_EQ(metrics_.remote_fetches.Get(), 1u);
  // Absent everywhere: kNotFound, naming the backend.
  const Chunk gone = MakeChunk(10, 2);
  auto r = cache_->Get(gone.id, gone.bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

// Fetched chunks are written with O_DIRECT in whole blocks and cut back to their size: every
// size around a block boundary lands on disk exactly, and reads back verified from the file.
TEST_F(RemoteCacheTest, FetchedChunksOfAnySizeAreKeptExactly) {
  Open(0, &mem_);
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, (1 << 20) + 3, 4 << 20};
  std::vector<Chunk> cs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    cs.push_back(MakeChunk(sizes[i], 100 + static_cast<int>(i)));
    Upload(cs.back());
    ASSERT_TRUE(Reads(cs.back())) << sizes[i];
  }
  for (const Chunk& c : cs) {
    std::FILE* f = std::fopen(cache_->PathOf(c.id).c_str(), "rb");
    ASSERT_NE(f, nullptr) << c.bytes.size();
    std::vector<uint8_t> on_disk(c.bytes.size() + 8192);
    const size_t n = std::fread(on_disk.data(), 1, on_disk.size(), f);
    std::fclose(f);
    EXPECT_EQ(n, c.bytes.size());
    EXPECT_TRUE(std::equal(c.bytes.begin(), c.bytes.end(), on_disk.begin())) << c.bytes.size();
  }
  // A second cache over the same directory, without the backend, serves them from disk.
  cache_.reset();
  auto local = ChunkCache::Open(dir_.path(), engine_.get(), 0, &metrics_);
  ASSERT_TRUE(local.ok());
  for (const Chunk& c : cs) {
    auto r = (*local)->Get(c.id, c.bytes.size());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(std::equal(c.bytes.begin(), c.bytes.end(), (*r)->bytes.get()));
  }
}

// A chunk file removed behind the cache's back: once a read has found it gone, Warm fetches it
// again instead of believing its map (fsck --repair counts on that).
TEST_F(RemoteCacheTest, WarmFetchesAChunkWhoseFileWentMissing) {
  Open(0, &mem_);
  const Chunk c = MakeChunk(70'000, 7);
  Upload(c);
  ASSERT_TRUE(cache_->Put(c.id, c.bytes.data(), c.bytes.size()).ok());
  ASSERT_TRUE(cache_->OnDisk(c.id));
  ASSERT_EQ(::unlink(cache_->PathOf(c.id).c_str()), 0);
  EXPECT_EQ(cache_->Verify(c.id, c.bytes.size()).code(), Code::kNotFound);
  EXPECT_FALSE(cache_->OnDisk(c.id));
  ASSERT_TRUE(cache_->Warm(c.id, c.bytes.size()).ok());
  EXPECT_EQ(metrics_.remote_fetches.Get(), 1u);
  EXPECT_TRUE(cache_->Verify(c.id, c.bytes.size()).ok());
}

// Chunk buffers are aligned and zero-padded to the next block, also when they come back from the
// pool holding another chunk's bytes.
TEST(ChunkDataTest, BuffersAreAlignedAndPaddedWithZeros) {
  for (int round = 0; round < 3; ++round) {
    for (size_t size : {size_t{0}, size_t{1}, size_t{4097}, size_t{(2 << 20) - 5}}) {
      auto d = ChunkData::Allocate(size);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(d->bytes.get()) % ChunkData::kAlign, 0u);
      const size_t block_end = (size + ChunkData::kAlign - 1) / ChunkData::kAlign * ChunkData::kAlign;
      for (size_t i = size; i < block_end; ++i) ASSERT_EQ(d->bytes[i], 0) << size << " " << i;
      std::memset(d->bytes.get(), 0xff, block_end);  // dirty it for the next round's reuse
    }
  }
}

TEST_F(RemoteCacheTest, CorruptLocalCopyIsRefetched) {
  Open(0, &mem_);
  const Chunk c = MakeChunk(50'000, 3);
  Upload(c);
  ASSERT_TRUE(cache_->Put(c.id, c.bytes.data(), c.bytes.size()).ok());
  std::vector<uint8_t> bad = c.bytes;
  bad[7] ^= 1;
  {
    FILE* f = std::fopen(cache_->PathOf(c.id).c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fwrite(bad.data(), 1, bad.size(), f);
    std::fclose(f);
  }
  EXPECT_TRUE(Reads(c));
  EXPECT_EQ(metrics_.chunk_verify_failures.Get(), 1u);
  EXPECT_EQ(metrics_.remote_fetches.Get(), 1u);
}

TEST_F(RemoteCacheTest, ABackendThatLiesIsCaughtNeverServed) {
  FaultBackend faulty(&mem_);
  FaultSpec spec;
  spec.flip = 1.0;
  spec.ops = kOpGet;
  ASSERT_TRUE(faulty.SetSpec(spec).ok());
  Open(0, &faulty);
  const Chunk c = MakeChunk(20'000, 4);
  Upload(c);
  auto r = cache_->Get(c.id, c.bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_GE(metrics_.remote_verify_failures.Get(), 2u);  // fetched again before giving up
  EXPECT_FALSE(cache_->Contains(c.id));
}

TEST_F(RemoteCacheTest, EvictsOnlyWhatTheBackendHoldsLeastRecentFirstAndKeepsPins) {
  Open(300'000, &mem_);
  std::vector<Chunk> cs;
  for (int i = 0; i < 5; ++i) cs.push_back(MakeChunk(100'000, 10 + i));
  // Five local chunks, 500 KB against a 300 KB limit: none is held by the backend yet.
  for (const Chunk& c : cs) ASSERT_TRUE(cache_->Put(c.id, c.bytes.data(), c.bytes.size()).ok());
  EXPECT_EQ(cache_->Evict(), 0u);
  EXPECT_EQ(cache_->usage().local_only, 500'000u);
  // Uploaded, in order 0..4; chunk 0 read again (most recent), chunk 1 pinned.
  for (const Chunk& c : cs) {
    Upload(c);
    cache_->MarkRemote(c.id, 0);
  }
  EXPECT_TRUE(Reads(cs[0]));
  cache_->SetPinned({{cs[1].id, cs[1].bytes.size()}});
  EXPECT_EQ(cache_->Evict(), 200'000u);
  EXPECT_TRUE(cache_->Contains(cs[0].id));
  EXPECT_TRUE(cache_->Contains(cs[1].id));
  EXPECT_FALSE(cache_->Contains(cs[2].id));
  EXPECT_FALSE(cache_->Contains(cs[3].id));
  EXPECT_TRUE(cache_->Contains(cs[4].id));
  EXPECT_EQ(cache_->usage().disk_bytes, 300'000u);
  // An evicted chunk comes back from the backend.
  EXPECT_TRUE(Reads(cs[2]));
}

TEST_F(RemoteCacheTest, FetchedChunksNobodyReferencesAreServedNotKept) {
  Open(0, &mem_);
  cache_->SetKeepFetched([](const ChunkId&) { return false; });
  const Chunk c = MakeChunk(30'000, 20);
  Upload(c);
  EXPECT_TRUE(Reads(c));
  EXPECT_FALSE(cache_->Contains(c.id));
}

}  // namespace
}  // namespace ckptfs
