// File bytes: open, write, read, flush, truncate (store/file_sessions.cc).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "store/store.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StoreFilesTest : public test::StoreFixture {};

TEST_F(StoreFilesTest, WriteReadFlushAndReopen) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes data = test::RandomBytes(3 << 20, 1);
  ASSERT_TRUE(store_->Open(f.ino).ok());
  ASSERT_TRUE(store_->Write(f.ino, 0, data.data(), data.size()).ok());
  EXPECT_EQ(store_->GetAttr(f.ino)->size, data.size()) << "size is visible before the commit";
  EXPECT_TRUE(ReadOpen(f.ino) == data) << "reads see uncommitted bytes";
  ASSERT_TRUE(store_->Flush(f.ino).ok());
  EXPECT_TRUE(ReadOpen(f.ino) == data);
  EXPECT_TRUE(ReadOpen(f.ino, 1000, 5000) == Bytes(data.begin() + 1000, data.begin() + 6000));
  EXPECT_TRUE(ReadOpen(f.ino, data.size() - 10, 100) == Bytes(data.end() - 10, data.end()));
  EXPECT_TRUE(ReadOpen(f.ino, data.size() + 10, 100).empty());
  ASSERT_TRUE(store_->Release(f.ino).ok());
  const uint64_t gen = store_->GetAttr(f.ino)->generation;
  EXPECT_GT(gen, 0u);
  EXPECT_GT(ChunkFiles(), 10u);

  Reopen();
  auto l = store_->Lookup(kRootIno, "f");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->ino, f.ino);
  EXPECT_EQ(l->size, data.size());
  EXPECT_EQ(l->generation, gen);
  EXPECT_TRUE(ReadFile(f.ino) == data);
}

TEST_F(StoreFilesTest, OverwriteReclaimsTheOldChunks) {
  InodeRecord f = File(kRootIno, "f");
  WriteFile(f.ino, test::RandomBytes(1 << 20, 2));
  const Bytes second = test::RandomBytes(600000, 3);
  WriteFile(f.ino, second);  // rewrites from offset 0: a staging rewrite of the whole file
  EXPECT_EQ(store_->GetAttr(f.ino)->size, 1u << 20);
  Bytes want = second;
  Bytes old = test::RandomBytes(1 << 20, 2);
  want.insert(want.end(), old.begin() + second.size(), old.end());
  EXPECT_TRUE(ReadFile(f.ino) == want);
  // Only the chunks of the current bytes are left on disk: a fresh file with the same bytes adds
  // none, and once both are gone nothing is left.
  InodeRecord fresh = File(kRootIno, "fresh");
  const size_t before = ChunkFiles();
  WriteFile(fresh.ino, want);
  EXPECT_EQ(ChunkFiles(), before) << "identical bytes must be identical chunks";
  ASSERT_TRUE(store_->Unlink(kRootIno, "fresh").ok());
  SetAttrRequest trunc;
  trunc.size = 0;
  ASSERT_TRUE(store_->SetAttr(f.ino, trunc).ok());
  EXPECT_EQ(ChunkFiles(), 0u);
}

TEST_F(StoreFilesTest, UnlinkedOpenFileLivesUntilRelease) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes data = test::RandomBytes(1 << 20, 4);
  WriteFile(f.ino, data);
  const size_t chunks = ChunkFiles();
  ASSERT_GT(chunks, 0u);

  ASSERT_TRUE(store_->Open(f.ino).ok());
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  EXPECT_EQ(store_->Lookup(kRootIno, "f").status().code(), Code::kNotFound);
  EXPECT_EQ(List(kRootIno), (std::vector<std::string>{".", ".."}));
  EXPECT_EQ(Nlink(f.ino), 0u);
  EXPECT_TRUE(ReadOpen(f.ino) == data);
  EXPECT_EQ(ChunkFiles(), chunks);
  // Still writable, too.
  const Bytes more = test::RandomBytes(300000, 5);
  ASSERT_TRUE(store_->Write(f.ino, data.size(), more.data(), more.size()).ok());
  ASSERT_TRUE(store_->Flush(f.ino).ok());
  EXPECT_EQ(ReadOpen(f.ino).size(), data.size() + more.size());

  ASSERT_TRUE(store_->Release(f.ino).ok());
  EXPECT_EQ(store_->GetAttr(f.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(ChunkFiles(), 0u);
}

TEST_F(StoreFilesTest, SparseFile) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes head = test::RandomBytes(100000, 18), tail = test::RandomBytes(100000, 19);
  ASSERT_TRUE(store_->Open(f.ino).ok());
  ASSERT_TRUE(store_->Write(f.ino, 0, head.data(), head.size()).ok());
  ASSERT_TRUE(store_->Write(f.ino, 5 << 20, tail.data(), tail.size()).ok());
  ASSERT_TRUE(store_->Release(f.ino).ok());
  Bytes want = head;
  want.resize(5 << 20, 0);
  want.insert(want.end(), tail.begin(), tail.end());
  EXPECT_EQ(store_->GetAttr(f.ino)->size, want.size());
  EXPECT_TRUE(ReadFile(f.ino) == want);
  EXPECT_LE(ChunkFiles(), 10u) << "the 5 MiB gap is a hole, not chunks of zeros";
}

TEST_F(StoreFilesTest, OpenWithTruncateReplacesTheBytesOnClose) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes old = test::RandomBytes(500000, 21);
  WriteFile(f.ino, old);
  const Bytes fresh = test::RandomBytes(200000, 22);
  ASSERT_TRUE(store_->Open(f.ino, /*truncate=*/true).ok());
  EXPECT_EQ(store_->GetAttr(f.ino)->size, 0u);
  EXPECT_TRUE(ReadOpen(f.ino).empty());
  ASSERT_TRUE(store_->Write(f.ino, 0, fresh.data(), fresh.size()).ok());
  ASSERT_TRUE(store_->Release(f.ino).ok());
  EXPECT_EQ(store_->GetAttr(f.ino)->size, fresh.size());
  EXPECT_TRUE(ReadFile(f.ino) == fresh);
  InodeRecord g = File(kRootIno, "g");
  WriteFile(g.ino, fresh);
  ASSERT_TRUE(store_->Unlink(kRootIno, "g").ok());
  const size_t fresh_chunks = ChunkFiles();
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  EXPECT_EQ(ChunkFiles(), 0u);
  EXPECT_GT(fresh_chunks, 0u);
}

TEST_F(StoreFilesTest, SetAttrTruncatesAndChangesAttributes) {
  InodeRecord f = File(kRootIno, "f");
  const Bytes data = test::RandomBytes(1 << 20, 14);
  WriteFile(f.ino, data);
  const size_t chunks = ChunkFiles();
  SetAttrRequest shrink;
  shrink.size = 300000;
  auto r = store_->SetAttr(f.ino, shrink);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size, 300000u);
  EXPECT_TRUE(ReadFile(f.ino) == Bytes(data.begin(), data.begin() + 300000));
  EXPECT_LT(ChunkFiles(), chunks) << "the cut-off chunks are reclaimed";

  SetAttrRequest grow;
  grow.size = 2 << 20;
  ASSERT_TRUE(store_->SetAttr(f.ino, grow).ok());
  Reopen();
  EXPECT_EQ(store_->GetAttr(f.ino)->size, 2u << 20);
  Bytes want(data.begin(), data.begin() + 300000);
  want.resize(2 << 20, 0);
  EXPECT_TRUE(ReadFile(f.ino) == want);

  SetAttrRequest attrs;
  attrs.mode = 0600;
  attrs.uid = 7;
  attrs.gid = 8;
  attrs.mtime_ns = 1234567890;
  attrs.atime_ns = SetAttrRequest::kNow;
  auto a = store_->SetAttr(f.ino, attrs);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->mode, uint32_t{S_IFREG | 0600}) << "the file type is kept";
  EXPECT_EQ(a->uid, 7u);
  EXPECT_EQ(a->gid, 8u);
  EXPECT_EQ(a->mtime_ns, 1234567890);
  EXPECT_GT(a->atime_ns, 1234567890);
  EXPECT_EQ(store_->GetAttr(f.ino)->mtime_ns, 1234567890);

  InodeRecord d = Dir(kRootIno, "d");
  EXPECT_EQ(store_->SetAttr(d.ino, shrink).status().code(), Code::kIsDir);
}

TEST_F(StoreFilesTest, ConcurrentFiles) {
  constexpr int kThreads = 6;
  std::vector<std::thread> threads;
  std::vector<int> good(kThreads, 0);
  const Bytes shared = test::RandomBytes(300000, 20);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 4; ++round) {
        const std::string name = "t" + std::to_string(t) + "." + std::to_string(round);
        auto f = store_->MakeNode(kRootIno, name, S_IFREG | 0644, 0, who_);
        if (!f.ok()) return;
        // Odd threads all write the same bytes: dedup races with reclamation.
        const Bytes data = t % 2 ? shared : test::RandomBytes(200000 + t, 100 * t + round);
        if (!store_->Open(f->ino).ok()) return;
        if (!store_->Write(f->ino, 0, data.data(), data.size()).ok()) return;
        if (!store_->Release(f->ino).ok()) return;
        if (!store_->Open(f->ino).ok()) return;
        std::vector<ReadSlice> slices;
        if (!store_->Read(f->ino, 0, data.size() + 1, &slices).ok()) return;
        Bytes back;
        for (const ReadSlice& s : slices) back.insert(back.end(), s.data, s.data + s.len);
        if (!store_->Release(f->ino).ok() || back != data) return;
        if (round % 2 && !store_->Unlink(kRootIno, name).ok()) return;
        ++good[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(good[t], 4) << "thread " << t;
  // Every surviving file still reads back after a restart.
  Reopen();
  for (int t = 0; t < kThreads; ++t) {
    for (int round = 0; round < 4; round += 2) {
      auto f = store_->Lookup(kRootIno, "t" + std::to_string(t) + "." + std::to_string(round));
      ASSERT_TRUE(f.ok());
      const Bytes data = t % 2 ? shared : test::RandomBytes(200000 + t, 100 * t + round);
      EXPECT_TRUE(ReadFile(f->ino) == data);
    }
  }
}

}  // namespace
}  // namespace ckptfs
