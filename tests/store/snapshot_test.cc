// The record snapshot (store/snapshot.h): a new mount reads the newest snapshot and the journal
// after it instead of every record, and ends with exactly the bucket's namespace, whatever
// changed after the snapshot's journal entry or while it was written. A snapshot that cannot be
// trusted (a damaged part, no manifest, a journal truncated past it) sends the mount to the full
// listing, which ends in the same namespace.
#include "store/snapshot.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "store/journal.h"
#include "store/store.h"
#include "tests/store/shared_backend.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using Bytes = std::vector<uint8_t>;

// A SharedBackend that also tells of each listing before it runs.
class ListHook : public test::SharedBackend {
 public:
  using SharedBackend::SharedBackend;
  std::function<void(const std::string& prefix)> on_list;
  Status List(const std::string& p, const std::string& a,
              const std::function<bool(const ObjectInfo&)>& fn) override {
    if (on_list) on_list(p);
    return SharedBackend::List(p, a, fn);
  }
};

class SnapshotTest : public test::NodesTest {
 protected:
  // Every path under the root of s, directories with a trailing '/', files with their bytes.
  std::map<std::string, Bytes> Tree(Store& s) {
    std::map<std::string, Bytes> out;
    std::function<void(uint64_t, const std::string&)> walk = [&](uint64_t dir,
                                                                 const std::string& at) {
      std::vector<std::pair<std::string, std::pair<uint64_t, uint32_t>>> items;
      EXPECT_TRUE(s.ReadDir(dir, 0, [&](const DirItem& it) {
                     if (it.name != "." && it.name != "..") {
                       items.push_back({std::string(it.name), {it.ino, it.mode}});
                     }
                     return true;
                   }).ok());
      for (const auto& [name, im] : items) {
        if (S_ISDIR(im.second)) {
          out[at + name + "/"] = {};
          walk(im.first, at + name + "/");
        } else {
          out[at + name] = Read(s, im.first);
        }
      }
    };
    walk(kRootIno, "");
    return out;
  }

  uint64_t Dir(Store& s, uint64_t parent, const std::string& name) {
    auto r = s.MakeNode(parent, name, S_IFDIR | 0755, 0, Caller{});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->ino : 0;
  }

  // Node a with `files` files under ck/ and a directory keep/, all in the bucket.
  std::unique_ptr<Store> Populate(int files) {
    auto a = OpenStore("a");
    const uint64_t ck = Dir(*a, kRootIno, "ck");
    Dir(*a, kRootIno, "keep");
    Dir(*a, kRootIno, "old");
    for (int i = 0; i < files; ++i) {
      Write(*a, ck, "rank" + std::to_string(i), test::RandomBytes(8 << 10, 100 + i));
    }
    EXPECT_TRUE(a->remote()->Drain(30).ok());
    return a;
  }

  static NamespaceSnapshot::Written Snap(Backend& b) {
    NamespaceSnapshot::WriteOptions opts;
    opts.part_bytes = 2 << 10;  // several parts
    auto w = NamespaceSnapshot::Write(b, opts);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? *w : NamespaceSnapshot::Written{};
  }

  // Replaces ck/rank1, deletes ck/rank2, adds ck/new and new/, removes old/ on node a.
  void ChangeAfter(Store& a) {
    const uint64_t ck = a.Lookup(kRootIno, "ck")->ino;
    Write(a, ck, "rank1", test::RandomBytes(12 << 10, 7));
    ASSERT_TRUE(a.Unlink(ck, "rank2").ok());
    Write(a, ck, "new", test::RandomBytes(4 << 10, 8));
    Dir(a, kRootIno, "new");
    ASSERT_TRUE(a.Rmdir(kRootIno, "old").ok());
    ASSERT_TRUE(a.remote()->Drain(30).ok());
  }

  // A fresh node's first pass: the files/ records it read, and all its requests.
  struct Mounted {
    std::unique_ptr<Store> store;
    std::set<std::string> records_read;
    uint64_t requests = 0;
  };
  Mounted Mount(const std::string& name) {
    struct Seen {
      std::mutex mu;
      std::set<std::string> keys;
    };
    auto seen = std::make_shared<Seen>();  // the store's own threads may GET after this returns
    Mounted m;
    test::SharedBackend* b = nullptr;
    m.store = OpenStore(name, &b);
    b->on_get = [seen](const std::string& key) {
      std::lock_guard lock(seen->mu);
      if (key.rfind("files/", 0) == 0) seen->keys.insert(key);
    };
    mem_.ResetStats();
    EXPECT_TRUE(m.store->SyncFromRemote().ok());
    const auto st = mem_.stats();
    m.requests = st.gets + st.heads + st.puts + st.deletes + st.lists;
    std::lock_guard lock(seen->mu);
    m.records_read = seen->keys;
    return m;
  }
};

TEST_F(SnapshotTest, ANewMountReadsTheSnapshotThenTheJournalAfterIt) {
  constexpr int kFiles = 40;
  auto a = Populate(kFiles);
  const auto w = Snap(mem_);
  ASSERT_GE(w.manifest.parts.size(), 2u);
  EXPECT_EQ(w.files, uint64_t{kFiles});
  ChangeAfter(*a);
  NamespaceJournal reader(&mem_, "reader");
  auto after = reader.ReadAfter(w.manifest.journal);
  ASSERT_TRUE(after.ok());
  const size_t entries = after->keys.size();
  EXPECT_GE(entries, 5u);

  Mounted b = Mount("b");
  EXPECT_EQ(Tree(*b.store), Tree(*a));
  // Only the records named after J were read (rank2's is gone: its HEAD answers), and the whole
  // pass stays within the goal.
  EXPECT_EQ(b.records_read, (std::set<std::string>{"files/ck/rank1", "files/ck/new"}));
  EXPECT_LE(b.requests, 50 + 2 * entries);

  // The next passes follow the journal from there.
  Write(*a, a->Lookup(kRootIno, "keep")->ino, "later", test::RandomBytes(1 << 10, 9));
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  ASSERT_TRUE(b.store->SyncFromRemote().ok());
  EXPECT_EQ(Tree(*b.store), Tree(*a));
}

TEST_F(SnapshotTest, ARestartedNodeIsNotSetBackToTheSnapshotsStateOfWhatItPublishedSince) {
  auto a = Populate(3);
  const uint64_t ck = a->Lookup(kRootIno, "ck")->ino;
  Snap(mem_);
  const Bytes v2 = test::RandomBytes(20 << 10, 77);
  const uint64_t ino = Write(*a, ck, "rank1", v2);
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  const uint64_t generation = a->GetAttr(ino)->generation;
  ASSERT_TRUE(a->Close().ok());
  a.reset();
  // The same node again, on its cache directory: the snapshot holds rank1's older record, and
  // the journal after it names rank1. It is left as it is (no new generation), not replaced by
  // the old record and then by the new one again.
  a = OpenStore("a");
  ASSERT_TRUE(a->SyncFromRemote().ok());
  EXPECT_EQ(a->GetAttr(ino)->generation, generation);
  EXPECT_EQ(Read(*a, ino), v2);
}

TEST_F(SnapshotTest, AWriterRacingTheSnapshotEndsConverged) {
  auto a = Populate(12);
  const uint64_t ck = a->Lookup(kRootIno, "ck")->ino;
  // Changes between the writer's reading of J and its listing, and between the listing and its
  // reading of the records.
  ListHook writer(&mem_);
  bool listed = false, read = false;
  writer.on_list = [&](const std::string& prefix) {
    if (prefix != "dirs/" || listed) return;
    listed = true;
    Write(*a, ck, "rank3", test::RandomBytes(9 << 10, 30));
    Write(*a, ck, "before-listing", test::RandomBytes(3 << 10, 31));
    ASSERT_TRUE(a->Unlink(ck, "rank4").ok());
    ASSERT_TRUE(a->remote()->Drain(30).ok());
  };
  writer.on_get = [&](const std::string& key) {
    if (key.rfind("files/", 0) != 0 || read) return;
    read = true;
    Write(*a, ck, "rank5", test::RandomBytes(9 << 10, 32));
    Write(*a, ck, "rank0", test::RandomBytes(9 << 10, 33));  // read after this, or before
    ASSERT_TRUE(a->Unlink(ck, "rank6").ok());
    Write(*a, ck, "after-listing", test::RandomBytes(3 << 10, 34));
    ASSERT_TRUE(a->remote()->Drain(30).ok());
  };
  Snap(writer);
  ASSERT_TRUE(listed && read);
  Mounted b = Mount("b");
  EXPECT_EQ(Tree(*b.store), Tree(*a));
  EXPECT_LT(b.records_read.size(), 12u);
}

TEST_F(SnapshotTest, ADamagedPartOrAMissingManifestSendsTheMountToTheListing) {
  constexpr int kFiles = 20;
  auto a = Populate(kFiles);
  const auto w = Snap(mem_);
  ChangeAfter(*a);
  const auto expected = Tree(*a);

  // One byte flipped in a part: its sum does not check.
  const std::string part = w.manifest.parts[1].key;
  std::string bytes = *mem_.GetObject(part);
  bytes[bytes.size() / 2] ^= 1;
  ASSERT_TRUE(mem_.Put(part, bytes.data(), bytes.size()).ok());
  Mounted b = Mount("b");
  EXPECT_EQ(Tree(*b.store), expected);
  EXPECT_EQ(b.records_read.size(), size_t{kFiles});  // every record: the listing

  // A part cut short.
  bytes = *mem_.GetObject(w.manifest.parts[0].key);
  bytes.resize(bytes.size() - 10);
  ASSERT_TRUE(mem_.Put(w.manifest.parts[0].key, bytes.data(), bytes.size()).ok());
  Mounted c = Mount("c");
  EXPECT_EQ(Tree(*c.store), expected);
  EXPECT_EQ(c.records_read.size(), size_t{kFiles});

  // A snapshot whose manifest never came (its writer died) is none.
  const auto w2 = Snap(mem_);
  Mounted d = Mount("d");
  EXPECT_LT(d.records_read.size(), 3u);
  ASSERT_TRUE(mem_.Delete(NamespaceSnapshot::ManifestKey(w2.manifest.dir)).ok());
  ASSERT_TRUE(mem_.Delete(NamespaceSnapshot::ManifestKey(w.manifest.dir)).ok());
  Mounted e = Mount("e");
  EXPECT_EQ(Tree(*e.store), expected);
  EXPECT_EQ(e.records_read.size(), size_t{kFiles});
}

TEST_F(SnapshotTest, AJournalTruncatedPastTheSnapshotSendsTheMountToTheListing) {
  auto a = Populate(10);
  const auto w = Snap(mem_);
  ChangeAfter(*a);
  NamespaceJournal journal(&mem_, "gc");
  ASSERT_TRUE(journal.Truncate(2).ok());  // the entries just after J are gone
  Mounted b = Mount("b");
  // rank2 was in the snapshot and is deleted since: the listing must not leave it behind.
  EXPECT_EQ(Tree(*b.store), Tree(*a));
  EXPECT_EQ(b.records_read.size(), 10u);
  (void)w;
}

TEST_F(SnapshotTest, TruncationKeepsEveryEntryAfterTheSnapshot) {
  auto a = Populate(5);
  const auto w = Snap(mem_);
  ChangeAfter(*a);
  NamespaceJournal journal(&mem_, "gc");
  auto dropped = journal.Truncate(1, w.manifest.journal);
  ASSERT_TRUE(dropped.ok());
  EXPECT_GT(*dropped, 0u);
  auto after = journal.ReadAfter(w.manifest.journal);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->gap);
  EXPECT_GE(after->keys.size(), 5u);
  Mounted b = Mount("b");
  EXPECT_EQ(Tree(*b.store), Tree(*a));
  EXPECT_LE(b.records_read.size(), 3u);
}

TEST_F(SnapshotTest, OlderSnapshotsArePrunedAndTheNewestIsRead) {
  auto a = Populate(4);
  const auto w1 = Snap(mem_);
  Write(*a, a->Lookup(kRootIno, "keep")->ino, "x", test::RandomBytes(1 << 10, 5));
  ASSERT_TRUE(a->remote()->Drain(30).ok());
  const auto w2 = Snap(mem_);
  const auto w3 = Snap(mem_);
  EXPECT_GT(w2.manifest.journal, w1.manifest.journal);
  EXPECT_GT(w3.pruned, 0u);
  EXPECT_FALSE(mem_.Head(NamespaceSnapshot::ManifestKey(w1.manifest.dir)).ok());
  EXPECT_TRUE(mem_.Head(NamespaceSnapshot::ManifestKey(w2.manifest.dir)).ok());
  auto newest = NamespaceSnapshot::Newest(mem_);
  ASSERT_TRUE(newest.ok());
  ASSERT_TRUE(newest->has_value());
  EXPECT_EQ((*newest)->journal, w3.manifest.journal);
  EXPECT_EQ((*newest)->entries(), 4u + 1 + 3);  // files, and the directories ck, keep, old
}

TEST(SnapshotFormat, AManifestThatDoesNotCheckIsRejected) {
  NamespaceSnapshot::Manifest m;
  m.journal = 42;
  m.dir = "snapshot/00000000000000000042-0123456789abcdef/";
  m.parts.push_back({m.dir + "part-000000", 100, 3, std::string(32, 'a')});
  const std::string good = NamespaceSnapshot::EncodeManifest(m);
  auto back = NamespaceSnapshot::DecodeManifest(m.dir, good);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->journal, 42u);
  ASSERT_EQ(back->parts.size(), 1u);
  EXPECT_EQ(back->parts[0].key, m.dir + "part-000000");
  EXPECT_EQ(back->parts[0].size, 100u);
  // Another directory's J, a flipped byte, a cut: kCorrupt.
  EXPECT_EQ(NamespaceSnapshot::DecodeManifest("snapshot/00000000000000000041-0123456789abcdef/",
                                              good)
                .status()
                .code(),
            Code::kCorrupt);
  std::string bad = good;
  bad[20] ^= 1;
  EXPECT_EQ(NamespaceSnapshot::DecodeManifest(m.dir, bad).status().code(), Code::kCorrupt);
  EXPECT_EQ(NamespaceSnapshot::DecodeManifest(m.dir, good.substr(0, good.size() - 5))
                .status()
                .code(),
            Code::kCorrupt);
  // A part larger than a reader accepts, though the sum checks.
  m.parts[0].size = NamespaceSnapshot::kMaxPartBytes + 1;
  EXPECT_EQ(NamespaceSnapshot::DecodeManifest(m.dir, NamespaceSnapshot::EncodeManifest(m))
                .status()
                .code(),
            Code::kCorrupt);
}

TEST(SnapshotFormat, APartWhoseEntriesOverrunIsRejected) {
  MemBackend mem;
  // A part whose sum checks but whose entry claims more bytes than there are.
  std::string part = "ckptfs-snapshot-part 1\n";
  part += std::string("\x05\x00\x00\x00", 4) + "dirs/";
  part += std::string("\xff\xff\xff\x7f", 4);
  ASSERT_TRUE(mem.Put("snapshot/p", part.data(), part.size()).ok());
  NamespaceSnapshot::Part p{"snapshot/p", part.size(), 1,
                            ChunkId::Of(part.data(), part.size()).Hex()};
  int seen = 0;
  Status st = NamespaceSnapshot::ReadPart(mem, p, [&](NamespaceSnapshot::Entry&&) {
    ++seen;
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_EQ(seen, 0);
}

}  // namespace
}  // namespace ckptfs
