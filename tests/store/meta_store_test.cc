#include "store/meta_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMapBytes = 64ull << 20;

class MetaStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  void Reopen() {
    store_.reset();
    auto s = MetaStore::Open(dir_.Sub("meta"), kMapBytes);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  MetaStore::Txn Begin(bool write) {
    auto t = store_->Begin(write);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::move(*t);
  }

  // A directory inode written in its own transaction.
  InodeRecord MakeDir(uint64_t ino) {
    InodeRecord d;
    d.ino = ino;
    d.mode = S_IFDIR | 0755;
    d.nlink = 2;
    auto t = Begin(true);
    EXPECT_TRUE(t.PutInode(d).ok());
    EXPECT_TRUE(t.Commit().ok());
    return d;
  }

  test::TempDir dir_;
  std::unique_ptr<MetaStore> store_;
};

InodeRecord FullInode() {
  InodeRecord r;
  r.ino = 0x0102030405060708ull;
  r.mode = S_IFREG | 04755;
  r.uid = 0xfffffffeu;
  r.gid = 12345;
  r.nlink = 7;
  r.size = (1ull << 50) + 3;
  r.rdev = 0xdeadbeefcafeull;
  r.atime_ns = -5;  // before the epoch
  r.mtime_ns = 1700000000123456789;
  r.ctime_ns = INT64_MIN + 1;
  r.next_cookie = 99;
  r.generation = ~0ull;
  return r;
}

void ExpectSameInode(const InodeRecord& a, const InodeRecord& b) {
  EXPECT_EQ(a.ino, b.ino);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.uid, b.uid);
  EXPECT_EQ(a.gid, b.gid);
  EXPECT_EQ(a.nlink, b.nlink);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.rdev, b.rdev);
  EXPECT_EQ(a.atime_ns, b.atime_ns);
  EXPECT_EQ(a.mtime_ns, b.mtime_ns);
  EXPECT_EQ(a.ctime_ns, b.ctime_ns);
  EXPECT_EQ(a.next_cookie, b.next_cookie);
  EXPECT_EQ(a.generation, b.generation);
}

TEST_F(MetaStoreTest, InodeRoundTripsEveryField) {
  const InodeRecord r = FullInode();
  {
    auto t = Begin(true);
    ASSERT_TRUE(t.PutInode(r).ok());
    ASSERT_TRUE(t.Commit().ok());
  }
  auto t = Begin(false);
  auto got = t.GetInode(r.ino);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameInode(*got, r);
  EXPECT_EQ(t.GetInode(r.ino + 1).status().code(), Code::kNotFound);
}

TEST_F(MetaStoreTest, AbortedWritesAreInvisible) {
  {
    auto t = Begin(true);
    ASSERT_TRUE(t.PutInode(FullInode()).ok());
    // Destroyed without Commit: aborted.
  }
  auto t = Begin(false);
  EXPECT_EQ(t.GetInode(FullInode().ino).status().code(), Code::kNotFound);
}

TEST_F(MetaStoreTest, DelInode) {
  auto t = Begin(true);
  ASSERT_TRUE(t.PutInode(FullInode()).ok());
  ASSERT_TRUE(t.DelInode(FullInode().ino).ok());
  EXPECT_EQ(t.GetInode(FullInode().ino).status().code(), Code::kNotFound);
  EXPECT_TRUE(t.DelInode(FullInode().ino).ok());  // already gone: fine
}

TEST_F(MetaStoreTest, AllocInoIsMonotonicAcrossTransactionsAndReopen) {
  uint64_t last = kRootIno;
  for (int round = 0; round < 3; ++round) {
    auto t = Begin(true);
    for (int i = 0; i < 10; ++i) {
      auto ino = t.AllocIno();
      ASSERT_TRUE(ino.ok());
      EXPECT_EQ(*ino, last + 1);
      last = *ino;
    }
    ASSERT_TRUE(t.Commit().ok());
    Reopen();
  }
  // An aborted allocation is handed out again.
  {
    auto t = Begin(true);
    EXPECT_EQ(*t.AllocIno(), last + 1);
  }
  auto t = Begin(true);
  EXPECT_EQ(*t.AllocIno(), last + 1);
}

TEST_F(MetaStoreTest, EntriesPutGetDel) {
  InodeRecord root = MakeDir(kRootIno);
  auto t = Begin(true);
  ASSERT_TRUE(t.PutEntry(root, "a", 10, S_IFREG | 0644).ok());
  ASSERT_TRUE(t.PutEntry(root, "b", 11, S_IFDIR | 0755).ok());
  EXPECT_EQ(root.next_cookie, 3u);
  auto a = t.GetEntry(kRootIno, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ino, 10u);
  EXPECT_EQ(a->cookie, 1u);
  EXPECT_EQ(a->mode, uint32_t{S_IFREG});  // only the type bits are kept
  auto b = t.GetEntry(kRootIno, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->cookie, 2u);
  EXPECT_EQ(b->mode, uint32_t{S_IFDIR});
  EXPECT_EQ(t.GetEntry(kRootIno, "c").status().code(), Code::kNotFound);
  EXPECT_EQ(t.GetEntry(kRootIno + 1, "a").status().code(), Code::kNotFound);

  // Replacing a name keeps its cookie and does not use a new one.
  ASSERT_TRUE(t.PutEntry(root, "a", 12, S_IFLNK | 0777).ok());
  EXPECT_EQ(root.next_cookie, 3u);
  a = t.GetEntry(kRootIno, "a");
  EXPECT_EQ(a->ino, 12u);
  EXPECT_EQ(a->cookie, 1u);
  EXPECT_EQ(a->mode, uint32_t{S_IFLNK});

  ASSERT_TRUE(t.DelEntry(kRootIno, "a").ok());
  EXPECT_EQ(t.GetEntry(kRootIno, "a").status().code(), Code::kNotFound);
  EXPECT_EQ(t.DelEntry(kRootIno, "a").code(), Code::kNotFound);
  EXPECT_TRUE(t.GetEntry(kRootIno, "b").ok());
}

TEST_F(MetaStoreTest, ListDirInCookieOrderAndResumes) {
  InodeRecord d = MakeDir(5);
  InodeRecord other = MakeDir(6);
  auto t = Begin(true);
  // Names whose byte order differs from creation order.
  const std::vector<std::string> names = {"zeta", "alpha", "mid", "Beta", "a", "zz", "0"};
  for (size_t i = 0; i < names.size(); ++i)
    ASSERT_TRUE(t.PutEntry(d, names[i], 100 + i, S_IFREG).ok());
  ASSERT_TRUE(t.PutEntry(other, "stranger", 200, S_IFREG).ok());
  ASSERT_TRUE(t.PutInode(d).ok());
  ASSERT_TRUE(t.DelEntry(5, "mid").ok());

  auto list = [&](uint64_t after, size_t limit) {
    std::vector<std::pair<std::string, uint64_t>> out;
    Status st = t.ListDir(5, after, [&](std::string_view name, const DirEntry& e) {
      if (out.size() == limit) return false;
      out.emplace_back(std::string(name), e.cookie);
      return true;
    });
    EXPECT_TRUE(st.ok());
    return out;
  };
  auto all = list(0, 100);
  std::vector<std::string> got;
  for (auto& [n, c] : all) got.push_back(n);
  EXPECT_EQ(got, (std::vector<std::string>{"zeta", "alpha", "Beta", "a", "zz", "0"}));
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LT(all[i - 1].second, all[i].second);

  // Two at a time, resuming after the last cookie seen.
  std::vector<std::string> paged;
  uint64_t after = 0;
  while (true) {
    auto page = list(after, 2);
    if (page.empty()) break;
    for (auto& [n, c] : page) paged.push_back(n);
    after = page.back().second;
  }
  EXPECT_EQ(paged, got);
  // Resuming after the deleted entry's cookie (3) continues with the next one.
  auto rest = list(3, 100);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.front().first, "Beta");
  EXPECT_TRUE(list(all.back().second, 100).empty());
}

TEST_F(MetaStoreTest, DirEmpty) {
  InodeRecord d = MakeDir(5);
  InodeRecord next = MakeDir(6);
  auto t = Begin(true);
  EXPECT_TRUE(t.DirEmpty(5));
  ASSERT_TRUE(t.PutEntry(next, "x", 9, S_IFREG).ok());  // a neighbour's entry does not count
  EXPECT_TRUE(t.DirEmpty(5));
  ASSERT_TRUE(t.PutEntry(d, "f", 10, S_IFREG).ok());
  EXPECT_FALSE(t.DirEmpty(5));
  ASSERT_TRUE(t.DelEntry(5, "f").ok());
  EXPECT_TRUE(t.DirEmpty(5));
  EXPECT_FALSE(t.DirEmpty(6));
}

TEST_F(MetaStoreTest, Manifests) {
  Manifest m;
  m.Append({ChunkId{1, 2}, 4096});
  m.AppendHole(100);
  m.Append({ChunkId{3, 4}, 7});
  Manifest m2;
  m2.Append({ChunkId{5, 6}, 1});
  auto t = Begin(true);
  auto none = t.GetManifest(20);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(t.PutManifest(20, m).ok());
  ASSERT_TRUE(t.PutManifest(21, m2).ok());
  auto got = t.GetManifest(20);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, m);
  std::vector<std::pair<uint64_t, uint64_t>> seen;  // ino, size
  ASSERT_TRUE(t.ForEachManifest([&](uint64_t ino, const Manifest& x) {
                 seen.emplace_back(ino, x.size());
               }).ok());
  EXPECT_EQ(seen, (std::vector<std::pair<uint64_t, uint64_t>>{{20, m.size()}, {21, 1}}));
  ASSERT_TRUE(t.DelManifest(20).ok());
  EXPECT_FALSE(t.GetManifest(20)->has_value());
  EXPECT_TRUE(t.DelManifest(20).ok());
}

TEST_F(MetaStoreTest, Symlinks) {
  auto t = Begin(true);
  EXPECT_EQ(t.GetSymlink(30).status().code(), Code::kNotFound);
  const std::string target(4095, 'x');
  ASSERT_TRUE(t.PutSymlink(30, target).ok());
  ASSERT_TRUE(t.PutSymlink(31, "../a/b").ok());
  EXPECT_EQ(*t.GetSymlink(30), target);
  EXPECT_EQ(*t.GetSymlink(31), "../a/b");
  ASSERT_TRUE(t.DelSymlink(30).ok());
  EXPECT_EQ(t.GetSymlink(30).status().code(), Code::kNotFound);
}

TEST_F(MetaStoreTest, Xattrs) {
  auto t = Begin(true);
  EXPECT_EQ(t.GetXattr(40, "user.a").status().code(), Code::kNoData);
  EXPECT_EQ(t.DelXattr(40, "user.a").code(), Code::kNoData);
  const std::string binary("\0\x01\xff", 3);
  ASSERT_TRUE(t.PutXattr(40, "user.b", binary).ok());
  ASSERT_TRUE(t.PutXattr(40, "user.a", "").ok());
  ASSERT_TRUE(t.PutXattr(41, "user.other", "v").ok());
  EXPECT_EQ(*t.GetXattr(40, "user.b"), binary);
  EXPECT_EQ(*t.GetXattr(40, "user.a"), "");
  std::vector<std::string> names;
  ASSERT_TRUE(t.ListXattrs(40, [&](std::string_view n) { names.emplace_back(n); }).ok());
  EXPECT_EQ(names, (std::vector<std::string>{"user.a", "user.b"}));
  ASSERT_TRUE(t.PutXattr(40, "user.b", "replaced").ok());
  EXPECT_EQ(*t.GetXattr(40, "user.b"), "replaced");
  ASSERT_TRUE(t.DelXattr(40, "user.a").ok());
  EXPECT_EQ(t.GetXattr(40, "user.a").status().code(), Code::kNoData);
  ASSERT_TRUE(t.DelAllXattrs(40).ok());
  names.clear();
  ASSERT_TRUE(t.ListXattrs(40, [&](std::string_view n) { names.emplace_back(n); }).ok());
  EXPECT_TRUE(names.empty());
  EXPECT_EQ(*t.GetXattr(41, "user.other"), "v");  // another inode's are kept
}

TEST_F(MetaStoreTest, ChunkRefCounts) {
  const ChunkId a{0xaa, 1}, b{0xbb, 2};
  auto t = Begin(true);
  auto none = t.GetChunk(a);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->refs, 0u);
  EXPECT_EQ(*t.AddChunkRefs(a, 4096, 1), 1u);
  EXPECT_EQ(*t.AddChunkRefs(a, 4096, 2), 3u);
  EXPECT_EQ(*t.AddChunkRefs(b, 10, 5), 5u);
  auto rec = t.GetChunk(a);
  EXPECT_EQ(rec->refs, 3u);
  EXPECT_EQ(rec->len, 4096u);
  EXPECT_EQ(*t.AddChunkRefs(a, 4096, -2), 1u);

  // Going below zero is refused and changes nothing.
  auto under = t.AddChunkRefs(a, 4096, -2);
  EXPECT_FALSE(under.ok());
  EXPECT_EQ(under.status().code(), Code::kInternal);
  EXPECT_EQ(t.GetChunk(a)->refs, 1u);
  EXPECT_FALSE(t.AddChunkRefs(ChunkId{7, 7}, 1, -1).ok());

  // At zero the record goes away.
  EXPECT_EQ(*t.AddChunkRefs(a, 4096, -1), 0u);
  std::vector<std::pair<ChunkId, uint64_t>> seen;
  ASSERT_TRUE(t.ForEachChunk([&](const ChunkId& id, const ChunkRecord& r) {
                 seen.emplace_back(id, r.refs);
               }).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, b);
  EXPECT_EQ(seen[0].second, 5u);
  EXPECT_EQ(t.GetChunk(a)->refs, 0u);
}

TEST_F(MetaStoreTest, Orphans) {
  auto t = Begin(true);
  ASSERT_TRUE(t.AddOrphan(300).ok());
  ASSERT_TRUE(t.AddOrphan(7).ok());
  ASSERT_TRUE(t.AddOrphan(300).ok());  // idempotent
  std::vector<uint64_t> seen;
  ASSERT_TRUE(t.ForEachOrphan([&](uint64_t ino, bool) { seen.push_back(ino); }).ok());
  EXPECT_EQ(seen, (std::vector<uint64_t>{7, 300}));
  ASSERT_TRUE(t.DelOrphan(7).ok());
  ASSERT_TRUE(t.DelOrphan(8).ok());  // absent: fine
  seen.clear();
  ASSERT_TRUE(t.ForEachOrphan([&](uint64_t ino, bool) { seen.push_back(ino); }).ok());
  EXPECT_EQ(seen, (std::vector<uint64_t>{300}));
}

TEST_F(MetaStoreTest, EverythingPersistsAcrossReopen) {
  InodeRecord root = MakeDir(kRootIno);
  Manifest m;
  m.Append({ChunkId{1, 2}, 4096});
  {
    auto t = Begin(true);
    ASSERT_TRUE(t.PutInode(FullInode()).ok());
    ASSERT_TRUE(t.PutEntry(root, "f", FullInode().ino, S_IFREG).ok());
    ASSERT_TRUE(t.PutInode(root).ok());
    ASSERT_TRUE(t.PutManifest(FullInode().ino, m).ok());
    ASSERT_TRUE(t.PutSymlink(50, "target").ok());
    ASSERT_TRUE(t.PutXattr(50, "user.k", "v").ok());
    ASSERT_TRUE(t.AddChunkRefs(ChunkId{1, 2}, 4096, 2).ok());
    ASSERT_TRUE(t.AddOrphan(50).ok());
    ASSERT_TRUE(t.Commit().ok());
  }
  ASSERT_TRUE(store_->Sync().ok());
  Reopen();
  auto t = Begin(false);
  ExpectSameInode(*t.GetInode(FullInode().ino), FullInode());
  EXPECT_EQ(t.GetEntry(kRootIno, "f")->ino, FullInode().ino);
  EXPECT_EQ(t.GetInode(kRootIno)->next_cookie, 2u);
  EXPECT_EQ(**t.GetManifest(FullInode().ino), m);
  EXPECT_EQ(*t.GetSymlink(50), "target");
  EXPECT_EQ(*t.GetXattr(50, "user.k"), "v");
  EXPECT_EQ(t.GetChunk(ChunkId{1, 2})->refs, 2u);
  std::vector<uint64_t> orphans;
  ASSERT_TRUE(t.ForEachOrphan([&](uint64_t ino, bool) { orphans.push_back(ino); }).ok());
  EXPECT_EQ(orphans, std::vector<uint64_t>{50});
}

TEST_F(MetaStoreTest, ReadOnlyOpenSeesDataAndRefusesWrites) {
  {
    auto t = Begin(true);
    ASSERT_TRUE(t.PutInode(FullInode()).ok());
    ASSERT_TRUE(t.Commit().ok());
  }
  store_.reset();
  auto ro = MetaStore::Open(dir_.Sub("meta"), kMapBytes, /*read_only=*/true);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  auto t = (*ro)->Begin(false);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->GetInode(FullInode().ino).ok());
  EXPECT_FALSE((*ro)->Begin(true).ok());
}

}  // namespace
}  // namespace ckptfs
