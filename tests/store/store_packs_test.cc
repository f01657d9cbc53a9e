// Seals that keep their staging file as a pack (Config::packs; store/pack_sink.h, cache/packs.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/packs.h"
#include "store/store.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StorePacksTest : public test::StoreFixture {
 protected:
  void SetUp() override {
    test::StoreFixture::SetUp();
    cfg_.packs = true;
    Reopen();
  }
  // The files of the packs seals made of staging files, and of those the daemon appends its own
  // chunks to ("append.<ns>": cache/append_pack.h).
  std::vector<std::string> Packs() { return PackNames(false); }
  std::vector<std::string> AppendPacks() { return PackNames(true); }
  // The bytes of the extents the packs' indexes list.
  uint64_t ExtentBytes() {
    uint64_t n = 0;
    for (const auto& [id, at] : Packs::Scan(cfg_.cache_dir + "/chunks/packs")) n += at.second.len;
    return n;
  }
  std::vector<std::string> PackNames(bool appended) {
    std::vector<std::string> out;
    for (const std::string& n : test::Names(cfg_.cache_dir + "/chunks/packs")) {
      if ((n.rfind("append.", 0) == 0) == appended) out.push_back(n);
    }
    return out;
  }
  size_t StagingFiles() { return test::Names(cfg_.cache_dir + "/passthrough").size(); }
  // The disk room the one pack a seal made takes (st_blocks).
  uint64_t PackRoom() {
    for (const std::string& n : Packs()) {
      if (n.size() > 5 && n.substr(n.size() - 5) == ".pack") {
        struct stat st;
        if (::stat((cfg_.cache_dir + "/chunks/packs/" + n).c_str(), &st) == 0) {
          return static_cast<uint64_t>(st.st_blocks) * 512;
        }
      }
    }
    return 0;
  }
  // create(2) in passthrough mode, the bytes written by "the kernel" (and fsync'd with
  // `durable`), close(2): flush, release.
  uint64_t CreateStaged(const std::string& name, const Bytes& data, bool durable = false) {
    uint64_t fh = 0;
    int fd = -1;
    auto rec = store_->CreateFile(kRootIno, name, 0644, who_, &fh, nullptr, &fd);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    if (durable) {
      EXPECT_TRUE(store_->Fsync(rec->ino, fh).ok());
    }
    EXPECT_TRUE(store_->Flush(rec->ino, fh).ok());
    EXPECT_TRUE(store_->Release(rec->ino, fh).ok());
    return rec->ino;
  }
};

TEST_F(StorePacksTest, TheSealKeepsTheStagingFileAsThePackOfItsNewChunks) {
  const Bytes old = test::RandomBytes(2 << 20, 1), fresh = test::RandomBytes(2 << 20, 2);
  InodeRecord classic = File(kRootIno, "classic");
  WriteFile(classic.ino, old);
  EXPECT_EQ(ChunkFiles(), 0u) << "the daemon's write path appends to a pack";
  EXPECT_EQ(AppendPacks().size(), 2u) << "a pack and its index";
  const size_t chunk_files = ChunkFiles();
  const uint64_t written = store_->metrics().chunk_bytes_written.Get();
  const uint64_t direct = store_->metrics().chunk_direct_write_bytes.Get();
  Bytes data = old;
  data.insert(data.end(), fresh.begin(), fresh.end());

  const uint64_t ino = CreateStaged("staged", data, /*durable=*/true);
  ASSERT_TRUE(store_->EnsureSealed(ino).ok());
  EXPECT_EQ(StagingFiles(), 0u) << "the staging file's own name goes with the seal";
  EXPECT_EQ(ChunkFiles(), chunk_files) << "no chunk file is written";
  // The new chunks are stored (counted as written) and all of them adopted in place: none was
  // copied (the direct path, which every chunk file write takes here, wrote nothing more).
  const uint64_t stored = store_->metrics().chunk_bytes_written.Get() - written;
  EXPECT_GE(stored, fresh.size());
  EXPECT_EQ(store_->metrics().chunk_adopted_bytes.Get(), stored) << "no byte is written twice";
  EXPECT_EQ(store_->metrics().chunk_direct_write_bytes.Get(), direct);
  ASSERT_EQ(Packs().size(), 2u) << "a pack and its index";
  // The bytes shared with the classic file are punched out (the chunk at the boundary may span
  // both halves): the pack keeps little more than the new half's room.
  EXPECT_LT(PackRoom(), fresh.size() + (512u << 10));
  EXPECT_TRUE(ReadFile(ino) == data);
  EXPECT_TRUE(ReadFile(classic.ino) == old);

  Reopen();
  EXPECT_TRUE(ReadFile(ino) == data);
  // fsync'd: the pack and its index outlive a machine crash (nothing unsynced is lost here).
  Crash(nullptr);
  EXPECT_TRUE(ReadFile(ino) == data);
  auto r = store_->Fsck(kRootIno, Store::FsckOptions{.deep = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->Clean()) << r->Json();
  EXPECT_EQ(r->unreferenced_chunk_files, 0u);
}

// The chunks of the daemon's write path are appended to a pack of its own: no chunk file; the
// fsync'd file outlives a machine crash; an unclean start's sweep drops the extents of a file
// whose commit never came; a file deleted takes its extents with it.
TEST_F(StorePacksTest, TheDaemonsWritePathAppendsItsChunksToAPack) {
  const Bytes a = test::RandomBytes(3 << 20, 11), b = test::RandomBytes(2 << 20, 12);
  const InodeRecord fa = DurableFile(kRootIno, "a", a);
  EXPECT_EQ(ChunkFiles(), 0u);
  ASSERT_EQ(AppendPacks().size(), 2u);
  EXPECT_TRUE(Packs().empty());
  EXPECT_TRUE(ReadFile(fa.ino) == a);
  EXPECT_EQ(store_->gauges().cache.disk_bytes, a.size());
  EXPECT_EQ(ExtentBytes(), a.size());
  // b is written and never closed when the machine goes: its chunks are in the pack, unnamed.
  const InodeRecord fb = File(kRootIno, "b");
  ASSERT_TRUE(store_->Open(fb.ino).ok());
  for (size_t off = 0; off < b.size(); off += 100000) {
    const size_t n = std::min<size_t>(100000, b.size() - off);
    ASSERT_TRUE(store_->Write(fb.ino, off, b.data() + off, n).ok());
  }
  Crash(nullptr);
  EXPECT_TRUE(ReadFile(fa.ino) == a);
  EXPECT_EQ(ExtentBytes(), a.size()) << "the sweep dropped b's extents";
  auto r = store_->Fsck(kRootIno, Store::FsckOptions{.deep = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->Clean()) << r->Json();
  EXPECT_EQ(r->unreferenced_chunk_files, 0u);
  EXPECT_EQ(ChunkFiles(), 0u);
  ASSERT_TRUE(store_->Unlink(kRootIno, "a").ok());
  EXPECT_EQ(ExtentBytes(), 0u);
  Reopen();
  EXPECT_TRUE(AppendPacks().empty()) << "packs with no extent left go";
}

TEST_F(StorePacksTest, AFileIdenticalToAnotherLeavesNoPack) {
  const Bytes data = test::RandomBytes(3 << 20, 3);
  const uint64_t a = CreateStaged("a", data);
  ASSERT_TRUE(store_->EnsureSealed(a).ok());
  const auto packs = Packs();
  const uint64_t b = CreateStaged("b", data);
  ASSERT_TRUE(store_->EnsureSealed(b).ok());
  EXPECT_EQ(Packs(), packs) << "every chunk of b is a's";
  EXPECT_EQ(StagingFiles(), 0u);
  EXPECT_TRUE(ReadFile(a) == data);
  EXPECT_TRUE(ReadFile(b) == data);
  // a goes: its chunks stay, b names them.
  ASSERT_TRUE(store_->Unlink(kRootIno, "a").ok());
  EXPECT_TRUE(ReadFile(b) == data);
  // b goes too: the last extent goes, and the pack with it.
  ASSERT_TRUE(store_->Unlink(kRootIno, "b").ok());
  EXPECT_TRUE(Packs().empty());
  Reopen();
  EXPECT_TRUE(Packs().empty());
}

TEST_F(StorePacksTest, AReaderHoldingTheStagingFileAtTheSealGetsItsChunksCopied) {
  const Bytes data = test::RandomBytes(1 << 20, 4);
  // A reader opens before the writer's release queues the seal: it shares the staging file.
  uint64_t fh = 0, rfh = 0;
  int fd = -1, rfd = -1;
  auto rec = store_->CreateFile(kRootIno, "f", 0644, who_, &fh, nullptr, &fd);
  ASSERT_TRUE(rec.ok());
  const uint64_t ino = rec->ino;
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_TRUE(store_->Flush(ino, fh).ok());
  ASSERT_TRUE(store_->Open(ino, false, &rfh, nullptr, false, &rfd).ok());
  ASSERT_EQ(rfd, fd);
  ASSERT_TRUE(store_->Release(ino, fh).ok());
  ASSERT_TRUE(store_->EnsureSealed(ino).ok());
  EXPECT_TRUE(Packs().empty()) << "a file the kernel may still let a writer change is no pack";
  EXPECT_EQ(AppendPacks().size(), 2u) << "its chunks are copied into a pack of the daemon's";
  EXPECT_TRUE(ReadFile(ino) == data);
  Bytes got(data.size());
  ASSERT_EQ(::pread(rfd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == data);
  // A truncating writer beside the reader shares its staging file (the kernel wants one backing
  // file per inode), as before packs.
  uint64_t wfh = 0;
  int wfd = -1;
  ASSERT_TRUE(store_->Open(ino, true, &wfh, nullptr, true, &wfd).ok());
  ASSERT_EQ(wfd, rfd);
  const Bytes v2 = test::RandomBytes(200000, 5);
  ASSERT_EQ(::pwrite(wfd, v2.data(), v2.size(), 0), static_cast<ssize_t>(v2.size()));
  ASSERT_TRUE(store_->Flush(ino, wfh).ok());
  // The reader goes first: the writer's release queues a seal, which must find no reader.
  ASSERT_TRUE(store_->Release(ino, rfh).ok());
  ASSERT_TRUE(store_->Release(ino, wfh).ok());
  ASSERT_TRUE(store_->EnsureSealed(ino).ok());
  EXPECT_TRUE(ReadFile(ino) == v2);
  EXPECT_EQ(Packs().size(), 2u) << "sealed with no reader: a pack";
  Reopen();
  EXPECT_TRUE(ReadFile(ino) == v2);
}

TEST_F(StorePacksTest, APackLostWithTheMachineReadsAsLostChunkFilesDo) {
  const Bytes data = test::RandomBytes(2 << 20, 6);
  const uint64_t ino = CreateStaged("f", data, /*durable=*/true);
  ASSERT_TRUE(store_->EnsureSealed(ino).ok());
  ASSERT_EQ(Packs().size(), 2u);
  // The pack cut short under its index: its extents past the end are dropped at the start.
  Crash([&](const std::string& cache) {
    for (const std::string& n : test::Names(cache + "/chunks/packs")) {
      if (n.size() > 5 && n.substr(n.size() - 5) == ".pack") {
        ASSERT_EQ(::truncate((cache + "/chunks/packs/" + n).c_str(), 1 << 20), 0);
      }
    }
  });
  ASSERT_TRUE(store_->Open(ino).ok());
  std::vector<ReadSlice> out;
  EXPECT_FALSE(store_->Read(ino, 0, data.size(), &out).ok()) << "an error, never wrong bytes";
  EXPECT_TRUE(store_->Release(ino).ok());
  auto r = store_->Fsck(kRootIno, Store::FsckOptions{.deep = true});
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->local_missing, 0u);
  EXPECT_FALSE(r->Clean());
}

// fsck without --deep looks at the pack on disk, not only at the index in memory: a pack gone
// or cut short under a live store reads as missing chunk files do.
TEST_F(StorePacksTest, FsckWithoutDeepFindsAPackMissingOrShortOnDisk) {
  const Bytes a = test::RandomBytes(2 << 20, 7), b = test::RandomBytes(2 << 20, 8);
  const uint64_t fa = CreateStaged("a", a, /*durable=*/true);
  const uint64_t fb = CreateStaged("b", b, /*durable=*/true);
  ASSERT_TRUE(store_->EnsureSealed(fa).ok());
  ASSERT_TRUE(store_->EnsureSealed(fb).ok());
  ASSERT_EQ(Packs().size(), 4u);
  auto r = store_->Fsck(kRootIno, Store::FsckOptions{});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->Clean());
  std::vector<std::string> packs;
  for (const std::string& n : Packs()) {
    if (n.size() > 5 && n.substr(n.size() - 5) == ".pack") {
      packs.push_back(cfg_.cache_dir + "/chunks/packs/" + n);
    }
  }
  ASSERT_EQ(packs.size(), 2u);
  ASSERT_EQ(::unlink(packs[0].c_str()), 0);
  ASSERT_EQ(::truncate(packs[1].c_str(), 1 << 20), 0);
  r = store_->Fsck(kRootIno, Store::FsckOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->Clean());
  EXPECT_GE(r->local_missing, 2u) << "a chunk of each pack";
  bool named = false;
  for (const std::string& p : r->problems)
    named = named || p.find("is missing") != std::string::npos;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace ckptfs
