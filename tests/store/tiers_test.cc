// A chain of two remote tiers (a near one, e.g. a parallel-filesystem directory, and a far one,
// e.g. the object store), each an in-memory backend shared by the simulated nodes: every
// committed file reaches both; a read takes the nearest tier that has a chunk; a tier that is
// down holds back neither the other nor a durability wait that does not name it; a tier whose
// backend changed starts over; fsck repairs one tier from the other; the near tier's keep=
// policy drops old checkpoints from it alone, and its gc then frees their chunks there; a file
// moved away and back during a publish ends up in each tier, which says so only once it is.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "backends/mem_backend.h"
#include "store/gc.h"
#include "store/remote_tier.h"
#include "store/store.h"
#include "tests/store/shared_backend.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;
using Shared = test::SharedBackend;

class TiersTest : public test::NodesTest {
 protected:
  // A node on the chain [near, far]; *near_out / *far_out get its two backends.
  std::unique_ptr<Store> OpenChain(const std::string& name, MemBackend* near, MemBackend* far,
                                   Shared** near_out = nullptr, Shared** far_out = nullptr,
                                   const std::function<void(Config&)>& tweak = {}) {
    Config cfg = NodeConfig(name, {near->Describe(), far->Describe()});
    if (tweak) tweak(cfg);
    EXPECT_TRUE(cfg.Validate().ok());
    std::vector<std::unique_ptr<Backend>> tiers;
    auto n = std::make_unique<Shared>(near), f = std::make_unique<Shared>(far);
    if (near_out) *near_out = n.get();
    if (far_out) *far_out = f.get();
    tiers.push_back(std::move(n));
    tiers.push_back(std::move(f));
    auto s = Store::Open(cfg, {}, std::move(tiers));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static size_t Count(MemBackend& m, const std::string& prefix) {
    size_t n = 0;
    EXPECT_TRUE(m.List(prefix, "", [&](const ObjectInfo&) { return ++n, true; }).ok());
    return n;
  }

  static void DeleteAll(MemBackend& m, const std::string& prefix) {
    for (const std::string& k : m.Keys()) {
      if (k.rfind(prefix, 0) == 0) {
        ASSERT_TRUE(m.Delete(k).ok());
      }
    }
  }

  // Deletes every chunk file of node `name`'s local tier.
  void RemoveChunkFiles(const std::string& name) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.Sub(name) + "/chunks")) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    ASSERT_FALSE(files.empty());
    for (const auto& f : files) std::filesystem::remove(f);
  }

  // The state user.ckptfs.tiers gives file ino on tier t.
  static std::string TierState(Store& s, uint64_t ino, int t) {
    auto json = s.TierStates(ino);
    if (!json.ok()) return json.status().ToString();
    constexpr std::string_view kState = "\"state\":\"";
    size_t at = 0;
    for (int i = 0; i <= t; ++i) {
      at = json->find(kState, at);
      if (at == std::string::npos) return "no tier " + std::to_string(t);
      at += kState.size();
    }
    return json->substr(at, json->find('"', at) - at);
  }

  static void Drain(Store& s) {
    for (size_t t = 0; t < s.remote_tiers(); ++t) ASSERT_TRUE(s.remote(t)->Drain(30).ok());
  }

  uint64_t WriteCheckpoint(Store& s, const Bytes& data) {
    auto d = s.MakeNode(kRootIno, "ck", S_IFDIR | 0755, 0, Caller{});
    EXPECT_TRUE(d.ok());
    return Write(s, d->ino, "rank0.pt", data);
  }

  MemBackend near_{"near"}, far_{"far"};
};

TEST_F(TiersTest, EveryCommittedFileReachesEveryTier) {
  auto a = OpenChain("a", &near_, &far_);
  const uint64_t ino = WriteCheckpoint(*a, test::RandomBytes(1 << 20, 1));
  Drain(*a);
  for (MemBackend* m : {&near_, &far_}) {
    EXPECT_GE(Count(*m, "chunks/"), 4u) << m->Describe();
    EXPECT_EQ(Count(*m, "files/ck/rank0.pt"), 1u) << m->Describe();
    EXPECT_EQ(Count(*m, "dirs/ck"), 1u) << m->Describe();
  }
  EXPECT_EQ(*a->RemoteState(ino), "remote");
  EXPECT_EQ(*a->TierStates(ino),
            "{\"tiers\":[{\"backend\":\"mem://near\",\"state\":\"remote\"},"
            "{\"backend\":\"mem://far\",\"state\":\"remote\"}]}");
}

TEST_F(TiersTest, AReadTakesTheNearestTierThatHasTheChunk) {
  auto a = OpenChain("a", &near_, &far_);
  const Bytes data = test::RandomBytes(1 << 20, 2);
  WriteCheckpoint(*a, data);
  Drain(*a);

  // Node b has nothing locally: while the near tier has the chunks, it serves them all.
  auto b = OpenChain("b", &near_, &far_);
  ASSERT_TRUE(b->SyncFromRemote().ok());
  auto on_b = b->Lookup(b->Lookup(kRootIno, "ck")->ino, "rank0.pt");
  ASSERT_TRUE(on_b.ok());
  const uint64_t near_gets = near_.stats().gets, far_gets = far_.stats().gets;
  EXPECT_EQ(Read(*b, on_b->ino), data);
  EXPECT_GT(near_.stats().gets, near_gets);
  EXPECT_EQ(far_.stats().gets, far_gets);
  EXPECT_EQ(b->metrics().remote_fetch_fallthrough.Get(), 0u);

  // Node c finds the near tier without them (dropped there, or lost): the far one serves them.
  DeleteAll(near_, "chunks/");
  auto c = OpenChain("c", &near_, &far_);
  ASSERT_TRUE(c->SyncFromRemote().ok());
  auto on_c = c->Lookup(c->Lookup(kRootIno, "ck")->ino, "rank0.pt");
  ASSERT_TRUE(on_c.ok());
  EXPECT_EQ(Read(*c, on_c->ino), data);
  EXPECT_GE(c->metrics().remote_fetch_fallthrough.Get(), 4u);
  EXPECT_GT(far_.stats().gets, far_gets);
}

TEST_F(TiersTest, AReadPutsBackWhatANearTierLost) {
  auto a = OpenChain("a", &near_, &far_, nullptr, nullptr, [](Config& c) { c.ram_cache_bytes = 0; });
  const Bytes data = test::RandomBytes(1 << 20, 11);
  const uint64_t ino = WriteCheckpoint(*a, data);
  Drain(*a);
  const size_t chunks = Count(near_, "chunks/");
  ASSERT_GE(chunks, 4u);
  // The near tier loses the chunks (a purge on the parallel filesystem); so does the node.
  DeleteAll(near_, "chunks/");
  RemoveChunkFiles("a");
  EXPECT_EQ(Read(*a, ino), data);  // served by the far tier
  for (int i = 0; i < 100 && Count(near_, "chunks/") < chunks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Count(near_, "chunks/"), chunks);  // and put back where this node knows they belong
  EXPECT_EQ(a->metrics().tier_chunks_restored.Get(), chunks);

  // A node that never counted the near tier as holding them (they came to it from the far
  // tier's namespace) leaves the near tier alone.
  DeleteAll(near_, "chunks/");
  auto b = OpenChain("b", &near_, &far_);
  ASSERT_TRUE(b->SyncFromRemote().ok());
  auto on_b = b->Lookup(b->Lookup(kRootIno, "ck")->ino, "rank0.pt");
  ASSERT_TRUE(on_b.ok());
  EXPECT_EQ(Read(*b, on_b->ino), data);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(b->metrics().tier_chunks_restored.Get(), 0u);
  EXPECT_EQ(Count(near_, "chunks/"), 0u);
}

TEST_F(TiersTest, ATierThatIsDownHoldsBackNeitherTheOtherNorADurabilityWaitThatSkipsIt) {
  Shared* near = nullptr;
  auto a = OpenChain("a", &near_, &far_, &near, nullptr, [](Config& c) {
    c.durability = "remote";
    c.durability_tiers = {1};  // the far tier only
    c.remote_timeout_s = 20;
  });
  near->fail_rate = 1.0;  // every request to the near tier fails
  const uint64_t ino = WriteCheckpoint(*a, test::RandomBytes(512 << 10, 3));
  ASSERT_TRUE(a->Fsync(ino).ok());  // returns once the far tier holds it
  EXPECT_EQ(Count(far_, "files/ck/rank0.pt"), 1u);
  EXPECT_EQ(Count(near_, "files/"), 0u);
  EXPECT_EQ(*a->RemoteState(ino), "uploading");
  EXPECT_EQ(*a->TierStates(ino),
            "{\"tiers\":[{\"backend\":\"mem://near\",\"state\":\"uploading\"},"
            "{\"backend\":\"mem://far\",\"state\":\"remote\"}]}");
  EXPECT_FALSE(a->remote(0)->last_error().ok());

  near->fail_rate = 0;  // back: the near tier catches up
  Drain(*a);
  EXPECT_EQ(Count(near_, "files/ck/rank0.pt"), 1u);
  EXPECT_EQ(*a->RemoteState(ino), "remote");
}

TEST_F(TiersTest, ADurabilityWaitForADownTierFailsWithItsError) {
  Shared* near = nullptr;
  auto a = OpenChain("a", &near_, &far_, &near, nullptr, [](Config& c) {
    c.durability = "remote";  // every tier
    c.remote_timeout_s = 1;
  });
  near->fail_rate = 1.0;
  const uint64_t ino = WriteCheckpoint(*a, test::RandomBytes(256 << 10, 4));
  Status st = a->Fsync(ino);
  EXPECT_EQ(st.code(), Code::kIo) << st.ToString();
  EXPECT_NE(st.message().find("mem://near"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("injected fault"), std::string::npos) << st.ToString();
}

TEST_F(TiersTest, ATierWhoseBackendChangedStartsOver) {
  {
    auto a = OpenChain("a", &near_, &far_);
    WriteCheckpoint(*a, test::RandomBytes(512 << 10, 5));
    Drain(*a);
    ASSERT_TRUE(a->Close().ok());
  }
  // The near tier is now another directory: nothing this node knew of the old one holds there.
  MemBackend other("other");
  auto a = OpenChain("a", &other, &far_);
  Drain(*a);
  EXPECT_EQ(Count(other, "files/ck/rank0.pt"), 1u);
  EXPECT_EQ(Count(other, "chunks/"), Count(near_, "chunks/"));
  auto ino = a->Lookup(a->Lookup(kRootIno, "ck")->ino, "rank0.pt");
  ASSERT_TRUE(ino.ok());
  EXPECT_EQ(*a->RemoteState(ino->ino), "remote");
}

TEST_F(TiersTest, ANearTierAddedInFrontLeavesTheFarTiersStateWithIt) {
  auto open_far_only = [&] {
    Config cfg = NodeConfig("a", {far_.Describe()});
    auto s = Store::Open(cfg, {}, std::make_unique<Shared>(&far_));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  };
  {
    auto a = open_far_only();
    WriteCheckpoint(*a, test::RandomBytes(512 << 10, 9));
    Drain(*a);
    ASSERT_TRUE(a->Close().ok());
  }
  const uint64_t far_puts = far_.stats().puts;
  auto a = OpenChain("a", &near_, &far_);
  Drain(*a);
  EXPECT_EQ(far_.stats().puts, far_puts);  // nothing uploaded to the far tier again
  EXPECT_EQ(Count(near_, "files/ck/rank0.pt"), 1u);
  auto ino = a->Lookup(a->Lookup(kRootIno, "ck")->ino, "rank0.pt");
  ASSERT_TRUE(ino.ok());
  EXPECT_EQ(*a->RemoteState(ino->ino), "remote");
}

TEST_F(TiersTest, AStoreFromBeforeTheChainTakesAChainOnlyOnceItsBackendIsNamed) {
  {
    Config cfg = NodeConfig("a", {far_.Describe()});
    auto a = Store::Open(cfg, {}, std::make_unique<Shared>(&far_));
    ASSERT_TRUE(a.ok());
    WriteCheckpoint(**a, test::RandomBytes(256 << 10, 10));
    Drain(**a);
    ASSERT_TRUE((*a)->Close().ok());
  }
  {
    // As a store written before tiers were named: its one backend's state carries no name.
    auto meta = MetaStore::Open(dir_.Sub("a") + "/meta", 1ull << 30);
    ASSERT_TRUE(meta.ok());
    auto txn = (*meta)->Begin(true);
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(txn->PutTierName(0, "").ok());
    ASSERT_TRUE(txn->Commit().ok());
  }
  Config cfg = NodeConfig("a", {near_.Describe(), far_.Describe()});
  std::vector<std::unique_ptr<Backend>> tiers;
  tiers.push_back(std::make_unique<Shared>(&near_));
  tiers.push_back(std::make_unique<Shared>(&far_));
  auto refused = Store::Open(cfg, {}, std::move(tiers));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("mount it once with that backend alone"),
            std::string::npos) << refused.status().ToString();
  {
    Config one = NodeConfig("a", {far_.Describe()});
    auto a = Store::Open(one, {}, std::make_unique<Shared>(&far_));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE((*a)->Close().ok());
  }
  const uint64_t far_puts = far_.stats().puts;
  auto a = OpenChain("a", &near_, &far_);
  Drain(*a);
  EXPECT_EQ(far_.stats().puts, far_puts);
  EXPECT_EQ(Count(near_, "files/ck/rank0.pt"), 1u);
}

TEST_F(TiersTest, FsckRepairsOneTierAndTheLocalTierFromTheOther) {
  // No RAM tier: its copies would serve the repairs.
  auto a = OpenChain("a", &near_, &far_, nullptr, nullptr, [](Config& c) { c.ram_cache_bytes = 0; });
  const Bytes data = test::RandomBytes(1 << 20, 6);
  const uint64_t ino = WriteCheckpoint(*a, data);
  Drain(*a);
  const size_t chunks = Count(near_, "chunks/");
  ASSERT_GE(chunks, 4u);
  // The near tier loses its chunks and its record; the node loses its local chunk files: only
  // the far tier has the bytes.
  DeleteAll(near_, "chunks/");
  DeleteAll(near_, "files/");
  RemoveChunkFiles("a");

  auto found = a->Fsck(kRootIno, Store::FsckOptions{});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->remote_missing, chunks);
  EXPECT_EQ(found->records_missing, 1u);
  EXPECT_EQ(found->damaged_files, 0u);  // the far tier holds every chunk
  EXPECT_FALSE(found->Clean());

  auto fixed = a->Fsck(kRootIno, Store::FsckOptions{.deep = false, .repair = true});
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ(fixed->remote_repaired, chunks);
  EXPECT_EQ(fixed->records_republished, 1u);
  EXPECT_TRUE(fixed->Clean()) << fixed->Json();
  Drain(*a);
  EXPECT_EQ(Count(near_, "chunks/"), chunks);
  EXPECT_EQ(Count(near_, "files/ck/rank0.pt"), 1u);

  auto deep = a->Fsck(kRootIno, Store::FsckOptions{.deep = true, .repair = false});
  ASSERT_TRUE(deep.ok()) << deep.status().ToString();
  EXPECT_TRUE(deep->Clean()) << deep->Json();
  EXPECT_EQ(Read(*a, ino), data);
}

TEST_F(TiersTest, FsckNamesTheFilesNoTierCanSupply) {
  auto a = OpenChain("a", &near_, &far_, nullptr, nullptr, [](Config& c) { c.ram_cache_bytes = 0; });
  WriteCheckpoint(*a, test::RandomBytes(512 << 10, 7));
  Drain(*a);
  DeleteAll(near_, "chunks/");
  DeleteAll(far_, "chunks/");
  RemoveChunkFiles("a");
  auto r = a->Fsck(kRootIno, Store::FsckOptions{.deep = false, .repair = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->Clean());
  EXPECT_EQ(r->damaged_files, 1u);
  ASSERT_EQ(r->damaged.size(), 1u);
  EXPECT_EQ(r->damaged[0], "/ck/rank0.pt");
}

TEST_F(TiersTest, TheNearTiersKeepPolicyDropsOldCheckpointsFromItAlone) {
  auto a = OpenChain("a", &near_, &far_, nullptr, nullptr, [](Config& c) {
    c.tier_keep = {2};  // the near tier keeps the newest two steps
  });
  auto run = a->MakeNode(kRootIno, "run", S_IFDIR | 0755, 0, Caller{});
  ASSERT_TRUE(run.ok());
  std::vector<std::pair<uint64_t, Bytes>> steps;
  for (int step = 1; step <= 4; ++step) {
    auto d = a->MakeNode(run->ino, "global_step" + std::to_string(step * 10), S_IFDIR | 0755, 0,
                         Caller{});
    ASSERT_TRUE(d.ok());
    Bytes data = test::RandomBytes(256 << 10, 100 + step);
    steps.emplace_back(Write(*a, d->ino, "mp_rank_00_model_states.pt", data), data);
    Drain(*a);
  }
  // Steps 30 and 40 stay on the near tier; every step stays on the far one.
  for (int step = 1; step <= 4; ++step) {
    const std::string key = "files/run/global_step" + std::to_string(step * 10) +
                            "/mp_rank_00_model_states.pt";
    EXPECT_EQ(Count(near_, key), step >= 3 ? 1u : 0u) << key;
    EXPECT_EQ(Count(far_, key), 1u) << key;
  }
  EXPECT_EQ(a->metrics().tier_files_dropped.Get(), 2u);
  EXPECT_EQ(*a->TierStates(steps[0].first),
            "{\"tiers\":[{\"backend\":\"mem://near\",\"state\":\"dropped\"},"
            "{\"backend\":\"mem://far\",\"state\":\"remote\"}]}");
  EXPECT_EQ(*a->RemoteState(steps[0].first), "remote");

  // A gc round on the near tier frees the dropped steps' chunks there; the node follows it.
  const size_t before = Count(near_, "chunks/");
  GcOptions o;
  o.dry_run = false;
  o.grace_s = 1.5;
  o.deadline_s = 30;
  o.spill_dir = dir_.Sub("spill");
  std::filesystem::create_directories(o.spill_dir);
  auto r = CollectGarbage(near_, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(r->deleted, 2u);
  EXPECT_EQ(Count(near_, "chunks/"), before - r->deleted);
  // Every step reads back on a fresh node: the old ones through the far tier.
  auto b = OpenChain("b", &near_, &far_, nullptr, nullptr, [](Config& c) { c.tier_keep = {2}; });
  ASSERT_TRUE(b->SyncFromRemote().ok());
  auto brun = b->Lookup(kRootIno, "run");
  ASSERT_TRUE(brun.ok());
  for (int step = 1; step <= 4; ++step) {
    auto d = b->Lookup(brun->ino, "global_step" + std::to_string(step * 10));
    ASSERT_TRUE(d.ok());
    auto f = b->Lookup(d->ino, "mp_rank_00_model_states.pt");
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(Read(*b, f->ino), steps[step - 1].second) << step;
  }
  EXPECT_GE(b->metrics().remote_fetch_fallthrough.Get(), 2u);
}

TEST_F(TiersTest, ARenameAwayAndBackDuringThePublishLeavesEveryTierWithTheFile) {
  // `rename A B; rename B A` while the near tier's publish of A puts its chunks (the far tier's
  // runs meanwhile, wherever it is): each tier ends up holding A, and says so only once it does.
  Shared *a_near = nullptr, *a_far = nullptr;
  auto a = OpenChain("a", &near_, &far_, &a_near, &a_far);
  const Bytes data = test::RandomBytes(512 << 10, 13);
  std::atomic<bool> moved{false};
  a_near->on_put = [&](const std::string& key) {
    if (key.rfind("chunks/", 0) != 0 || moved.exchange(true)) return;
    EXPECT_TRUE(a->Rename(kRootIno, "A.pt", kRootIno, "B.pt", 0).ok());
    EXPECT_TRUE(a->Rename(kRootIno, "B.pt", kRootIno, "A.pt", 0).ok());
  };
  for (int t = 0; t < 2; ++t) {
    (t ? a_far : a_near)->on_delete = [&a, t](const std::string& key) {
      if (key != "files/A.pt") return;
      auto f = a->Lookup(kRootIno, "A.pt");
      if (!f.ok()) return;
      EXPECT_NE(TierState(*a, f->ino, t), "remote") << "tier " << t << " loses A.pt";
    };
  }
  const uint64_t ino = Write(*a, kRootIno, "A.pt", data);
  Drain(*a);
  ASSERT_TRUE(moved);
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(TierState(*a, ino, t), "remote") << "tier " << t;
    EXPECT_TRUE(HoldsVersion(t ? far_ : near_, *a, ino, "A.pt")) << "tier " << t;
    EXPECT_EQ(Count(t ? far_ : near_, "files/B.pt"), 0u) << "tier " << t;
  }
  auto fresh = OpenChain("fresh", &near_, &far_);
  ASSERT_TRUE(fresh->SyncFromRemote().ok());
  EXPECT_FALSE(fresh->Lookup(kRootIno, "B.pt").ok());
  auto on_fresh = fresh->Lookup(kRootIno, "A.pt");
  ASSERT_TRUE(on_fresh.ok());
  EXPECT_EQ(Read(*fresh, on_fresh->ino), data);
}

TEST_F(TiersTest, ADeletionFromAnotherNodeReachesANearTierThePublishLandedOnLate) {
  // Node a's publish to the near tier is held (at its first chunk HEAD, so its record lands
  // later) until node b has deleted the file (through the farthest tier, where a's record
  // already is; b's deletion from the near tier finds nothing there) and a has synced that
  // deletion.
  Shared* a_near = nullptr;
  std::promise<void> reached, release;
  auto released = release.get_future().share();
  std::atomic<bool> once{true};  // upload threads call the hook at once
  auto a = OpenChain("a", &near_, &far_, &a_near);
  a_near->on_head = [&](const std::string& key) {
    if (key.rfind("chunks/", 0) != 0 || !once.exchange(false)) return;
    reached.set_value();
    released.wait();
  };
  WriteCheckpoint(*a, test::RandomBytes(256 << 10, 8));
  reached.get_future().wait();
  ASSERT_TRUE(a->remote(1)->Drain(30).ok());
  ASSERT_TRUE(a->SyncFromRemote().ok());  // a's sync sees its own record in the farthest tier
  auto b = OpenChain("b", &near_, &far_);
  ASSERT_TRUE(b->SyncFromRemote().ok());
  auto ck = b->Lookup(kRootIno, "ck");
  ASSERT_TRUE(ck.ok());
  ASSERT_TRUE(b->Unlink(ck->ino, "rank0.pt").ok());
  Drain(*b);
  EXPECT_EQ(Count(far_, "files/"), 0u);
  ASSERT_TRUE(a->SyncFromRemote().ok());
  EXPECT_FALSE(a->Lookup(a->Lookup(kRootIno, "ck")->ino, "rank0.pt").ok());
  release.set_value();
  Drain(*a);
  EXPECT_EQ(Count(near_, "files/"), 0u);  // a's late record went with the deletion
}

}  // namespace
}  // namespace ckptfs
