// The store's format: a store written by a newer ckptfs is refused with that reason, never
// called damaged; an older one is read, and raised when opened for writing.
#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/stat.h>

#include <string>

#include "store/meta_store.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

constexpr uint64_t kMapBytes = 64ull << 20;

std::string U64(uint64_t v) {
  std::string out;
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// Writes (or, with no value, deletes) key in LMDB table `table` of the store in dir, as another
// binary would have left it.
void Raw(const std::string& dir, const char* table, const std::string& key,
         const std::string* value) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  mdb_env_set_mapsize(env, kMapBytes);
  ASSERT_EQ(mdb_env_open(env, dir.c_str(), MDB_NOTLS, 0600), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
  MDB_dbi dbi;
  ASSERT_EQ(mdb_dbi_open(txn, table, 0, &dbi), 0);
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  if (value) {
    MDB_val v{value->size(), const_cast<char*>(value->data())};
    ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
  } else {
    ASSERT_EQ(mdb_del(txn, dbi, &k, nullptr), 0);
  }
  ASSERT_EQ(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

uint64_t FormatOf(const std::string& dir, bool read_only) {
  auto s = MetaStore::Open(dir, kMapBytes, read_only);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? (*s)->format() : 0;
}

TEST(MetaFormatTest, ANewStoreHasThisBinarysFormat) {
  test::TempDir d;
  EXPECT_EQ(FormatOf(d.path(), false), kStoreFormat);
  EXPECT_EQ(FormatOf(d.path(), true), kStoreFormat);
}

TEST(MetaFormatTest, ANewerStoreIsRefusedWithItsFormatNotCalledDamaged) {
  test::TempDir d;
  FormatOf(d.path(), false);
  const std::string newer = U64(kStoreFormat + 1);
  Raw(d.path(), "meta", "format", &newer);
  for (bool read_only : {false, true}) {
    auto s = MetaStore::Open(d.path(), kMapBytes, read_only);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kUnsupported);
    EXPECT_NE(s.status().message().find("was written by ckptfs format " +
                                        std::to_string(kStoreFormat + 1) +
                                        "; this binary reads up to format " +
                                        std::to_string(kStoreFormat)),
              std::string::npos)
        << s.status().ToString();
    EXPECT_EQ(s.status().message().find("damaged"), std::string::npos);
  }
}

TEST(MetaFormatTest, AnOlderStoreIsReadAndRaisedWhenOpenedForWriting) {
  test::TempDir d;
  InodeRecord r;
  r.ino = 5;
  r.mode = S_IFREG | 0644;
  r.size = 42;
  {
    auto s = MetaStore::Open(d.path(), kMapBytes);
    ASSERT_TRUE(s.ok());
    auto t = (*s)->Begin(true);
    ASSERT_TRUE(t->PutInode(r).ok());
    ASSERT_TRUE(t->Commit().ok());
  }
  // A store made before the format was recorded, with an inode record of version 1 (12 fields:
  // no data_bytes).
  Raw(d.path(), "meta", "format", nullptr);
  std::string v1(1, '\1');
  for (uint64_t f : {r.ino, uint64_t{r.mode}, uint64_t{0}, uint64_t{0}, uint64_t{1}, r.size,
                     uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{1}, uint64_t{3}}) {
    v1 += U64(f);
  }
  Raw(d.path(), "inodes", U64(r.ino), &v1);
  EXPECT_EQ(FormatOf(d.path(), true), 1u);  // read as it is, not raised
  EXPECT_EQ(FormatOf(d.path(), false), kStoreFormat);
  auto s = MetaStore::Open(d.path(), kMapBytes);
  ASSERT_TRUE(s.ok());
  auto t = (*s)->Begin(false);
  auto got = t->GetInode(r.ino);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size, 42u);
  EXPECT_EQ(got->data_bytes, 42u);  // records before data_bytes read as their size
  EXPECT_EQ(got->generation, 3u);
  EXPECT_EQ(got->path_epoch, 0u);
}

TEST(MetaFormatTest, AnInodeRecordOfVersion2ReadsWithPathEpochZeroAndIsWrittenWithIt) {
  test::TempDir d;
  FormatOf(d.path(), false);
  std::string v2(1, '\2');
  for (uint64_t f : {uint64_t{7}, uint64_t{S_IFREG | 0644}, uint64_t{0}, uint64_t{0}, uint64_t{1},
                     uint64_t{42}, uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{1},
                     uint64_t{3}, uint64_t{40}}) {
    v2 += U64(f);
  }
  Raw(d.path(), "inodes", U64(7), &v2);
  auto s = MetaStore::Open(d.path(), kMapBytes);
  ASSERT_TRUE(s.ok());
  {
    auto t = (*s)->Begin(true);
    auto got = t->GetInode(7);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->data_bytes, 40u);
    EXPECT_EQ(got->generation, 3u);
    EXPECT_EQ(got->path_epoch, 0u);
    got->path_epoch = 5;
    ASSERT_TRUE(t->PutInode(*got).ok());
    ASSERT_TRUE(t->Commit().ok());
  }
  auto t = (*s)->Begin(false);
  auto got = t->GetInode(7);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->path_epoch, 5u);
  EXPECT_EQ(got->data_bytes, 40u);
}

TEST(MetaFormatTest, AnInodeRecordOfANewerVersionIsNotCalledDamaged) {
  test::TempDir d;
  FormatOf(d.path(), false);
  std::string newer(1, '\4');
  for (int i = 0; i < 15; ++i) newer += U64(i);
  Raw(d.path(), "inodes", U64(9), &newer);
  auto s = MetaStore::Open(d.path(), kMapBytes);
  ASSERT_TRUE(s.ok());
  auto t = (*s)->Begin(false);
  auto got = t->GetInode(9);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kUnsupported);
  EXPECT_NE(got.status().message().find("newer ckptfs"), std::string::npos);
  // A record that is really damaged still says so.
  std::string torn(1, '\2');
  torn += U64(9);
  Raw(d.path(), "inodes", U64(9), &torn);
  auto t2 = (*s)->Begin(false);
  EXPECT_EQ(t2->GetInode(9).status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace ckptfs
