// Two Stores, each with its own cache directory, on one in-memory backend: what one commits the
// backend gets (chunks first, then the record), and the other's namespace sync applies it
// (new, replaced, renamed, deleted files), reading the bytes back through its fetch path.
#include "store/remote_tier.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <functional>
#include <string>
#include <vector>

#include "backends/mem_backend.h"
#include "store/store.h"
#include "tests/store/shared_backend.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

using Shared = test::SharedBackend;

class RemoteTierTest : public test::NodesTest {
 protected:
  // The ino of a path, 0 when absent.
  static uint64_t Find(Store& s, const std::vector<std::string>& path) {
    uint64_t ino = kRootIno;
    for (const std::string& p : path) {
      auto r = s.Lookup(ino, p);
      if (!r.ok()) return 0;
      ino = r->ino;
    }
    return ino;
  }

  size_t Count(const std::string& prefix) {
    size_t n = 0;
    EXPECT_TRUE(mem_.List(prefix, "", [&](const ObjectInfo&) { return ++n, true; }).ok());
    return n;
  }

};

TEST_F(RemoteTierTest, CommittedFilesReachTheOtherNode) {
  auto a = OpenStore("a"), b = OpenStore("b");
  auto d = a->MakeNode(kRootIno, "ck", S_IFDIR | 0755, 0, Caller{});
  ASSERT_TRUE(d.ok());
  const Bytes data = test::RandomBytes(1 << 20, 1);
  const uint64_t ino = Write(*a, d->ino, "rank0.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  EXPECT_EQ(*a->RemoteState(ino), "remote");
  EXPECT_GE(Count("chunks/"), 4u);
  EXPECT_EQ(Count("files/"), 1u);

  ASSERT_TRUE(b->SyncFromRemote().ok());
  const uint64_t on_b = Find(*b, {"ck", "rank0.pt"});
  ASSERT_NE(on_b, 0u);
  EXPECT_EQ(*b->RemoteState(on_b), "remote");
  EXPECT_EQ(Read(*b, on_b), data);  // every chunk fetched and verified
  EXPECT_GT(b->metrics().remote_fetches.Get(), 0u);

  // Replaced on a, then renamed, then deleted: b follows each step.
  const Bytes v2 = test::RandomBytes(300 << 10, 2);
  Write(*a, d->ino, "rank0.pt", v2);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Read(*b, Find(*b, {"ck", "rank0.pt"})), v2);
  ASSERT_TRUE(a->Rename(d->ino, "rank0.pt", d->ino, "final.pt", 0).ok());
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Find(*b, {"ck", "rank0.pt"}), 0u);
  EXPECT_EQ(Read(*b, Find(*b, {"ck", "final.pt"})), v2);
  ASSERT_TRUE(a->Unlink(d->ino, "final.pt").ok());
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Find(*b, {"ck", "final.pt"}), 0u);
  EXPECT_NE(Find(*b, {"ck"}), 0u);
  ASSERT_TRUE(a->Rmdir(kRootIno, "ck").ok());
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Find(*b, {"ck"}), 0u);
}

TEST_F(RemoteTierTest, RenameWhilePublishingPublishesTheNewName) {
  // torch.save to a temporary name, then a rename over the checkpoint, while the uploader is
  // publishing the temporary name: the checkpoint's record must get the new bytes.
  Shared* backend = nullptr;
  auto a = OpenStore("a", &backend), b = OpenStore("b");
  const Bytes old_bytes = test::RandomBytes(200 << 10, 7), new_bytes = test::RandomBytes(300 << 10, 8);
  Write(*a, kRootIno, "ckpt.pt", old_bytes);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  bool renamed = false;
  backend->on_put = [&](const std::string& key) {
    if (key != "files/ckpt.pt.tmp" || renamed) return;
    auto rec = a->Lookup(kRootIno, "ckpt.pt.tmp");  // the record of the committed bytes
    if (!rec.ok() || rec->generation == 0) return;
    renamed = true;
    EXPECT_TRUE(a->Rename(kRootIno, "ckpt.pt.tmp", kRootIno, "ckpt.pt", 0).ok());
  };
  Write(*a, kRootIno, "ckpt.pt.tmp", new_bytes);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(renamed);
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Find(*b, {"ckpt.pt.tmp"}), 0u);
  EXPECT_EQ(Read(*b, Find(*b, {"ckpt.pt"})), new_bytes);
}

TEST_F(RemoteTierTest, IdenticalBytesFromTwoNodesAreUploadedOnce) {
  auto a = OpenStore("a"), b = OpenStore("b");
  const Bytes data = test::RandomBytes(1 << 20, 3);
  Write(*a, kRootIno, "a.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  const size_t chunks = Count("chunks/");
  Write(*b, kRootIno, "b.pt", data);
  ASSERT_TRUE(b->remote()->Drain(30).ok());
  EXPECT_EQ(Count("chunks/"), chunks);
  EXPECT_EQ(b->metrics().chunks_uploaded.Get(), 0u);
  EXPECT_EQ(b->metrics().chunk_upload_skips.Get(), chunks);
}

TEST_F(RemoteTierTest, LocalChangesNotYetPublishedWinOverAnOlderRemoteVersion) {
  auto a = OpenStore("a"), b = OpenStore("b");
  const uint64_t on_a = Write(*a, kRootIno, "x", test::RandomBytes(100 << 10, 4));
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b->SyncFromRemote().ok());
  // b writes its own version while its upload is held back (its tier is stopped).
  b->remote()->Stop();
  const Bytes mine = test::RandomBytes(50 << 10, 5);
  const uint64_t on_b = Write(*b, kRootIno, "x", mine);
  ASSERT_TRUE(b->SyncFromRemote().ok());  // sees a's older record: keeps its own
  EXPECT_EQ(Read(*b, on_b), mine);
  EXPECT_EQ(*b->RemoteState(on_b), "uploading");
  (void)on_a;
}

TEST_F(RemoteTierTest, UploadsQueuedWhenTheDaemonStoppedResumeAtTheNextOpen) {
  Bytes data = test::RandomBytes(600 << 10, 6);
  {
    auto a = OpenStore("a");
    a->remote()->Stop();  // as if the backend were down until the daemon stopped
    const uint64_t ino = Write(*a, kRootIno, "late.pt", data);
    EXPECT_EQ(*a->RemoteState(ino), "uploading");
    EXPECT_EQ(Count("files/"), 0u);
  }
  auto a = OpenStore("a");
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  EXPECT_EQ(Count("files/"), 1u);
  auto b = OpenStore("b");
  ASSERT_TRUE(b->SyncFromRemote().ok());
  EXPECT_EQ(Read(*b, Find(*b, {"late.pt"})), data);
}

}  // namespace
}  // namespace ckptfs
