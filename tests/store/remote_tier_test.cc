// Two Stores, each with its own cache directory, on one in-memory backend: what one commits the
// backend gets (chunks first, then the record), and the other's namespace sync applies it
// (new, replaced, renamed, deleted files), reading the bytes back through its fetch path. A file
// moved away and back while it is published (or queued, or queued by an older binary) ends up in
// the bucket, and is said to be there only once it is.
#include "store/remote_tier.h"

#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/stat.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/mem_backend.h"
#include "store/store.h"
#include "tests/store/shared_backend.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

using Shared = test::SharedBackend;

// Rewrites the publish ops queued for the first tier in the metadata at `meta` (a store that is
// not open) the way a binary of store format 2 queued them: without the file's path epoch.
void DropPathEpochs(const std::string& meta) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  ASSERT_EQ(mdb_env_open(env, meta.c_str(), MDB_NOTLS, 0600), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi dbi;
  ASSERT_EQ(mdb_dbi_open(txn, "remote_ops", 0, &dbi), 0);
  std::vector<std::pair<std::string, std::string>> ops;
  MDB_cursor* cursor = nullptr;
  ASSERT_EQ(mdb_cursor_open(txn, dbi, &cursor), 0);
  MDB_val k, v;
  for (int rc = mdb_cursor_get(cursor, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT)) {
    ops.emplace_back(std::string(static_cast<char*>(k.mv_data), k.mv_size),
                     std::string(static_cast<char*>(v.mv_data), v.mv_size));
  }
  mdb_cursor_close(cursor);
  size_t rewritten = 0;
  for (auto& [key, op] : ops) {
    if (op.size() != 17 || op[0] != 'F') continue;  // 'F', ino, path epoch
    op.resize(9);
    MDB_val kv{key.size(), key.data()}, ov{op.size(), op.data()};
    ASSERT_EQ(mdb_put(txn, dbi, &kv, &ov, 0), 0);
    ++rewritten;
  }
  EXPECT_GE(rewritten, 3u);
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

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

  // `rename A.pt B.pt; rename B.pt A.pt` on node s.
  static void MoveAwayAndBack(Store& s) {
    EXPECT_TRUE(s.Rename(kRootIno, "A.pt", kRootIno, "B.pt", 0).ok());
    EXPECT_TRUE(s.Rename(kRootIno, "B.pt", kRootIno, "A.pt", 0).ok());
  }

  // Fails the test when files/A.pt is deleted while node s says the backend holds A.pt.
  static void ExpectNotRemoteWhileDeleted(Shared* backend, Store& s) {
    backend->on_delete = [&s](const std::string& key) {
      if (key != "files/A.pt") return;
      auto f = s.Lookup(kRootIno, "A.pt");
      if (!f.ok()) return;
      auto state = s.RemoteState(f->ino);
      ASSERT_TRUE(state.ok());
      EXPECT_NE(*state, "remote") << "the record of A.pt is being deleted";
    };
  }

  // Once the uploads are done, the bucket is the namespace: node s says file ino (at `path`) is
  // remote, the backend holds that version under `path` and nothing under `away` (where it was
  // meanwhile), and a fresh node, or s's own sync, reads it whole at `path`.
  void ExpectBucketHolds(Store& s, uint64_t ino, const std::string& path, const std::string& away,
                         const Bytes& data) {
    const auto parts = [](const std::string& p) {
      std::vector<std::string> out(1);
      for (char c : p) {
        if (c == '/') {
          out.emplace_back();
        } else {
          out.back().push_back(c);
        }
      }
      return out;
    };
    ASSERT_TRUE(s.remote()->Drain(30).ok());
    EXPECT_EQ(*s.RemoteState(ino), "remote");
    EXPECT_TRUE(HoldsVersion(mem_, s, ino, path));
    EXPECT_EQ(Count("files/" + away), 0u);
    auto fresh = OpenStore("fresh");
    ASSERT_TRUE(fresh->SyncFromRemote().ok());
    EXPECT_EQ(Find(*fresh, parts(away)), 0u);
    const uint64_t on_fresh = Find(*fresh, parts(path));
    ASSERT_NE(on_fresh, 0u);
    EXPECT_EQ(Read(*fresh, on_fresh), data);
    ASSERT_TRUE(s.SyncFromRemote().ok());
    ASSERT_EQ(Find(s, parts(path)), ino);
    EXPECT_EQ(Read(s, ino), data);
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

TEST_F(RemoteTierTest, SyncPassesOnTwoThreadsTakeTurns) {
  // SyncFromRemote is public: the sync thread, InitialSync, tests and the sync bench run passes.
  // Passes called at once run one after the other (store/namespace_sync.h), and together they
  // apply everything the other node published.
  auto a = OpenStore("a"), b = OpenStore("b");
  constexpr int kFiles = 12;
  std::vector<Bytes> data;
  for (int i = 0; i < kFiles; ++i) data.push_back(test::RandomBytes(40 << 10, 100 + i));
  std::atomic<bool> done{false};
  auto passes = [&] {
    while (!done.load()) EXPECT_TRUE(b->SyncFromRemote().ok());
  };
  std::thread t1(passes), t2(passes);
  for (int i = 0; i < kFiles; ++i) {
    Write(*a, kRootIno, "f" + std::to_string(i), data[i]);
    ASSERT_TRUE(a->remote()->Drain(30).ok());
  }
  done = true;
  t1.join();
  t2.join();
  ASSERT_TRUE(b->SyncFromRemote().ok());
  for (int i = 0; i < kFiles; ++i) {
    const uint64_t ino = Find(*b, {"f" + std::to_string(i)});
    ASSERT_NE(ino, 0u) << i;
    EXPECT_EQ(Read(*b, ino), data[i]);
  }
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

TEST_F(RemoteTierTest, ARenameAwayAndBackDuringThePublishLeavesTheFileInTheBucket) {
  // `rename A B; rename B A` while A's record is being put: the unpublishing of A that the first
  // rename queued runs after this publish, which must therefore neither count as the backend
  // holding A nor keep the publish queued by the second rename from putting A back.
  Shared* backend = nullptr;
  auto a = OpenStore("a", &backend);
  const Bytes data = test::RandomBytes(300 << 10, 11);
  bool moved = false;
  backend->on_put = [&](const std::string& key) {
    if (key != "files/A.pt" || moved) return;
    auto rec = a->Lookup(kRootIno, "A.pt");
    if (!rec.ok() || rec->generation == 0) return;  // the empty file MakeNode published
    moved = true;
    MoveAwayAndBack(*a);
  };
  ExpectNotRemoteWhileDeleted(backend, *a);
  const uint64_t ino = Write(*a, kRootIno, "A.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(moved);
  ExpectBucketHolds(*a, ino, "A.pt", "B.pt", data);
}

TEST_F(RemoteTierTest, ARenameAwayAndBackBeforeThePublishRunsLeavesTheFileInTheBucket) {
  // The same moves while A's publish still waits in the queue: it runs first, under the path A
  // has again, and the unpublishing of A queued after it must not leave the bucket without A.
  Shared* backend = nullptr;
  auto a = OpenStore("a", &backend);
  const Bytes data = test::RandomBytes(300 << 10, 12);
  a->remote()->Stop();
  const uint64_t ino = Write(*a, kRootIno, "A.pt", data);
  MoveAwayAndBack(*a);
  ExpectNotRemoteWhileDeleted(backend, *a);
  a->remote()->Start();
  ExpectBucketHolds(*a, ino, "A.pt", "B.pt", data);
}

TEST_F(RemoteTierTest, ADirectoryMovedAwayAndBackBeforeThePublishRunsLeavesTheFileInTheBucket) {
  // A move of a directory above the file moves the file too.
  auto a = OpenStore("a");
  auto d = a->MakeNode(kRootIno, "ck", S_IFDIR | 0755, 0, Caller{});
  ASSERT_TRUE(d.ok());
  const Bytes data = test::RandomBytes(300 << 10, 14);
  a->remote()->Stop();
  const uint64_t ino = Write(*a, d->ino, "A.pt", data);
  ASSERT_TRUE(a->Rename(kRootIno, "ck", kRootIno, "ck2", 0).ok());
  ASSERT_TRUE(a->Rename(kRootIno, "ck2", kRootIno, "ck", 0).ok());
  a->remote()->Start();
  ExpectBucketHolds(*a, ino, "ck/A.pt", "ck2/A.pt", data);
}

TEST_F(RemoteTierTest, PublishOpsQueuedBeforePathEpochsStillLeaveTheFileInTheBucket) {
  // The same moves queued by a binary of store format 2 (publish ops without a path epoch), run
  // by this one at the next mount: none of those publishes may count as the backend holding A.
  const Bytes data = test::RandomBytes(300 << 10, 13);
  uint64_t ino = 0;
  {
    auto a = OpenStore("a");
    a->remote()->Stop();
    ino = Write(*a, kRootIno, "A.pt", data);
    MoveAwayAndBack(*a);
  }
  DropPathEpochs(dir_.Sub("a") + "/meta");
  auto a = OpenStore("a");
  ExpectBucketHolds(*a, ino, "A.pt", "B.pt", data);
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

// A backend that refuses one request of a publish now and then (each chunk's first PUT here):
// the request is tried again, not the whole publish, so no chunk is asked about twice.
TEST_F(RemoteTierTest, ARefusedRequestIsTriedAgainWithoutRestartingThePublish) {
  Shared* ab = nullptr;
  auto a = OpenStore("a", &ab);
  std::mutex mu;
  std::set<std::string> refused;
  std::map<std::string, int> heads;
  ab->fail_put = [&](const std::string& key) {
    std::lock_guard lock(mu);
    return key.rfind("chunks/", 0) == 0 && refused.insert(key).second;
  };
  ab->on_head = [&](const std::string& key) {
    std::lock_guard lock(mu);
    ++heads[key];
  };
  const Bytes data = test::RandomBytes(1 << 20, 12);
  const uint64_t ino = Write(*a, kRootIno, "a.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  EXPECT_EQ(*a->RemoteState(ino), "remote");
  std::lock_guard lock(mu);
  EXPECT_GT(refused.size(), 1u);
  EXPECT_EQ(refused.size(), Count("chunks/"));
  for (const auto& [key, n] : heads) EXPECT_EQ(n, 1) << key;
  auto fresh = OpenStore("fresh");
  ASSERT_TRUE(fresh->SyncFromRemote().ok());
  EXPECT_EQ(Read(*fresh, Find(*fresh, {"a.pt"})), data);
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
