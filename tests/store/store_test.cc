// Opening, recovery and chunk bookkeeping (store/store.cc).
#include "store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StoreTest : public test::StoreFixture {};

TEST_F(StoreTest, UnlinkedOpenFileIsReclaimedAtTheNextStart) {
  InodeRecord keep = File(kRootIno, "keep");
  const Bytes kept = test::RandomBytes(400000, 7);
  WriteFile(keep.ino, kept);
  const size_t kept_chunks = ChunkFiles();
  InodeRecord f = File(kRootIno, "f");
  WriteFile(f.ino, test::RandomBytes(500000, 6));
  ASSERT_GT(ChunkFiles(), kept_chunks);
  ASSERT_TRUE(store_->Open(f.ino).ok());
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  Reopen();  // the daemon stops with the file still open
  EXPECT_EQ(store_->GetAttr(f.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(ChunkFiles(), kept_chunks);
  EXPECT_TRUE(ReadFile(keep.ino) == kept);
}

TEST_F(StoreTest, ATrackerCommittedAtCloseUnderARetainAttributeStopsCleanly) {
  // The daemon stops while `latest` is open and written in a run directory that carries
  // user.ckptfs.retain: Close commits it after the retention thread is gone.
  auto run = store_->MakeNode(kRootIno, "run", S_IFDIR | 0755, 0, Caller{});
  ASSERT_TRUE(run.ok());
  ASSERT_TRUE(store_->SetXattr(run->ino, "user.ckptfs.retain", "keep_last=1", 0).ok());
  EXPECT_EQ(store_->SetXattr(run->ino, "user.ckptfs.retain", "keep_last=0", 0).code(),
            Code::kInvalid);
  for (const char* step : {"global_step1", "global_step2"}) {
    ASSERT_TRUE(store_->MakeNode(run->ino, step, S_IFDIR | 0755, 0, Caller{}).ok());
  }
  InodeRecord latest = File(run->ino, "latest");
  ASSERT_TRUE(store_->Open(latest.ino, true).ok());
  const std::string tag = "global_step2";
  ASSERT_TRUE(store_->Write(latest.ino, 0, reinterpret_cast<const uint8_t*>(tag.data()), tag.size()).ok());
  Reopen();  // Close commits `latest` with the file still open
  EXPECT_TRUE(store_->Lookup(run->ino, "latest").ok());
  EXPECT_TRUE(store_->Lookup(run->ino, "global_step2").ok());
}

TEST_F(StoreTest, UncleanStopRemovesUnreferencedChunks) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes data = test::RandomBytes(500000, 8);
  WriteFile(f.ino, data);
  const size_t chunks = ChunkFiles();
  store_.reset();
  // A chunk written for a commit that never happened, and no clean-stop marker.
  const Bytes stray = test::RandomBytes(1000, 9);
  const ChunkId id = ChunkId::Of(stray.data(), stray.size());
  const std::string path = cfg_.cache_dir + "/chunks/" + id.Hex().substr(0, 2) + "/" + id.Hex();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, stray.data(), stray.size()), ssize_t(stray.size()));
  ::close(fd);
  ASSERT_EQ(::unlink((cfg_.cache_dir + "/clean").c_str()), 0);
  Reopen();
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the unreferenced chunk survived recovery";
  EXPECT_EQ(ChunkFiles(), chunks);
  EXPECT_TRUE(ReadFile(f.ino) == data);
}

TEST_F(StoreTest, IdenticalFilesShareChunks) {
  const Bytes data = test::RandomBytes(1 << 20, 10);
  InodeRecord a = File(kRootIno, "a");
  WriteFile(a.ino, data);
  const size_t one = ChunkFiles();
  ASSERT_GT(one, 3u);
  InodeRecord b = File(kRootIno, "b");
  WriteFile(b.ino, data);
  EXPECT_EQ(ChunkFiles(), one);
  EXPECT_GE(store_->metrics().chunk_dedup_hits.Get(), one);
  ASSERT_TRUE(store_->Unlink(kRootIno, "a").ok());
  EXPECT_EQ(ChunkFiles(), one) << "b still references every chunk";
  EXPECT_TRUE(ReadFile(b.ino) == data);
  ASSERT_TRUE(store_->Unlink(kRootIno, "b").ok());
  EXPECT_EQ(ChunkFiles(), 0u);
}

// The cache directory on a small tmpfs: a file too big for it fails with kNoSpace at its next
// write or at close, keeps its previous bytes, and leaves no chunk of the failed write behind.
TEST_F(StoreTest, NoSpaceFailsTheFileAndKeepsItsCommittedBytes) {
  store_.reset();
  cfg_.cache_dir = dir_.Sub("small");
  ASSERT_EQ(::mkdir(cfg_.cache_dir.c_str(), 0700), 0);
  if (::mount("tmpfs", cfg_.cache_dir.c_str(), "tmpfs", 0, "size=6m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << "); needs root";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{cfg_.cache_dir};
  Reopen();
  InodeRecord a = File(kRootIno, "a");
  const Bytes da = test::RandomBytes(1 << 20, 23);
  WriteFile(a.ino, da);
  const size_t a_chunks = ChunkFiles();

  InodeRecord b = File(kRootIno, "b");
  const Bytes db = test::RandomBytes(300000, 24);
  WriteFile(b.ino, db);
  const size_t before = ChunkFiles();
  const Bytes big = test::RandomBytes(16 << 20, 25);
  // Appending streams chunks onto the tier; rewriting from 0 fills a staging file instead.
  for (uint64_t start : {uint64_t{db.size()}, uint64_t{0}}) {
    SCOPED_TRACE(start ? "append" : "rewrite");
    ASSERT_TRUE(store_->Open(b.ino).ok());
    Status st;
    for (size_t off = 0; off < big.size() && st.ok(); off += 1 << 20) {
      st = store_->Write(b.ino, start + off, big.data() + off, 1 << 20);
    }
    if (st.ok()) st = store_->Flush(b.ino);
    ASSERT_FALSE(st.ok()) << "16 MiB fit in a 6 MiB cache directory";
    EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
    (void)store_->Release(b.ino);
    EXPECT_EQ(store_->GetAttr(b.ino)->size, db.size());
    EXPECT_TRUE(ReadFile(b.ino) == db);
    EXPECT_TRUE(ReadFile(a.ino) == da);
    EXPECT_EQ(ChunkFiles(), before) << "chunks of the failed write were left behind";
    EXPECT_EQ(Entries(cfg_.cache_dir + "/staging"), 0u);
    EXPECT_EQ(Entries(cfg_.cache_dir + "/chunks/tmp"), 0u);
  }
  // Space freed: writing works again.
  ASSERT_TRUE(store_->Unlink(kRootIno, "b").ok());
  EXPECT_EQ(ChunkFiles(), a_chunks);
  InodeRecord c = File(kRootIno, "c");
  WriteFile(c.ino, db);
  EXPECT_TRUE(ReadFile(c.ino) == db);
  store_.reset();  // before the unmount
}

TEST_F(StoreTest, SecondOpenOfTheCacheDirIsBusy) {
  auto second = Store::Open(cfg_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kBusy);
  // The failed attempt took nothing away from the first store.
  InodeRecord f = File(kRootIno, "f");
  WriteFile(f.ino, test::RandomBytes(1000, 15));
  store_.reset();
  auto third = Store::Open(cfg_);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
}

}  // namespace
}  // namespace ckptfs
