#include "cache/chunk_cache.h"

#include <algorithm>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <latch>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cache/chunk_buffer.h"
#include "cache/fault_io_engine.h"
#include "cache/io_engine.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Chunk = test::TestChunk;
using test::MakeChunk;

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Every test runs against both I/O engines.
class ChunkCacheTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    IoEngineOptions opts;
    opts.kind = GetParam();
    auto e = MakeIoEngine(opts);
    ASSERT_TRUE(e.ok());
    engine_ = std::move(*e);
    root_ = dir_.path();
  }

  void TearDown() override { cache_.reset(); }

  void Open(uint64_t ram_bytes = 64 << 20) {
    cache_.reset();
    auto c = ChunkCache::Open(root_, engine_.get(), ram_bytes, &metrics_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(*c);
  }

  // Opens the cache (no RAM tier) on an engine of this kind that fails as `spec` says.
  void OpenFaulty(const CacheFaultSpec& spec) {
    cache_.reset();
    IoEngineOptions opts;
    opts.kind = GetParam();
    auto inner = MakeIoEngine(opts);
    ASSERT_TRUE(inner.ok());
    faulty_ = std::make_unique<FaultIoEngine>(std::move(*inner), spec);
    auto c = ChunkCache::Open(root_, faulty_.get(), 0, &metrics_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cache_ = std::move(*c);
  }

  // The first Put of `c` meets the one injected write fault: EIO, and nothing left behind (no
  // chunk file, no temporary one). The next Put writes it.
  void ExpectOneFailedPut(const Chunk& c) {
    auto put = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
    ASSERT_FALSE(put.ok());
    EXPECT_EQ(put.status().code(), Code::kIo);
    EXPECT_FALSE(Exists(cache_->PathOf(c.id)));
    EXPECT_TRUE(ListDir(root_ + "/chunks/tmp").empty());
    Put(c);
  }

  void Put(const Chunk& c, bool expect_new = true) {
    auto r = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, expect_new);
  }

  void ExpectReadsBack(const Chunk& c) {
    auto r = cache_->Get(c.id, c.bytes.size());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ((*r)->size, c.bytes.size());
    EXPECT_TRUE(std::equal(c.bytes.begin(), c.bytes.end(), (*r)->bytes.get()));
  }

  test::TempDir dir_;
  std::string root_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<FaultIoEngine> faulty_;  // OpenFaulty's engine, outliving cache_
  Metrics metrics_;
  std::unique_ptr<ChunkCache> cache_;
};

TEST_P(ChunkCacheTest, PutIsDeduplicated) {
  Open();
  Chunk c = MakeChunk(100000, 1);
  EXPECT_FALSE(cache_->Contains(c.id));
  Put(c, true);
  EXPECT_TRUE(cache_->Contains(c.id));
  Put(c, false);
  EXPECT_EQ(metrics_.chunks_written.Get(), 1u);
  EXPECT_EQ(metrics_.chunk_bytes_written.Get(), 100000u);
  // The chunk lives at PathOf(id), under a directory named by its first two hex digits.
  const std::string path = cache_->PathOf(c.id);
  EXPECT_EQ(path, root_ + "/chunks/" + c.id.Hex().substr(0, 2) + "/" + c.id.Hex());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 100000);
  EXPECT_TRUE(ListDir(root_ + "/chunks/tmp").empty());
}

TEST_P(ChunkCacheTest, GetReturnsVerifiedBytes) {
  Open();
  Chunk c = MakeChunk(3 << 20, 2), empty = MakeChunk(0, 0);
  Put(c);
  Put(empty);
  ExpectReadsBack(c);
  ExpectReadsBack(c);  // from RAM this time
  ExpectReadsBack(empty);
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), c.bytes.size());
  EXPECT_EQ(metrics_.cache_hit_bytes.Get(), c.bytes.size());
  auto missing = cache_->Get(MakeChunk(10, 3).id, 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
}

TEST_P(ChunkCacheTest, ConcurrentGetsShareOneRead) {
  Open();
  Chunk c = MakeChunk(16 << 20, 4);
  Put(c);
  constexpr int kThreads = 12;
  std::latch start(kThreads);
  std::vector<ChunkRef> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      auto r = cache_->Get(c.id, c.bytes.size());
      if (r.ok()) got[t] = *r;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(got[t]) << "thread " << t;
    EXPECT_TRUE(got[t] == got[0]) << "thread " << t << " did not share the one verified copy";
  }
  EXPECT_TRUE(std::equal(c.bytes.begin(), c.bytes.end(), got[0]->bytes.get()));
  // Exactly one disk read: the others waited for it or found its result in RAM.
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), c.bytes.size());
}

TEST_P(ChunkCacheTest, CorruptChunkIsMovedAsideAndRewritten) {
  Open(/*ram_bytes=*/0);
  Chunk c = MakeChunk(50000, 5);
  Put(c);
  const std::string path = cache_->PathOf(c.id);
  {
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    ASSERT_EQ(::pread(fd, &b, 1, 12345), 1);
    b ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &b, 1, 12345), 1);
    ::close(fd);
  }
  auto r = cache_->Get(c.id, c.bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_EQ(metrics_.chunk_verify_failures.Get(), 1u);
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(Exists(root_ + "/chunks/corrupt/" + c.id.Hex()));
  EXPECT_FALSE(cache_->Contains(c.id));
  // Not cached as a failure: the next Get looks again and finds nothing.
  EXPECT_EQ(cache_->Get(c.id, c.bytes.size()).status().code(), Code::kNotFound);
  // The next Put writes the chunk anew and it reads back.
  Put(c, true);
  ExpectReadsBack(c);
}

TEST_P(ChunkCacheTest, TruncatedChunkIsCorrupt) {
  Open(0);
  Chunk c = MakeChunk(50000, 6);
  Put(c);
  ASSERT_EQ(::truncate(cache_->PathOf(c.id).c_str(), 40000), 0);
  auto r = cache_->Get(c.id, c.bytes.size());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_FALSE(cache_->Contains(c.id));
  Put(c, true);
  ExpectReadsBack(c);
}

// Whether direct I/O under `dir` bypasses the page cache: not where the filesystem refuses
// O_DIRECT, nor on tmpfs, which takes it since Linux 6.6 but keeps every byte in the page cache.
bool DirectRefused(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC) return true;
  int fd = ::open((dir + "/probe").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) return errno == EINVAL;
  ::close(fd);
  return false;
}

// Drops a chunk file's pages from the page cache (written back first, so that all of them go).
void Uncache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
}

// A chunk the page cache does not hold is read with O_DIRECT (blocks past its end are cut off);
// one it holds whole is copied from there. Either way the bytes are verified.
TEST_P(ChunkCacheTest, ChunksOutOfThePageCacheAreReadDirect) {
  if (DirectRefused(root_)) GTEST_SKIP() << "direct I/O does not bypass the page cache here";
  Open(0);
  std::vector<Chunk> chunks;
  uint64_t total = 0;
  // Those of 300 KiB and a few bytes go through a lent huge page (their own buffers are in small
  // pages), the others straight into their buffers (chunk_buffer.h).
  for (size_t size : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{(1 << 20) + 3},
                      size_t{3 << 20}, size_t{(300 << 10) + 1}, size_t{(2 << 20) - 3},
                      size_t{(300 << 10) + 5}, size_t{(300 << 10) + 9}}) {
    chunks.push_back(MakeChunk(size, 40 + chunks.size()));
    Put(chunks.back());
    Uncache(cache_->PathOf(chunks.back().id));
    total += size;
  }
  for (const Chunk& c : chunks) ExpectReadsBack(c);
  EXPECT_EQ(metrics_.cache_direct_read_bytes.Get(), total);
  // Now the page cache holds them (a buffered read brought them in): copied from there.
  for (const Chunk& c : chunks) {
    std::vector<uint8_t> b(c.bytes.size() + 1);
    int fd = ::open(cache_->PathOf(c.id).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::read(fd, b.data(), b.size()), static_cast<ssize_t>(c.bytes.size()));
    ::close(fd);
    ExpectReadsBack(c);
  }
  EXPECT_EQ(metrics_.cache_direct_read_bytes.Get(), total);
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), 2 * total);

  // A damaged block read directly fails verification: moved aside, as on the buffered path.
  for (size_t i : {4, 6}) {
    const Chunk& damaged = chunks[i];
    const std::string path = cache_->PathOf(damaged.id);
    const size_t at = damaged.bytes.size() / 2;
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const uint8_t b = static_cast<uint8_t>(damaged.bytes[at] ^ 1);
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
    Uncache(path);
    auto r = cache_->Get(damaged.id, damaged.bytes.size());
    ASSERT_FALSE(r.ok()) << i;
    EXPECT_EQ(r.status().code(), Code::kCorrupt);
    EXPECT_TRUE(Exists(root_ + "/chunks/corrupt/" + damaged.id.Hex()));
  }
  // A file longer than its chunk: the chunk's bytes are its first ones, as on the buffered path,
  // and the buffer's padding past them stays zero.
  for (size_t i : {3, 7, 8}) {
    const Chunk& odd = chunks[i];
    {
      int fd = ::open(cache_->PathOf(odd.id).c_str(), O_WRONLY | O_APPEND);
      ASSERT_GE(fd, 0);
      const std::vector<uint8_t> tail(100, 0xab);
      ASSERT_EQ(::write(fd, tail.data(), tail.size()), 100);
      ::close(fd);
    }
    Uncache(cache_->PathOf(odd.id));
    auto longer = cache_->Get(odd.id, odd.bytes.size());
    ASSERT_TRUE(longer.ok()) << longer.status().ToString();
    EXPECT_TRUE(std::equal(odd.bytes.begin(), odd.bytes.end(), (*longer)->bytes.get()));
    const uint8_t* pad = (*longer)->bytes.get() + odd.bytes.size();
    EXPECT_TRUE(std::all_of(pad, pad + (DirectBlocks(odd.bytes.size()) - odd.bytes.size()),
                            [](uint8_t b) { return b == 0; }))
        << i;
  }
  // A file shorter than its chunk: the direct read comes up short, the buffered one too, and the
  // chunk fails verification.
  const Chunk& cut = chunks[9];
  ASSERT_EQ(::truncate(cache_->PathOf(cut.id).c_str(), 200 << 10), 0);
  Uncache(cache_->PathOf(cut.id));
  auto shorter = cache_->Get(cut.id, cut.bytes.size());
  ASSERT_FALSE(shorter.ok());
  EXPECT_EQ(shorter.status().code(), Code::kCorrupt);
  EXPECT_TRUE(Exists(root_ + "/chunks/corrupt/" + cut.id.Hex()));
}

// Bytes this process has had read from a disk (/proc/self/io), or -1 where the kernel keeps no
// such count.
int64_t DiskReadBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value;
  while (io >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  return -1;
}

// A large chunk is written with O_DIRECT, all but its last partial block, so the page cache holds
// at most that block of it: reading it back is direct too. A small one goes through the page
// cache.
TEST_P(ChunkCacheTest, LargeChunksAreWrittenDirect) {
  if (DirectRefused(root_)) GTEST_SKIP() << "direct I/O does not bypass the page cache here";
  Open(0);
  Chunk large = MakeChunk((1 << 20) + 5, 60), small = MakeChunk(1000, 61);
  // Writing a chunk reads nothing back: its last, partial block is not written padded and then
  // cut back (which made the filesystem read that block again to zero its end). A first chunk
  // of the same shape brings the code of this path in from disk before the count starts.
  Chunk first = MakeChunk((1 << 20) + 7, 62);
  Put(first);
  const int64_t read_before = DiskReadBytes();
  Put(large);
  if (read_before >= 0) {
    EXPECT_EQ(DiskReadBytes(), read_before);
  } else {
    std::fprintf(stderr, "no /proc/self/io read_bytes here: reads while writing not checked\n");
  }
  Put(small);
  Put(large, false);  // already there: not written again
  EXPECT_EQ(metrics_.chunk_direct_write_bytes.Get(), first.bytes.size() + large.bytes.size());
  EXPECT_EQ(metrics_.chunk_bytes_written.Get(),
            first.bytes.size() + large.bytes.size() + small.bytes.size());
  struct stat st;
  ASSERT_EQ(::stat(cache_->PathOf(large.id).c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), large.bytes.size());
  EXPECT_TRUE(ListDir(root_ + "/chunks/tmp").empty());
  ExpectReadsBack(large);
  ExpectReadsBack(small);
  EXPECT_EQ(metrics_.cache_direct_read_bytes.Get(), large.bytes.size());
}

// A disk error on the last partial block of a direct write (which goes through the page cache)
// fails the Put as well, and leaves nothing behind.
TEST_P(ChunkCacheTest, DiskErrorsOnTheLastBlockFailTheWrite) {
  if (DirectRefused(root_)) GTEST_SKIP() << "direct I/O does not bypass the page cache here";
  CacheFaultSpec spec;
  spec.writes = true;
  spec.after = 1 << 20;  // the whole blocks' 1 MiB goes through; the write after it fails
  spec.count = 1;
  OpenFaulty(spec);
  Chunk odd = MakeChunk((1 << 20) + 5, 71);
  ExpectOneFailedPut(odd);
  ExpectReadsBack(odd);
}

// A disk error on the direct path is the answer: not retried through the page cache (where it
// would show only at the next sync), and nothing is left behind.
TEST_P(ChunkCacheTest, DiskErrorsOnTheDirectPathAreNotRetriedBuffered) {
  if (DirectRefused(root_)) GTEST_SKIP() << "direct I/O does not bypass the page cache here";
  CacheFaultSpec spec;
  spec.reads = spec.writes = true;
  spec.count = 1;
  OpenFaulty(spec);
  Chunk big = MakeChunk(1 << 20, 70);
  ExpectOneFailedPut(big);
  // Then a read of it fails once, without moving it aside.
  CacheFaultSpec read_once;
  read_once.reads = true;
  read_once.count = 1;
  OpenFaulty(read_once);
  auto got = cache_->Get(big.id, big.bytes.size());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kIo);
  EXPECT_TRUE(Exists(cache_->PathOf(big.id)));
  ExpectReadsBack(big);
}

TEST_P(ChunkCacheTest, PutRewritesAFileOfTheWrongSize) {
  Open(0);
  Chunk c = MakeChunk(50000, 7);
  Put(c);
  ASSERT_EQ(::truncate(cache_->PathOf(c.id).c_str(), 100), 0);
  Put(c, true);
  ExpectReadsBack(c);
}

TEST_P(ChunkCacheTest, RemoveDropsDiskAndRam) {
  Open();
  Chunk c = MakeChunk(50000, 8);
  Put(c);
  ExpectReadsBack(c);  // now in RAM too
  ASSERT_TRUE(cache_->Remove(c.id).ok());
  EXPECT_FALSE(cache_->Contains(c.id));
  EXPECT_FALSE(Exists(cache_->PathOf(c.id)));
  EXPECT_EQ(cache_->Get(c.id, c.bytes.size()).status().code(), Code::kNotFound);
  EXPECT_TRUE(cache_->Remove(c.id).ok());  // missing: not an error
}

// The RAM tier counts the memory its buffers hold: 1000-byte chunks take a 4 KiB block each.
TEST_P(ChunkCacheTest, RamCacheEvictsLeastRecentlyUsed) {
  Open(/*ram_bytes=*/3 * ChunkData::kAlign);
  Chunk a = MakeChunk(1000, 10), b = MakeChunk(1000, 11), c = MakeChunk(1000, 12),
        d = MakeChunk(1000, 13);
  for (const Chunk* x : {&a, &b, &c, &d}) Put(*x);
  for (const Chunk* x : {&a, &b, &c}) ExpectReadsBack(*x);  // 3 misses; RAM: c b a
  ExpectReadsBack(a);                                       // hit; RAM: a c b
  ExpectReadsBack(d);                                       // miss, evicts b; RAM: d a c
  EXPECT_EQ(metrics_.cache_hit_bytes.Get(), 1000u);
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), 4000u);
  ExpectReadsBack(a);  // hit
  ExpectReadsBack(c);  // hit
  EXPECT_EQ(metrics_.cache_hit_bytes.Get(), 3000u);
  ExpectReadsBack(b);  // miss: it was evicted
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), 5000u);
}

// A chunk of 1 to 2 MiB takes a whole huge page, and the RAM tier counts it so: two fit in
// 4 MiB, not three.
TEST_P(ChunkCacheTest, RamTierCountsTheBuffersMemory) {
  Open(/*ram_bytes=*/(4 << 20) + 1);
  Chunk a = MakeChunk((1 << 20) + 1, 15), b = MakeChunk((1 << 20) + 1, 16),
        c = MakeChunk((1 << 20) + 1, 17);
  for (const Chunk* x : {&a, &b, &c}) Put(*x);
  for (const Chunk* x : {&a, &b, &c}) ExpectReadsBack(*x);  // RAM: c b
  EXPECT_EQ(cache_->usage().ram_bytes, uint64_t{4} << 20);
  const uint64_t misses = metrics_.cache_miss_bytes.Get();
  ExpectReadsBack(b);
  ExpectReadsBack(c);
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), misses) << "b and c are in the RAM tier";
  ExpectReadsBack(a);
  EXPECT_EQ(metrics_.cache_miss_bytes.Get(), misses + a.bytes.size()) << "a was evicted";
}

TEST_P(ChunkCacheTest, ForEachListsEveryChunk) {
  Open();
  std::map<ChunkId, uint64_t> want;
  for (int i = 0; i < 40; ++i) {
    Chunk c = MakeChunk(100 + i * 37, 100 + i);
    Put(c);
    want[c.id] = c.bytes.size();
  }
  std::map<ChunkId, uint64_t> seen;
  ASSERT_TRUE(cache_->ForEach([&](const ChunkId& id, uint64_t size) { seen[id] = size; }).ok());
  EXPECT_EQ(seen, want);
}

TEST_P(ChunkCacheTest, OpenClearsLeftoverTempFiles) {
  Open();
  const std::string tmp = root_ + "/chunks/tmp/" + std::string(32, 'a') + ".1";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  Chunk c = MakeChunk(1000, 14);
  Put(c);
  Open();  // a restart
  EXPECT_FALSE(Exists(tmp));
  EXPECT_TRUE(cache_->Contains(c.id));
  ExpectReadsBack(c);
}

// The local tier is a 2 MiB tmpfs: Put fills it until ENOSPC.
class ChunkCacheNoSpaceTest : public ChunkCacheTest {
 protected:
  void SetUp() override {
    ChunkCacheTest::SetUp();
    root_ = dir_.Sub("tier");
    ASSERT_EQ(::mkdir(root_.c_str(), 0700), 0);
    if (::mount("tmpfs", root_.c_str(), "tmpfs", 0, "size=2m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << "); needs root";
    }
    mounted_ = true;
  }
  void TearDown() override {
    cache_.reset();  // closes its directory descriptor, so the unmount is not busy
    if (mounted_) {
      EXPECT_EQ(::umount(root_.c_str()), 0) << std::strerror(errno);
    }
  }
  bool mounted_ = false;
};

TEST_P(ChunkCacheNoSpaceTest, PutFailsCleanlyWhenFull) {
  Open(0);
  std::vector<Chunk> stored;
  Status failure;
  Chunk failed;
  for (int i = 0; i < 40; ++i) {
    Chunk c = MakeChunk(300 << 10, 1000 + i);
    auto r = cache_->Put(c.id, c.bytes.data(), c.bytes.size());
    if (!r.ok()) {
      failure = r.status();
      failed = std::move(c);
      break;
    }
    EXPECT_TRUE(*r);
    stored.push_back(std::move(c));
  }
  ASSERT_FALSE(failure.ok()) << "a 2 MiB tier took 12 MiB";
  EXPECT_EQ(failure.code(), Code::kNoSpace) << failure.ToString();
  EXPECT_GE(stored.size(), 3u);
  // Nothing is left behind: no temporary file, no torn chunk under the real name.
  EXPECT_TRUE(ListDir(root_ + "/chunks/tmp").empty());
  EXPECT_FALSE(cache_->Contains(failed.id));
  EXPECT_FALSE(Exists(cache_->PathOf(failed.id)));
  for (const Chunk& c : stored) ExpectReadsBack(c);
  // Freeing space makes the chunk fit.
  ASSERT_TRUE(cache_->Remove(stored[0].id).ok());
  ASSERT_TRUE(cache_->Remove(stored[1].id).ok());
  Put(failed, true);
  ExpectReadsBack(failed);
}

// The VmFlags of the mapping of this process that holds `p` (/proc/self/smaps), or "".
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo, hi;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// A chunk buffer of 1 MiB or more starts on a huge page boundary and asks for huge pages (one of
// 1 to 2 MiB takes a whole one), so that a direct transfer of it is a few disk segments, not one
// per small page (of which a disk takes a bounded number per request). Smaller ones stay in
// small pages, and a DirectBuffer lends them a huge page for their transfers.
TEST(ChunkDataTest, LargeBuffersAreHugePageAligned) {
  if (!Exists("/sys/kernel/mm/transparent_hugepage")) GTEST_SKIP() << "no huge pages in this kernel";
  constexpr size_t kHuge = 2 << 20;
  auto huge = [](const void* p) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHuge, 0u);
    return VmFlagsOf(p).find(" hg") != std::string::npos;
  };
  for (size_t size : {size_t{4} << 20, (size_t{4} << 20) + 5, size_t{2} << 20, size_t{6} << 20,
                      size_t{1} << 20, (size_t{3} << 19) + 7}) {
    auto d = ChunkData::Allocate(size);
    std::memset(d->bytes.get(), 1, size);  // written whole, as a read or a copy does
    EXPECT_TRUE(huge(d->bytes.get())) << size << ": " << VmFlagsOf(d->bytes.get());
    EXPECT_EQ(d->capacity(), std::max(kHuge, (size + (64 << 10) - 1) / (64 << 10) * (64 << 10)));
  }
  auto small = ChunkData::Allocate(512 << 10);
  EXPECT_EQ(VmFlagsOf(small->bytes.get()).find(" hg"), std::string::npos);
  EXPECT_EQ(small->capacity(), size_t{512} << 10);
  DirectBuffer lent;
  ASSERT_NE(lent.data(), nullptr);
  EXPECT_TRUE(huge(lent.data()));
}

INSTANTIATE_TEST_SUITE_P(Engines, ChunkCacheTest, ::testing::Values("uring", "pread"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Engines, ChunkCacheNoSpaceTest, ::testing::Values("uring", "pread"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ckptfs
