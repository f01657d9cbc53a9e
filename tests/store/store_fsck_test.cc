// Store::Fsck without a backend, where the integration tests cannot reach: reference counts that
// disagree with the manifests (written into the metadata behind the store's back), chunk files
// no record names, and a missing chunk reported by the path of the file that loses bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "store/meta_store.h"
#include "store/store.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

class StoreFsckTest : public test::StoreFixture {
 protected:
  ChunkId FirstChunk(uint64_t ino) {
    auto m = store_->CommittedManifest(ino);
    EXPECT_TRUE(m.ok());
    return (*m)->extents().at(0).id;
  }
  Store::FsckReport Check(uint64_t ino = kRootIno) {
    auto r = store_->Fsck(ino, Store::FsckOptions{.deep = true});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Store::FsckReport{};
  }
};

TEST_F(StoreFsckTest, ACleanStoreIsClean) {
  InodeRecord d = Dir(kRootIno, "d");
  InodeRecord f = File(d.ino, "f");
  WriteFile(f.ino, test::RandomBytes(600000, 1));
  InodeRecord g = File(kRootIno, "g");
  WriteFile(g.ino, test::RandomBytes(300000, 2));
  Store::FsckReport r = Check();
  EXPECT_TRUE(r.Clean()) << r.Json();
  EXPECT_EQ(r.files, 2u);
  EXPECT_GE(r.chunks, 4u);
  EXPECT_EQ(Check(d.ino).files, 1u);  // a directory: only what is under it
}

TEST_F(StoreFsckTest, ReferenceCountsThatDisagreeWithTheManifestsAreFound) {
  InodeRecord f = File(kRootIno, "f");
  WriteFile(f.ino, test::RandomBytes(600000, 3));
  const ChunkId counted = FirstChunk(f.ino);
  const ChunkId phantom = ChunkId::Of("not a chunk of any file", 23);
  store_.reset();
  {
    auto meta = MetaStore::Open(cfg_.cache_dir + "/meta", 1ull << 30);
    ASSERT_TRUE(meta.ok());
    auto txn = (*meta)->Begin(true);
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(txn->AddChunkRefs(counted, 1, +1).ok());   // one reference too many
    ASSERT_TRUE(txn->AddChunkRefs(phantom, 23, +2).ok());  // a record no manifest explains
    ASSERT_TRUE(txn->Commit().ok());
  }
  Reopen();
  Store::FsckReport r = Check();
  EXPECT_FALSE(r.Clean());
  EXPECT_EQ(r.refcount_errors, 2u) << r.Json();
  const std::string json = r.Json();
  EXPECT_NE(json.find(counted.Hex()), std::string::npos) << json;
  EXPECT_NE(json.find(phantom.Hex()), std::string::npos) << json;
  EXPECT_EQ(r.damaged_files, 0u);  // every byte is still there
}

TEST_F(StoreFsckTest, AMissingChunkNamesTheFileAndAStrayFileIsCounted) {
  InodeRecord d = Dir(kRootIno, "run");
  InodeRecord f = File(d.ino, "a.bin");
  WriteFile(f.ino, test::RandomBytes(600000, 4));
  InodeRecord g = File(d.ino, "b.bin");
  WriteFile(g.ino, test::RandomBytes(600000, 5));
  const std::string hex = FirstChunk(f.ino).Hex();
  ASSERT_EQ(::unlink((cfg_.cache_dir + "/chunks/" + hex.substr(0, 2) + "/" + hex).c_str()), 0);
  const std::string stray_hex = ChunkId::Of("stray", 5).Hex();
  const std::string stray = cfg_.cache_dir + "/chunks/" + stray_hex.substr(0, 2) + "/" + stray_hex;
  int fd = ::open(stray.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "stray", 5), 5);
  ::close(fd);

  auto r = store_->Fsck(kRootIno, Store::FsckOptions{.repair = true});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->Clean());
  EXPECT_EQ(r->local_missing, 1u) << r->Json();
  EXPECT_EQ(r->local_repaired, 0u);  // no backend: no second copy
  ASSERT_EQ(r->damaged.size(), 1u);
  EXPECT_EQ(r->damaged[0], "/run/a.bin");
  EXPECT_EQ(r->unreferenced_chunk_files, 1u);
  EXPECT_EQ(::access(stray.c_str(), F_OK), 0) << "fsck never removes chunk files";
}

}  // namespace
}  // namespace ckptfs
