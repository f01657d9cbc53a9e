// Fallbacks: after a machine crash a file reads whole as a version it had, the newest whose
// chunks reached the disk or the durable one before it, never EIO. A crash is shown as a unit
// test can show it: the cache directory is copied while the store is open (what the disk holds
// if everything written so far had reached it), the chunk files of versions never synced are
// then taken from the copy (what a power loss takes), and the copy opens in another boot.
#include <fcntl.h>
#include <unistd.h>

#include <functional>
#include <set>

#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StoreFallbackTest : public test::StoreFixture {
 protected:
  void SetUp() override {
    cfg_.settle_interval_s = 0;  // settled only where a test says so
    StoreFixture::SetUp();
  }

  std::vector<ChunkId> ChunksOf(uint64_t ino) {
    auto m = store_->CommittedManifest(ino);
    EXPECT_TRUE(m.ok());
    std::vector<ChunkId> ids;
    if (m.ok()) {
      for (const Extent& e : (*m)->extents()) {
        if (!e.hole()) ids.push_back(e.id);
      }
    }
    return ids;
  }

  std::string ChunkPath(const std::string& cache, const ChunkId& id) {
    const std::string hex = id.Hex();
    return cache + "/chunks/" + hex.substr(0, 2) + "/" + hex;
  }

  // Takes these chunks' files from the crashed disk (never reached it), or truncates them (torn).
  std::function<void(const std::string&)> Lose(const std::vector<ChunkId>& ids, bool torn = false) {
    return [this, ids, torn](const std::string& cache) {
      for (const ChunkId& id : ids) {
        const std::string p = ChunkPath(cache, id);
        if (torn) {
          ASSERT_EQ(::truncate(p.c_str(), 4096), 0) << p;
        } else {
          ::unlink(p.c_str());
        }
      }
    };
  }

  static std::vector<ChunkId> Minus(const std::vector<ChunkId>& a, const std::vector<ChunkId>& b) {
    std::set<ChunkId> drop(b.begin(), b.end());
    std::vector<ChunkId> out;
    for (const ChunkId& id : a) {
      if (!drop.count(id)) out.push_back(id);
    }
    return out;
  }

  size_t Fallbacks() { return store_->gauges().fallback_files; }

  void ExpectCleanFsck() {
    auto r = store_->Fsck(kRootIno, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->refcount_errors, 0u) << r->Json();
    EXPECT_TRUE(r->Clean()) << r->Json();
  }
};

TEST_F(StoreFallbackTest, AnOverwriteWhoseChunksWereLostReadsAsTheFsyncedVersion) {
  const Bytes v1 = test::RandomBytes(600000, 1), v2 = test::RandomBytes(500000, 2);
  InodeRecord f = DurableFile(kRootIno, "latest", v1);
  const auto c1 = ChunksOf(f.ino);
  WriteFile(f.ino, v2);  // closed, not fsync'd
  EXPECT_EQ(Fallbacks(), 1u);
  ExpectCleanFsck();  // the fallback's references are counted
  Crash(Lose(Minus(ChunksOf(f.ino), c1)));
  EXPECT_TRUE(ReadFile(f.ino) == v1);
  EXPECT_EQ(store_->GetAttr(f.ino)->size, v1.size());
  EXPECT_EQ(Fallbacks(), 0u);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, ATornChunkFallsBackToo) {
  const Bytes v1 = test::RandomBytes(600000, 3), v2 = test::RandomBytes(600000, 4);
  InodeRecord f = DurableFile(kRootIno, "f", v1);
  const auto c1 = ChunksOf(f.ino);
  WriteFile(f.ino, v2);
  Crash(Lose(Minus(ChunksOf(f.ino), c1), /*torn=*/true));
  EXPECT_TRUE(ReadFile(f.ino) == v1);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, ANewestVersionThatReachedTheDiskIsKept) {
  const Bytes v1 = test::RandomBytes(300000, 5), v2 = test::RandomBytes(300000, 6);
  InodeRecord f = DurableFile(kRootIno, "f", v1);
  WriteFile(f.ino, v2);
  Crash(nullptr);  // every chunk made it
  EXPECT_TRUE(ReadFile(f.ino) == v2);
  EXPECT_EQ(Fallbacks(), 0u);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, TheFallbackIsTheLastDurableVersionNotTheLastClosed) {
  const Bytes v1 = test::RandomBytes(300000, 7), v2 = test::RandomBytes(300000, 8),
              v3 = test::RandomBytes(300000, 9);
  InodeRecord f = DurableFile(kRootIno, "f", v1);
  const auto c1 = ChunksOf(f.ino);
  WriteFile(f.ino, v2);
  const auto c2 = ChunksOf(f.ino);
  WriteFile(f.ino, v3);
  auto lost = ChunksOf(f.ino);
  lost.insert(lost.end(), c2.begin(), c2.end());
  EXPECT_EQ(Fallbacks(), 1u);
  // v2 was never durable: its chunks may be gone as well as v3's.
  Crash(Lose(Minus(lost, c1)));
  EXPECT_TRUE(ReadFile(f.ino) == v1);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, SettleMakesTheNewestDurableAndFreesTheFallback) {
  const Bytes v1 = test::RandomBytes(600000, 10), v2 = test::RandomBytes(600000, 11);
  InodeRecord f = DurableFile(kRootIno, "f", v1);
  const auto c1 = ChunksOf(f.ino);
  WriteFile(f.ino, v2);
  const auto c2 = ChunksOf(f.ino);
  EXPECT_EQ(ChunkFiles(), Minus(c1, c2).size() + c2.size());  // v1's kept for the fallback
  ASSERT_TRUE(store_->Settle().ok());
  EXPECT_EQ(Fallbacks(), 0u);
  EXPECT_EQ(ChunkFiles(), c2.size());  // v1's chunks reclaimed
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, FsyncAfterCloseEndsTheFallback) {
  InodeRecord f = DurableFile(kRootIno, "f", test::RandomBytes(300000, 12));
  WriteFile(f.ino, test::RandomBytes(300000, 13));
  EXPECT_EQ(Fallbacks(), 1u);
  ASSERT_TRUE(store_->Open(f.ino).ok());
  ASSERT_TRUE(store_->Fsync(f.ino).ok());
  ASSERT_TRUE(store_->Release(f.ino).ok());
  EXPECT_EQ(Fallbacks(), 0u);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, ANewFileWhoseBytesWereLostIsRemovedNotUnreadable) {
  InodeRecord f = File(kRootIno, "new");
  WriteFile(f.ino, test::RandomBytes(300000, 14));
  const auto c = ChunksOf(f.ino);
  Crash(Lose(c));
  EXPECT_FALSE(store_->Lookup(kRootIno, "new").ok());
  EXPECT_EQ(Fallbacks(), 0u);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, AReplaceByRenameFallsBackToTheReplacedFile) {
  const Bytes v1 = test::RandomBytes(600000, 15), v2 = test::RandomBytes(600000, 16);
  InodeRecord dst = DurableFile(kRootIno, "model.pt", v1);
  const auto c1 = ChunksOf(dst.ino);
  InodeRecord tmp = File(kRootIno, "model.pt.tmp");
  WriteFile(tmp.ino, v2);
  ASSERT_TRUE(store_->Rename(kRootIno, "model.pt.tmp", kRootIno, "model.pt", 0).ok());
  EXPECT_FALSE(store_->GetAttr(dst.ino).ok());  // the replaced inode is gone...
  ExpectCleanFsck();                             // ...its chunks held by the fallback
  Crash(Lose(Minus(ChunksOf(tmp.ino), c1)));
  auto now = store_->Lookup(kRootIno, "model.pt");
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(ReadFile(now->ino) == v1);
  EXPECT_FALSE(store_->Lookup(kRootIno, "model.pt.tmp").ok());
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, AReplaceByRenameOfADurableFileKeepsNoFallback) {
  DurableFile(kRootIno, "a", test::RandomBytes(300000, 17));
  InodeRecord src = File(kRootIno, "b");
  const Bytes v2 = test::RandomBytes(300000, 18);
  WriteFile(src.ino, v2);
  ASSERT_TRUE(store_->Fsync(src.ino).ok());
  ASSERT_TRUE(store_->Rename(kRootIno, "b", kRootIno, "a", 0).ok());
  EXPECT_EQ(Fallbacks(), 0u);
  EXPECT_EQ(ChunkFiles(), ChunksOf(src.ino).size());  // the replaced bytes are freed at once
}

TEST_F(StoreFallbackTest, ADaemonCrashKeepsTheNewestVersionAndItsFallbackUntilSettled) {
  const Bytes v1 = test::RandomBytes(300000, 19), v2 = test::RandomBytes(300000, 20);
  InodeRecord f = DurableFile(kRootIno, "f", v1);
  WriteFile(f.ino, v2);
  Crash(nullptr, CurrentBootId());  // the page cache kept everything
  EXPECT_TRUE(ReadFile(f.ino) == v2);
  EXPECT_EQ(Fallbacks(), 1u);
  ASSERT_TRUE(store_->Settle().ok());
  EXPECT_EQ(Fallbacks(), 0u);
  ExpectCleanFsck();
}

TEST_F(StoreFallbackTest, ACleanStopEndsEveryFallback) {
  InodeRecord f = DurableFile(kRootIno, "f", test::RandomBytes(300000, 21));
  const Bytes v2 = test::RandomBytes(300000, 22);
  WriteFile(f.ino, v2);
  ::setenv("CKPTFS_BOOT_ID", "after-a-reboot", 1);
  Reopen();
  ::unsetenv("CKPTFS_BOOT_ID");
  EXPECT_TRUE(ReadFile(f.ino) == v2);
  EXPECT_EQ(Fallbacks(), 0u);
  EXPECT_EQ(ChunkFiles(), ChunksOf(f.ino).size());
}

TEST_F(StoreFallbackTest, UnlinkDropsTheFallbackAndItsChunks) {
  InodeRecord f = DurableFile(kRootIno, "f", test::RandomBytes(300000, 23));
  WriteFile(f.ino, test::RandomBytes(300000, 24));
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  EXPECT_EQ(Fallbacks(), 0u);
  EXPECT_EQ(ChunkFiles(), 0u);
}

}  // namespace
}  // namespace ckptfs
