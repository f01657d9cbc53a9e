// Staged files (store/staging.h): the store's side of FUSE passthrough. The kernel's writes
// are stood for by pwrite on the descriptor the store hands out.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StoreStagedTest : public test::StoreFixture {
 protected:
  size_t StagingFiles() {
    size_t n = 0;
    if (DIR* d = ::opendir((cfg_.cache_dir + "/passthrough").c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }
  // model.pt written with v1 through a staging file and fsync'd (then closed and released unless
  // `keep_open`), and model.pt.tmp written with v2 and closed but still open (not sealed, not
  // durable) renamed over it; then the machine crashes. What model.pt reads after the crash.
  Bytes FsyncedThenReplaced(const Bytes& v1, const Bytes& v2, bool keep_open) {
    Store& store = *store_;
    uint64_t fh = 0, tfh = 0;
    int fd = -1, tfd = -1;
    auto dst = store.CreateFile(kRootIno, "model.pt", 0644, who_, &fh, nullptr, &fd);
    EXPECT_TRUE(dst.ok());
    EXPECT_EQ(::pwrite(fd, v1.data(), v1.size(), 0), static_cast<ssize_t>(v1.size()));
    EXPECT_TRUE(store.Fsync(dst->ino, fh).ok());
    if (!keep_open) {
      EXPECT_TRUE(store.Flush(dst->ino, fh).ok());
      EXPECT_TRUE(store.Release(dst->ino, fh).ok());
    }
    auto tmp = store.CreateFile(kRootIno, "model.pt.tmp", 0644, who_, &tfh, nullptr, &tfd);
    EXPECT_TRUE(tmp.ok());
    EXPECT_EQ(::pwrite(tfd, v2.data(), v2.size(), 0), static_cast<ssize_t>(v2.size()));
    EXPECT_TRUE(store.Flush(tmp->ino, tfh).ok());
    EXPECT_TRUE(store.Rename(kRootIno, "model.pt.tmp", kRootIno, "model.pt", 0).ok());
    Crash(nullptr);
    auto now = store_->Lookup(kRootIno, "model.pt");
    EXPECT_TRUE(now.ok()) << "the fsync'd file is gone: " << now.status().ToString();
    return now.ok() ? ReadFile(now->ino) : Bytes();
  }
  // create(2) in passthrough mode, the bytes written by "the kernel", close(2): flush, release.
  uint64_t CreateStaged(const std::string& name, const Bytes& data) {
    uint64_t fh = 0;
    bool keep = true;
    int fd = -1;
    auto rec = store_->CreateFile(kRootIno, name, 0644, who_, &fh, &keep, &fd);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_GE(fd, 0) << "a new file is written through a staging file";
    EXPECT_FALSE(keep) << "passthrough handles take no page cache";
    EXPECT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    EXPECT_EQ(store_->GetAttr(rec->ino)->size, data.size()) << "the size shows while written";
    EXPECT_TRUE(store_->Flush(rec->ino, fh).ok());
    EXPECT_TRUE(store_->Release(rec->ino, fh).ok());
    return rec->ino;
  }
  // Stages one file per element of `data`, each written and flushed while every one is still
  // open (no seal starts while a writer has its file open), then closes them all and seals them
  // all at once from as many threads (beside the seals the closes queued), with chunks of
  // 512 KiB-2 MiB (each put goes to disk from an aligned copy) and four puts at a time. Each seal
  // succeeds, or with !expect_ok fails for want of space.
  // The gauges once no chunk put is on its way (the seals the closes queued may still be
  // finishing when the test's own have returned); waits at most 60 s.
  Store::Gauges GaugesWhenPutsAreDone() {
    Store::Gauges g = store_->gauges();
    for (int i = 0; i < 6000 && (g.put_flights != 0 || g.put_copy_bytes != 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      g = store_->gauges();
    }
    EXPECT_EQ(g.put_flights, 0u) << "every flight ended";
    EXPECT_EQ(g.put_copy_bytes, 0u) << "every copy freed";
    return g;
  }

  std::vector<uint64_t> SealAtOnce(const std::vector<Bytes>& data, bool expect_ok = true) {
    cfg_.chunking.min_bytes = 512 << 10;
    cfg_.chunking.avg_bytes = 1 << 20;
    cfg_.chunking.max_bytes = 2 << 20;
    cfg_.write_threads = 4;
    EXPECT_TRUE(cfg_.Validate().ok());
    Reopen();
    std::vector<uint64_t> inos, fhs;
    for (size_t i = 0; i < data.size(); ++i) {
      uint64_t fh = 0;
      int fd = -1;
      auto rec = store_->CreateFile(kRootIno, "f" + std::to_string(i), 0644, who_, &fh, nullptr,
                                    &fd);
      EXPECT_TRUE(rec.ok()) << rec.status().ToString();
      if (!rec.ok()) return {};
      EXPECT_GE(fd, 0);
      EXPECT_EQ(::pwrite(fd, data[i].data(), data[i].size(), 0),
                static_cast<ssize_t>(data[i].size()));
      EXPECT_TRUE(store_->Flush(rec->ino, fh).ok());
      inos.push_back(rec->ino);
      fhs.push_back(fh);
    }
    for (size_t i = 0; i < inos.size(); ++i) EXPECT_TRUE(store_->Release(inos[i], fhs[i]).ok());
    std::vector<std::thread> sealers;
    for (uint64_t ino : inos) {
      sealers.emplace_back([this, ino, expect_ok] {
        Status st = store_->EnsureSealed(ino);
        if (expect_ok) {
          EXPECT_TRUE(st.ok()) << st.ToString();
        } else {
          EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
        }
      });
    }
    for (auto& t : sealers) t.join();
    EXPECT_EQ(store_->SealAll().ok(), expect_ok);
    return inos;
  }
};

TEST_F(StoreStagedTest, CloseCommitsTheStagingFileAndTheSealCutsItIntoSharedChunks) {
  const Bytes data = test::RandomBytes(3 << 20, 1);
  InodeRecord classic = File(kRootIno, "classic");
  WriteFile(classic.ino, data);
  const size_t chunks = ChunkFiles();

  const uint64_t ino = CreateStaged("staged", data);
  EXPECT_EQ(store_->GetAttr(ino)->size, data.size()) << "committed at close";
  ASSERT_TRUE(store_->EnsureSealed(ino).ok());
  auto rec = store_->GetAttr(ino);
  EXPECT_EQ(rec->size, data.size());
  EXPECT_GT(rec->generation, 0u);
  EXPECT_EQ(ChunkFiles(), chunks) << "the staged bytes dedup against the classic file's";
  EXPECT_EQ(StagingFiles(), 0u) << "a sealed staging file nobody reads is removed";
  EXPECT_TRUE(ReadFile(ino) == data);
  auto m = store_->CommittedManifest(ino);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->size(), data.size());

  Reopen();
  EXPECT_TRUE(ReadFile(ino) == data);
}

TEST_F(StoreStagedTest, AReaderBetweenACloseAndItsReleaseSeesTheClosedBytes) {
  // The kernel sends RELEASE after close(2) has returned: a reader (a view, a computed attribute)
  // may ask for the committed manifest in between. It must get what the close committed.
  const Bytes data = test::RandomBytes(1 << 20, 7);
  uint64_t fh = 0;
  bool keep = true;
  int fd = -1;
  auto rec = store_->CreateFile(kRootIno, "late-release", 0644, who_, &fh, &keep, &fd);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_TRUE(store_->Flush(rec->ino, fh).ok());
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(store_->Release(rec->ino, fh).ok());
  });
  auto m = store_->CommittedManifest(rec->ino);
  release.join();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->size(), data.size()) << "the reader got the version before the close";
  EXPECT_TRUE(ReadFile(rec->ino) == data);

  // A writer that has not closed is still writing: the reader gets the last committed version
  // (here the bytes above), not a file cut while it changes.
  uint64_t fh2 = 0;
  int fd2 = -1;
  ASSERT_TRUE(store_->Open(rec->ino, true, &fh2, nullptr, true, &fd2).ok());
  ASSERT_GE(fd2, 0);
  const Bytes more = test::RandomBytes(4096, 8);
  ASSERT_EQ(::pwrite(fd2, more.data(), more.size(), 0), static_cast<ssize_t>(more.size()));
  auto during = store_->CommittedManifest(rec->ino);
  ASSERT_TRUE(during.ok());
  EXPECT_EQ((*during)->size(), data.size());
  ASSERT_TRUE(store_->Flush(rec->ino, fh2).ok());
  ASSERT_TRUE(store_->Release(rec->ino, fh2).ok());
  ASSERT_TRUE(store_->EnsureSealed(rec->ino).ok());
  EXPECT_TRUE(ReadFile(rec->ino) == more);
}

TEST_F(StoreStagedTest, ReadersShareTheStagingFileAndAWriterOfCommittedBytesTakesTheDaemonsPath) {
  const Bytes data = test::RandomBytes(1 << 20, 2);
  const uint64_t ino = CreateStaged("f", data);
  // Another passthrough open while the bytes are staged reads the same staging file.
  uint64_t fh = 0;
  int fd = -1;
  ASSERT_TRUE(store_->Open(ino, false, &fh, nullptr, false, &fd).ok());
  ASSERT_GE(fd, 0);
  Bytes got(data.size());
  ASSERT_EQ(::pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == data);
  ASSERT_TRUE(store_->Release(ino, fh).ok());
  // A writer that does not truncate must not change staged bytes in place: they are sealed
  // first and the handle goes through the daemon.
  int wfd = -2;
  ASSERT_TRUE(store_->Open(ino, false, &fh, nullptr, true, &wfd).ok());
  EXPECT_EQ(wfd, -1);
  const uint8_t patch[4] = {1, 2, 3, 4};
  ASSERT_TRUE(store_->Write(ino, 10, patch, 4, fh).ok());
  ASSERT_TRUE(store_->Flush(ino, fh).ok());
  ASSERT_TRUE(store_->Release(ino, fh).ok());
  Bytes want = data;
  std::copy(patch, patch + 4, want.begin() + 10);
  EXPECT_TRUE(ReadFile(ino) == want);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, ATruncatingWriterGetsANewStagingFileAndTheOldVersionStandsUntilItsClose) {
  const Bytes v1 = test::RandomBytes(1 << 20, 3);
  const uint64_t ino = CreateStaged("f", v1);
  uint64_t fh = 0;
  int fd = -1;
  ASSERT_TRUE(store_->Open(ino, true, &fh, nullptr, true, &fd).ok());
  ASSERT_GE(fd, 0);
  const Bytes v2 = test::RandomBytes(300000, 4);
  ASSERT_EQ(::pwrite(fd, v2.data(), v2.size(), 0), static_cast<ssize_t>(v2.size()));
  // Not closed yet: what is committed is still v1 (a seal now cuts v1).
  auto m = store_->CommittedManifest(ino);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)->size(), v1.size());
  ASSERT_TRUE(store_->Flush(ino, fh).ok());
  ASSERT_TRUE(store_->Release(ino, fh).ok());
  EXPECT_TRUE(ReadFile(ino) == v2);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, TruncateAndTimesOfALiveStagingFile) {
  uint64_t fh = 0;
  bool keep = true;
  int fd = -1;
  auto rec = store_->CreateFile(kRootIno, "f", 0644, who_, &fh, &keep, &fd);
  ASSERT_TRUE(rec.ok());
  const Bytes data = test::RandomBytes(500000, 5);
  ASSERT_EQ(::pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  SetAttrRequest r;
  r.size = 1000;
  auto done = store_->SetAttr(rec->ino, r, fh);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(done->size, 1000u);
  SetAttrRequest t;
  t.mtime_ns = 1'234'000'000'567;
  ASSERT_TRUE(store_->SetAttr(rec->ino, t, fh).ok());
  ASSERT_TRUE(store_->Flush(rec->ino, fh).ok());
  ASSERT_TRUE(store_->Release(rec->ino, fh).ok());
  ASSERT_TRUE(store_->EnsureSealed(rec->ino).ok());
  auto after = store_->GetAttr(rec->ino);
  EXPECT_EQ(after->size, 1000u);
  EXPECT_EQ(after->mtime_ns, 1'234'000'000'567);
  EXPECT_TRUE(ReadFile(rec->ino) == Bytes(data.begin(), data.begin() + 1000));
}

TEST_F(StoreStagedTest, ConcurrentSealsOfIdenticalFilesWriteEachChunkOnce) {
  const Bytes data = test::RandomBytes(32 << 20, 10);
  const std::vector<uint64_t> inos = SealAtOnce(std::vector<Bytes>(8, data));
  auto m = store_->CommittedManifest(inos[0]);
  ASSERT_TRUE(m.ok());
  const size_t chunks = (*m)->extents().size();
  ASSERT_GE(chunks, 16u);
  EXPECT_EQ(ChunkFiles(), chunks) << "random bytes: no chunk repeats within the file";
  // Each chunk reached the disk once: every other put of it found it there or joined its put.
  EXPECT_EQ(store_->metrics().chunk_dedup_hits.Get(), (inos.size() - 1) * chunks);
  GaugesWhenPutsAreDone();
  for (uint64_t ino : inos) EXPECT_TRUE(ReadFile(ino) == data);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, ConcurrentSealsKeepTheirChunkCopiesWithinTheDaemonsLimit) {
  std::vector<Bytes> files;
  for (int i = 0; i < 8; ++i) files.push_back(test::RandomBytes(32 << 20, 20 + i));
  const std::vector<uint64_t> inos = SealAtOnce(files);
  Store::Gauges g = GaugesWhenPutsAreDone();
  EXPECT_GT(g.put_copy_peak, 0u);
  EXPECT_LE(g.put_copy_peak, Store::kPutCopyLimit) << "eight files' windows would be 128 MiB";
  for (size_t i = 0; i < inos.size(); ++i) EXPECT_TRUE(ReadFile(inos[i]) == files[i]);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, ConcurrentSealsOfIdenticalFilesOnAFailingDiskFailAndResumeLater) {
  // The chunk writes fail after the first 8 MiB: a put that others joined fails them all.
  cfg_.cache_faults = "ops=write,error=enospc,after=8M";
  const Bytes data = test::RandomBytes(32 << 20, 11);
  const std::vector<uint64_t> inos = SealAtOnce(std::vector<Bytes>(6, data), /*expect_ok=*/false);
  GaugesWhenPutsAreDone();
  for (uint64_t ino : inos) {
    EXPECT_EQ(store_->GetAttr(ino)->size, data.size());
    // A reader gets the staging file (as passthrough does).
    uint64_t fh = 0;
    int fd = -1;
    ASSERT_TRUE(store_->Open(ino, false, &fh, nullptr, false, &fd).ok());
    ASSERT_GE(fd, 0);
    Bytes got(data.size());
    EXPECT_EQ(::pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
    EXPECT_TRUE(got == data) << "an unsealed file's bytes are in its staging file";
    EXPECT_TRUE(store_->Release(ino, fh).ok());
  }
  EXPECT_EQ(StagingFiles(), inos.size());
  // A healthy disk again: the next start seals them.
  cfg_.cache_faults.clear();
  Reopen();
  ASSERT_TRUE(store_->SealAll().ok());
  for (uint64_t ino : inos) EXPECT_TRUE(ReadFile(ino) == data);
  EXPECT_EQ(StagingFiles(), 0u);
  auto m = store_->CommittedManifest(inos[0]);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(ChunkFiles(), (*m)->extents().size());
}

TEST_F(StoreStagedTest, AStagedFileUnlinkedBeforeItsSealLeavesNothing) {
  const uint64_t ino = CreateStaged("f", test::RandomBytes(1 << 20, 6));
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  ASSERT_TRUE(store_->SealAll().ok());
  Reopen();
  EXPECT_FALSE(store_->GetAttr(ino).ok());
  EXPECT_EQ(StagingFiles(), 0u);
  EXPECT_EQ(ChunkFiles(), 0u);
}

TEST_F(StoreStagedTest, AStagedRecordFromAnotherBootSurvivesOnlyIfFsynced) {
  // Two files staged and not sealed: one closed, one fsync'd, both still open for writing (no
  // seal runs). The machine then stops.
  const Bytes old = test::RandomBytes(400000, 7);
  InodeRecord kept = DurableFile(kRootIno, "kept", old);
  uint64_t fh1 = 0, fh2 = 0;
  int fd1 = -1, fd2 = -1;
  ASSERT_TRUE(store_->Open(kept.ino, true, &fh1, nullptr, true, &fd1).ok());
  auto synced = store_->CreateFile(kRootIno, "synced", 0644, who_, &fh2, nullptr, &fd2);
  ASSERT_TRUE(synced.ok());
  const Bytes a = test::RandomBytes(300000, 8), b = test::RandomBytes(200000, 9);
  ASSERT_EQ(::pwrite(fd1, a.data(), a.size(), 0), static_cast<ssize_t>(a.size()));
  ASSERT_EQ(::pwrite(fd2, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
  ASSERT_TRUE(store_->Flush(kept.ino, fh1).ok());
  ASSERT_TRUE(store_->Fsync(synced->ino, fh2).ok());
  Crash(nullptr);
  // The closed one's bytes may not have reached the disk in another boot: its previous
  // version stands. The fsync'd one is there.
  EXPECT_TRUE(ReadFile(kept.ino) == old);
  EXPECT_TRUE(ReadFile(synced->ino) == b);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, ACreateWhoseOpenFailsLeavesNoEntry) {
  // The staging file cannot be made (its directory is gone): create(2) fails, and no file is
  // left to be swept at the next mount.
  const std::string staging = cfg_.cache_dir + "/passthrough";
  ASSERT_EQ(::rmdir(staging.c_str()), 0);
  uint64_t fh = 0;
  int fd = -1;
  auto made = store_->CreateFile(kRootIno, "new.pt", 0644, who_, &fh, nullptr, &fd);
  EXPECT_FALSE(made.ok());
  EXPECT_EQ(store_->Lookup(kRootIno, "new.pt").status().code(), Code::kNotFound);
  EXPECT_EQ(List(kRootIno), (std::vector<std::string>{".", ".."}));
  ASSERT_EQ(::mkdir(staging.c_str(), 0700), 0);
  // The name is free again, and nothing is left for the next mount to sweep.
  EXPECT_TRUE(store_->CreateFile(kRootIno, "new.pt", 0644, who_, &fh, nullptr, &fd).ok());
  EXPECT_TRUE(store_->Release(store_->Lookup(kRootIno, "new.pt")->ino, fh).ok());
}

TEST_F(StoreStagedTest, StagedBytesOutliveARebootAfterACleanStop) {
  // A clean stop syncs every staging file: bytes closed without fsync and not yet sealed are
  // there after a reboot, and sealed then.
  InodeRecord f = File(kRootIno, "f");
  WriteFile(f.ino, test::RandomBytes(400000, 10));
  uint64_t fh = 0;
  int fd = -1;
  ASSERT_TRUE(store_->Open(f.ino, true, &fh, nullptr, true, &fd).ok());
  const Bytes now = test::RandomBytes(300000, 11);
  ASSERT_EQ(::pwrite(fd, now.data(), now.size(), 0), static_cast<ssize_t>(now.size()));
  ASSERT_TRUE(store_->Flush(f.ino, fh).ok());
  ::setenv("CKPTFS_BOOT_ID", "after-a-reboot", 1);
  Reopen();
  ::unsetenv("CKPTFS_BOOT_ID");
  ASSERT_TRUE(store_->SealAll().ok());
  EXPECT_TRUE(ReadFile(f.ino) == now);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, AStagedFileRenamedOverAnotherFallsBackToItAfterAMachineCrash) {
  // torch.save to a temporary name, then rename over the checkpoint: the staged bytes never
  // reached the disk, and the checkpoint reads as it was, not empty or absent.
  const Bytes v1 = test::RandomBytes(500000, 12);
  DurableFile(kRootIno, "model.pt", v1);
  uint64_t fh = 0;
  int fd = -1;
  auto tmp = store_->CreateFile(kRootIno, "model.pt.tmp", 0644, who_, &fh, nullptr, &fd);
  ASSERT_TRUE(tmp.ok());
  const Bytes v2 = test::RandomBytes(400000, 13);
  ASSERT_EQ(::pwrite(fd, v2.data(), v2.size(), 0), static_cast<ssize_t>(v2.size()));
  ASSERT_TRUE(store_->Flush(tmp->ino, fh).ok());  // still open: not sealed
  ASSERT_TRUE(store_->Rename(kRootIno, "model.pt.tmp", kRootIno, "model.pt", 0).ok());
  EXPECT_EQ(store_->gauges().fallback_files, 1u);
  Crash(nullptr);
  auto now = store_->Lookup(kRootIno, "model.pt");
  ASSERT_TRUE(now.ok());
  EXPECT_TRUE(ReadFile(now->ino) == v1);
  EXPECT_EQ(store_->gauges().fallback_files, 0u);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, AFileFsyncedInPassthroughKeepsThoseBytesWhenReplacedByRename) {
  // Written and fsync'd through a staging file and closed, then replaced by a rename before its
  // seal may have run; the replacing bytes never reach the disk. The name reads the fsync'd
  // bytes after the machine crash: not absent (the file had no sealed version) nor older.
  const Bytes v1 = test::RandomBytes(500000, 16), v2 = test::RandomBytes(400000, 17);
  EXPECT_TRUE(FsyncedThenReplaced(v1, v2, /*keep_open=*/false) == v1);
  EXPECT_EQ(StagingFiles(), 0u);
}

TEST_F(StoreStagedTest, AFileFsyncedAndStillOpenForWritingKeepsThoseBytesWhenReplacedByRename) {
  // As above, but its writer has not closed it when the rename replaces it, so it cannot be
  // sealed first. After the machine crash the name reads the fsync'd bytes or the renamed
  // file's, never nothing.
  const Bytes v1 = test::RandomBytes(500000, 18), v2 = test::RandomBytes(400000, 19);
  const Bytes got = FsyncedThenReplaced(v1, v2, /*keep_open=*/true);
  EXPECT_TRUE(got == v1 || got == v2) << "neither version: " << got.size() << " bytes";
}

TEST_F(StoreStagedTest, AStagedFileRenamedOverAnotherIsKeptOnceSealedAndSettled) {
  const Bytes v1 = test::RandomBytes(500000, 14), v2 = test::RandomBytes(400000, 15);
  DurableFile(kRootIno, "model.pt", v1);
  const uint64_t tmp = CreateStaged("model.pt.tmp", v2);
  ASSERT_TRUE(store_->Rename(kRootIno, "model.pt.tmp", kRootIno, "model.pt", 0).ok());
  ASSERT_TRUE(store_->SealAll().ok());
  ASSERT_TRUE(store_->Settle().ok());
  EXPECT_EQ(store_->gauges().fallback_files, 0u);
  Crash(nullptr);
  EXPECT_TRUE(ReadFile(tmp) == v2);
}

}  // namespace
}  // namespace ckptfs
