// Garbage collection of a shared backend (store/gc.h, docs/gc.md): the collector against Stores
// (simulated nodes) on one in-memory backend, in the interleavings that lose chunks to a naive
// sweep, and a model of concurrent writers, deleters and collections over many seeds.
#include "store/gc.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/mem_backend.h"
#include "cache/chunk_cache.h"
#include "store/remote_tier.h"
#include "store/store.h"
#include "tests/store/shared_backend.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

constexpr double kWindow = 0.2;  // every node's gc_window in these tests
constexpr double kGrace = 0.5;   // > kWindow

class GcTest : public test::NodesTest {
 protected:
  std::unique_ptr<Store> OpenNode(const std::string& name, test::SharedBackend** backend = nullptr,
                                  uint64_t cache_bytes = 0) {
    return OpenStore(name, backend, [&](Config& cfg) {
      cfg.gc_window_s = kWindow;
      cfg.cache_bytes = cache_bytes;
    });
  }

  static uint64_t Write(Store& s, const std::string& name, const Bytes& data) {
    return NodesTest::Write(s, kRootIno, name, data);
  }

  // Chunks of `data` in the bucket that no record names: a node saved them, then deleted them.
  void LeaveGarbage(const Bytes& data) {
    auto a = OpenNode("garbage");
    Write(*a, "old.pt", data);
    ASSERT_TRUE(a->remote()->Drain(30).ok());
    ASSERT_TRUE(a->Unlink(kRootIno, "old.pt").ok());
    ASSERT_TRUE(a->remote()->Drain(30).ok());
  }

  // Four files of 512 KiB saved on node a and uploaded, whose records are then deleted from
  // the bucket, as a deletion on another node leaves them: (ino, bytes) of each.
  void SaveDeletedElsewhere(Store& a, uint64_t seed,
                            std::vector<std::pair<uint64_t, Bytes>>* files) {
    for (uint64_t i = 0; i < 4; ++i) {
      const std::string name = "x" + std::to_string(i);
      Bytes data = test::RandomBytes(512 << 10, seed + i);
      files->emplace_back(Write(a, name, data), std::move(data));
      ASSERT_TRUE(a.remote()->Drain(30).ok());
      ASSERT_TRUE(mem_.Delete("files/" + name).ok());
    }
  }

  // The file's bytes read by a node with a cold cache; an error when a chunk is missing.
  Result<Bytes> ReadCold(const std::string& name) {
    auto s = OpenNode("reader-" + std::to_string(++readers_));
    RETURN_IF_ERROR(s->SyncFromRemote());
    ASSIGN_OR_RETURN(auto e, s->Lookup(kRootIno, name));
    RETURN_IF_ERROR(s->Open(e.ino));
    std::vector<ReadSlice> slices;
    Status st = s->Read(e.ino, 0, 64 << 20, &slices);
    Bytes out;
    for (const ReadSlice& sl : slices) out.insert(out.end(), sl.data, sl.data + sl.len);
    (void)s->Release(e.ino);
    RETURN_IF_ERROR(st);
    return out;
  }

  Result<GcReport> Collect(double grace = kGrace, bool dry_run = false) {
    GcOptions o;
    o.dry_run = dry_run;
    o.grace_s = grace;
    o.deadline_s = grace + 30;
    o.spill_dir = dir_.Sub("spill-" + std::to_string(++rounds_));
    std::filesystem::create_directories(o.spill_dir);
    return CollectGarbage(mem_, o);
  }

  // Every record's chunks are in the backend; returns how many distinct chunks they name.
  size_t CheckRecords() {
    std::set<ChunkId> named;
    EXPECT_TRUE(mem_.List("files/", "", [&](const ObjectInfo& o) {
      auto bytes = mem_.GetObject(o.key);
      EXPECT_TRUE(bytes.ok());
      auto rec = FileRecord::Decode(*bytes);
      EXPECT_TRUE(rec.ok()) << o.key;
      for (const Extent& e : rec->manifest.extents()) {
        if (e.hole()) continue;
        named.insert(e.id);
        EXPECT_TRUE(mem_.Head(ChunkCache::ObjectKey(e.id)).ok())
            << o.key << " names chunk " << e.id.Hex() << ", which is gone";
      }
      return true;
    }).ok());
    return named.size();
  }

  size_t Count(const std::string& prefix) {
    size_t n = 0;
    EXPECT_TRUE(mem_.List(prefix, "", [&](const ObjectInfo&) { return ++n, true; }).ok());
    return n;
  }

  int readers_ = 0, rounds_ = 0;
};

TEST(GcRound, EncodesAndRejectsDamage) {
  GcRound r{7, true, 123.5};
  auto back = GcRound::Decode(r.Encode());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->epoch, 7u);
  EXPECT_TRUE(back->active);
  EXPECT_DOUBLE_EQ(back->deadline_s, 123.5);
  std::string text = r.Encode();
  EXPECT_EQ(GcRound::Decode(text.substr(0, text.size() - 3)).status().code(), Code::kCorrupt);
  EXPECT_EQ(GcRound::Decode("epoch 1\n").status().code(), Code::kCorrupt);
  text.replace(text.find("active"), 6, "maybe!");
  EXPECT_EQ(GcRound::Decode(text).status().code(), Code::kCorrupt);
}

TEST_F(GcTest, DeletesWhatNoRecordNamesAndKeepsTheRest) {
  auto a = OpenNode("a");
  const Bytes keep = test::RandomBytes(1 << 20, 1), drop = test::RandomBytes(1 << 20, 2);
  Write(*a, "keep.pt", keep);
  Write(*a, "drop.pt", drop);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  const size_t all = Count("chunks/");
  ASSERT_TRUE(a->Unlink(kRootIno, "drop.pt").ok());
  ASSERT_TRUE(a->remote()->Drain(30).ok());

  auto dry = Collect(kGrace, true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_GT(dry->unreferenced, 0u);
  EXPECT_EQ(dry->deleted, 0u);
  EXPECT_EQ(Count("chunks/"), all);
  EXPECT_EQ(Count("gc/"), 0u);

  auto r = Collect();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch, 1u);
  EXPECT_EQ(r->deleted, dry->unreferenced);
  EXPECT_EQ(r->deleted_bytes, dry->unreferenced_bytes);
  EXPECT_TRUE(r->error.empty()) << r->error;
  EXPECT_EQ(Count("chunks/"), all - r->deleted);
  EXPECT_EQ(CheckRecords(), Count("chunks/"));
  auto round = ReadGcRound(mem_);
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->epoch, 1u);
  EXPECT_FALSE(round->active);
  auto back = ReadCold("keep.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, keep);
}

TEST_F(GcTest, AnUnreadableRecordStopsTheRoundBeforeAnyDeletion) {
  auto a = OpenNode("a");
  Write(*a, "x.pt", test::RandomBytes(256 << 10, 3));
  Write(*a, "y.pt", test::RandomBytes(256 << 10, 4));
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(a->Unlink(kRootIno, "y.pt").ok());
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  const size_t before = Count("chunks/");
  ASSERT_TRUE(mem_.Put("files/broken.pt", "not a record", 12).ok());
  auto r = Collect();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->bad_records, 1u);
  EXPECT_EQ(r->deleted, 0u);
  EXPECT_EQ(r->epoch, 0u);  // nothing condemned
  EXPECT_EQ(Count("chunks/"), before);
}

// The interleaving a naive sweep loses: node b HEADs a chunk, sees it, skips the upload; a whole
// round (condemn, grace, relist, delete) runs before b's record is put. b's window overran, so b
// publishes again after the round, finds the chunk gone and uploads it from its own copy.
TEST_F(GcTest, HeadThenSkipAcrossAWholeRoundLosesNoChunk) {
  const Bytes data = test::RandomBytes(1 << 20, 5);
  ASSERT_NO_FATAL_FAILURE(LeaveGarbage(data));

  test::SharedBackend* bb = nullptr;
  auto b = OpenNode("b", &bb);
  std::atomic<bool> fired{false};
  GcReport round;
  bb->on_head = [&](const std::string& key) {
    if (key.rfind("chunks/", 0) != 0 || fired.exchange(true)) return;
    auto r = Collect();  // between b's HEAD (the chunk was there) and its answer
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    round = *r;
  };
  Write(*b, "new.pt", data);  // the same bytes: every chunk dedups against a's garbage
  ASSERT_TRUE(b->remote()->Drain(60).ok());
  ASSERT_TRUE(fired);
  EXPECT_GT(round.deleted, 0u);  // the round did delete the chunks b had found
  EXPECT_GT(b->metrics().chunks_uploaded.Get(), 0u);  // and b put them back
  CheckRecords();
  auto back = ReadCold("new.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
}

// A node that sees the round active holds back the file naming a condemned chunk until the
// round is over, then uploads what the sweep deleted.
TEST_F(GcTest, AFileNamingACondemnedChunkWaitsForTheRound) {
  const Bytes data = test::RandomBytes(1 << 20, 6);
  ASSERT_NO_FATAL_FAILURE(LeaveGarbage(data));

  test::SharedBackend* bb = nullptr;
  auto b = OpenNode("b", &bb);
  std::atomic<bool> record_during_round{false};
  bb->on_put = [&](const std::string& key) {
    if (key != "files/new.pt") return;
    auto rec = FileRecord::Decode(*mem_.GetObject(key));
    if (!rec.ok() || rec->manifest.extents().empty()) return;  // created empty: names nothing
    auto round = ReadGcRound(mem_);
    if (!round.ok() || round->active) record_during_round = true;
  };
  GcReport report;
  std::thread collector([&] {
    auto r = Collect(1.5);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    report = *r;
  });
  // Once the round is active, b writes the same bytes.
  for (int i = 0; i < 500; ++i) {
    auto round = ReadGcRound(mem_);
    if (round.ok() && round->active) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A view of gc/round read just before the round began stays good for b for half a window; a
  // publish in that time is safe (the collector's second listing sees its record), but this
  // test is about the other case.
  std::this_thread::sleep_for(std::chrono::duration<double>(kWindow));
  Write(*b, "new.pt", data);
  collector.join();
  ASSERT_TRUE(b->remote()->Drain(60).ok());
  EXPECT_FALSE(record_during_round);
  EXPECT_GT(report.deleted, 0u);
  CheckRecords();
  auto back = ReadCold("new.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
}

// As below, while the node's upload queue backs off for seconds (a backend refusing its
// uploads): the node keeps following gc rounds every half window, so it sees the round active
// and fetches its chunks back before the sweep.
TEST_F(GcTest, ANodeBackingOffFromFailingUploadsStillFetchesBackCondemnedChunks) {
  test::SharedBackend* ab = nullptr;
  auto a = OpenNode("a", &ab, 1 << 20);  // a small local tier: uploaded chunks are evicted
  std::vector<std::pair<uint64_t, Bytes>> files;
  ASSERT_NO_FATAL_FAILURE(SaveDeletedElsewhere(*a, 80, &files));
  std::atomic<bool> refuse{true};
  ab->fail_put = [&](const std::string& key) { return refuse && key.rfind("chunks/", 0) == 0; };
  Write(*a, "stuck.pt", test::RandomBytes(64 << 10, 90));
  // Failures back off 0.1 s doubling: after 4 s the queue waits seconds between tries.
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const uint64_t fetched_before = a->metrics().remote_fetches.Get();
  auto r = Collect(1.0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->deleted, 0u);
  EXPECT_GT(a->metrics().remote_fetches.Get(), fetched_before);  // evicted copies came back
  for (const auto& [ino, data] : files) EXPECT_EQ(Read(*a, ino), data);
  refuse = false;
  ASSERT_TRUE(a->remote()->Drain(60).ok());
}

// A node evicted its copies of chunks the backend held; a round condemns them while a file on
// the node still names them (its record is gone from the bucket). The node fetches them back
// before the sweep, and can still read the file afterwards.
TEST_F(GcTest, ANodeFetchesBackCondemnedChunksItsFilesName) {
  auto a = OpenNode("a", nullptr, 1 << 20);  // a small local tier: uploaded chunks are evicted
  std::vector<std::pair<uint64_t, Bytes>> files;
  ASSERT_NO_FATAL_FAILURE(SaveDeletedElsewhere(*a, 70, &files));
  const uint64_t fetched_before = a->metrics().remote_fetches.Get();
  auto r = Collect(1.0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->deleted, 0u);
  EXPECT_EQ(Count("chunks/"), 0u);
  EXPECT_GT(a->metrics().remote_fetches.Get(), fetched_before);  // evicted copies came back
  for (const auto& [ino, data] : files) EXPECT_EQ(Read(*a, ino), data);
}

// The namespace sync reads a record, then a round deletes that record's chunks (the record was
// deleted meanwhile) and ends on the reading node before the sync applies it. The stale record
// must not leave marks saying the backend holds those chunks: a later file with the same bytes
// would skip their upload.
TEST_F(GcTest, ASyncOfARecordReadBeforeARoundMarksNothing) {
  const Bytes data = test::RandomBytes(1 << 20, 9);
  auto a = OpenNode("a");
  Write(*a, "x.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  test::SharedBackend* bb = nullptr;
  auto b = OpenNode("b", &bb);
  std::atomic<bool> fired{false};
  bb->on_get = [&](const std::string& key) {
    if (key != "files/x.pt" || fired.exchange(true)) return;
    ASSERT_TRUE(a->Unlink(kRootIno, "x.pt").ok());
    ASSERT_TRUE(a->remote()->Drain(30).ok());
    auto r = Collect();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_GT(r->deleted, 0u);
    // b's worker takes the round's end into account (it reads gc/round every half window).
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * kWindow));
  };
  ASSERT_TRUE(b->SyncFromRemote().ok());
  ASSERT_TRUE(fired);
  Write(*b, "y.pt", data);
  ASSERT_TRUE(b->remote()->Drain(60).ok());
  CheckRecords();
  auto back = ReadCold("y.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
}

// A file committed here and not yet published names chunks the backend holds for another file.
// While the node cannot publish (or see gc rounds), the bucket may lose those chunks; the node's
// copies must not have been evicted meanwhile, however full its local tier gets.
TEST_F(GcTest, ChunksOfAFileNotYetPublishedAreNeverEvicted) {
  auto a = OpenNode("a", nullptr, 1 << 20);
  const Bytes data = test::RandomBytes(512 << 10, 10);
  Write(*a, "x.pt", data);
  ASSERT_TRUE(a->remote()->Drain(30).ok());  // in the bucket, so evictable here
  std::vector<std::string> x_chunks;
  ASSERT_TRUE(mem_.List("chunks/", "", [&](const ObjectInfo& o) {
    return x_chunks.push_back(o.key), true;
  }).ok());
  a->remote()->Stop();  // a can no longer publish
  const uint64_t y = Write(*a, "y.pt", data);  // the same bytes: nothing new on disk
  // a reads another node's 1 MiB file: its fetches fill the local tier and evict.
  auto b = OpenNode("b");
  Write(*b, "z.pt", test::RandomBytes(1 << 20, 11));
  ASSERT_TRUE(b->remote()->Drain(30).ok());
  ASSERT_TRUE(a->SyncFromRemote().ok());
  auto z = a->Lookup(kRootIno, "z.pt");
  ASSERT_TRUE(z.ok());
  Read(*a, z->ino);
  EXPECT_GT(a->metrics().chunks_evicted.Get(), 0u);
  // x is deleted elsewhere and a round a never saw sweeps its chunks.
  for (const std::string& k : x_chunks) ASSERT_TRUE(mem_.Delete(k).ok());
  EXPECT_EQ(Read(*a, y), data);
}

// A gc/round this node cannot read (damaged, or of a later version) holds publishing back; it
// never drops a file from the upload queue.
TEST_F(GcTest, AnUnreadableRoundDelaysPublishingAndDropsNothing) {
  ASSERT_TRUE(mem_.Put(kGcRoundKey, "ckptfs-gc-round 9\n", 18).ok());
  auto a = OpenNode("a");
  const Bytes data = test::RandomBytes(256 << 10, 8);
  Write(*a, "x.pt", data);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_FALSE(mem_.Head("files/x.pt").ok());
  ASSERT_TRUE(mem_.Delete(kGcRoundKey).ok());
  ASSERT_TRUE(a->remote()->Drain(60).ok());
  auto back = ReadCold("x.pt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
}

// Three nodes write, rewrite and delete files built from a small pool of blocks (so that chunks
// dedup across files and nodes, and garbage is often reused) while a collector runs round after
// round, with injected faults. No record ever names a missing chunk, every surviving file reads
// back on a cold node, and a last round leaves exactly the chunks the records name.
TEST_F(GcTest, ConcurrentWritersAndCollectionsLoseNothing) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::vector<Bytes> pool;
    for (int i = 0; i < 12; ++i) pool.push_back(test::RandomBytes(96 << 10, seed * 100 + i));
    std::vector<std::unique_ptr<Store>> nodes;
    for (int n = 0; n < 3; ++n) {
      test::SharedBackend* sb = nullptr;
      nodes.push_back(OpenNode("s" + std::to_string(seed) + "n" + std::to_string(n), &sb));
      sb->fail_rate = 0.05;
      sb->seed = seed * 10 + n;
    }
    std::atomic<bool> stop{false};
    std::atomic<int> rounds{0};
    std::atomic<uint64_t> deleted{0};
    std::thread collector([&] {
      while (!stop) {
        auto r = Collect(0.3);
        if (r.ok() && r->epoch > 0) ++rounds, deleted += r->deleted;
      }
    });
    std::vector<std::map<std::string, Bytes>> expect(3);
    std::vector<std::thread> writers;
    for (int n = 0; n < 3; ++n) {
      writers.emplace_back([&, n] {
        std::mt19937_64 rng(seed * 7 + n);
        Store& s = *nodes[n];
        for (int step = 0; step < 40; ++step) {
          const std::string name = "n" + std::to_string(n) + "-" + std::to_string(rng() % 5);
          if (rng() % 4 == 0 && expect[n].count(name)) {
            EXPECT_TRUE(s.Unlink(kRootIno, name).ok());
            expect[n].erase(name);
          } else {
            Bytes data;
            for (int k = 0, blocks = 1 + rng() % 4; k < blocks; ++k) {
              const Bytes& b = pool[rng() % pool.size()];
              data.insert(data.end(), b.begin(), b.end());
            }
            Write(s, name, data);
            expect[n][name] = data;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
        }
      });
    }
    for (auto& w : writers) w.join();
    for (auto& node : nodes) ASSERT_TRUE(node->remote()->Drain(120).ok());
    stop = true;
    collector.join();
    EXPECT_GT(rounds.load(), 0);
    EXPECT_GT(deleted.load(), 0u);  // the rounds ran while the nodes saved, not only after
    CheckRecords();
    // Idle: one more round removes every chunk no record names.
    auto last = Collect(0.3);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_EQ(CheckRecords(), Count("chunks/"));
    for (int n = 0; n < 3; ++n) {
      for (const auto& [name, data] : expect[n]) {
        auto back = ReadCold(name);
        ASSERT_TRUE(back.ok()) << name << ": " << back.status().ToString();
        EXPECT_EQ(*back, data) << name;
      }
    }
    nodes.clear();
    // The next seed starts from an empty bucket.
    std::vector<std::string> keys;
    ASSERT_TRUE(mem_.List("", "", [&](const ObjectInfo& o) { return keys.push_back(o.key), true; }).ok());
    for (const auto& k : keys) ASSERT_TRUE(mem_.Delete(k).ok());
  }
}

}  // namespace
}  // namespace ckptfs
