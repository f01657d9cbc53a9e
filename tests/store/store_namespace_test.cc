// The namespace: entries, renames, directories, links, xattrs (store/namespace.cc).
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <string>
#include <vector>

#include "store/store.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

using test::Bytes;

class StoreNamespaceTest : public test::StoreFixture {};

TEST_F(StoreNamespaceTest, MakeNodeLookupGetAttr) {
  InodeRecord f = File(kRootIno, "f");
  InodeRecord d = Dir(kRootIno, "d");
  EXPECT_NE(f.ino, d.ino);
  EXPECT_GT(f.ino, kRootIno);
  EXPECT_EQ(f.uid, 1000u);
  EXPECT_EQ(f.gid, 100u);
  EXPECT_EQ(f.nlink, 1u);
  EXPECT_EQ(d.nlink, 2u);
  auto l = store_->Lookup(kRootIno, "f");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->ino, f.ino);
  EXPECT_EQ(l->mode, uint32_t{S_IFREG | 0644});
  auto a = store_->GetAttr(d.ino);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(S_ISDIR(a->mode));
  EXPECT_EQ(a->size, 0u);

  EXPECT_EQ(store_->Lookup(kRootIno, "nope").status().code(), Code::kNotFound);
  EXPECT_EQ(store_->GetAttr(987654).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->MakeNode(kRootIno, "f", S_IFREG | 0644, 0, who_).status().code(),
            Code::kExists);
  EXPECT_EQ(store_->MakeNode(f.ino, "x", S_IFREG | 0644, 0, who_).status().code(), Code::kNotDir);
  EXPECT_EQ(store_->Lookup(f.ino, "x").status().code(), Code::kNotDir);
  EXPECT_EQ(store_->MakeNode(kRootIno, std::string(256, 'n'), S_IFREG, 0, who_).status().code(),
            Code::kNameTooLong);
  EXPECT_TRUE(store_->MakeNode(kRootIno, std::string(255, 'n'), S_IFREG, 0, who_).ok());
  EXPECT_EQ(store_->MakeNode(kRootIno, "..", S_IFREG, 0, who_).status().code(), Code::kInvalid);
  InodeRecord fifo = Make(d.ino, "fifo", S_IFIFO | 0600);
  EXPECT_TRUE(S_ISFIFO(store_->Lookup(d.ino, "fifo")->mode));
  EXPECT_EQ(store_->Open(d.ino).code(), Code::kIsDir);
  (void)fifo;
}

TEST_F(StoreNamespaceTest, RenameOverAFileReleasesItsChunks) {
  InodeRecord a = File(kRootIno, "a");
  InodeRecord b = File(kRootIno, "b");
  const Bytes da = test::RandomBytes(500000, 11);
  WriteFile(a.ino, da);
  const size_t a_chunks = ChunkFiles();
  WriteFile(b.ino, test::RandomBytes(700000, 12));
  ASSERT_GT(ChunkFiles(), a_chunks);
  ASSERT_TRUE(store_->Rename(kRootIno, "a", kRootIno, "b", 0).ok());
  EXPECT_EQ(store_->Lookup(kRootIno, "a").status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Lookup(kRootIno, "b")->ino, a.ino);
  EXPECT_EQ(store_->GetAttr(b.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(ChunkFiles(), a_chunks);
  EXPECT_TRUE(ReadFile(a.ino) == da);
  EXPECT_EQ(List(kRootIno), (std::vector<std::string>{".", "..", "b"}));
}

TEST_F(StoreNamespaceTest, RenameOverAnOpenFileKeepsItUntilRelease) {
  InodeRecord a = File(kRootIno, "a");
  InodeRecord b = File(kRootIno, "b");
  WriteFile(a.ino, test::RandomBytes(300000, 16));
  const size_t a_chunks = ChunkFiles();
  const Bytes db = test::RandomBytes(300000, 17);
  WriteFile(b.ino, db);
  ASSERT_TRUE(store_->Open(b.ino).ok());
  ASSERT_TRUE(store_->Rename(kRootIno, "a", kRootIno, "b", 0).ok());
  EXPECT_EQ(store_->Lookup(kRootIno, "b")->ino, a.ino);
  EXPECT_TRUE(ReadOpen(b.ino) == db) << "the replaced file is still open";
  ASSERT_TRUE(store_->Release(b.ino).ok());
  EXPECT_EQ(store_->GetAttr(b.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(ChunkFiles(), a_chunks);
}

TEST_F(StoreNamespaceTest, RenameDirectories) {
  InodeRecord d1 = Dir(kRootIno, "d1");
  InodeRecord d2 = Dir(kRootIno, "d2");
  InodeRecord sub = Dir(d1.ino, "sub");
  InodeRecord f = File(sub.ino, "f");
  EXPECT_EQ(Nlink(kRootIno), 4u);
  EXPECT_EQ(Nlink(d1.ino), 3u);
  ASSERT_TRUE(store_->Rename(d1.ino, "sub", d2.ino, "moved", 0).ok());
  EXPECT_EQ(Nlink(d1.ino), 2u);
  EXPECT_EQ(Nlink(d2.ino), 3u);
  EXPECT_EQ(Nlink(sub.ino), 2u);
  auto moved = store_->Lookup(d2.ino, "moved");
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->ino, sub.ino);
  EXPECT_EQ(store_->Lookup(sub.ino, "f")->ino, f.ino);
  EXPECT_EQ(store_->Lookup(d1.ino, "sub").status().code(), Code::kNotFound);

  // Over an empty directory: replaced. Over a non-empty one: refused.
  InodeRecord empty = Dir(d1.ino, "empty");
  ASSERT_TRUE(store_->Rename(d2.ino, "moved", d1.ino, "empty", 0).ok());
  EXPECT_EQ(store_->GetAttr(empty.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(Nlink(d1.ino), 3u);
  EXPECT_EQ(Nlink(d2.ino), 2u);
  InodeRecord full = Dir(d2.ino, "full");
  Dir(full.ino, "x");
  EXPECT_EQ(store_->Rename(d1.ino, "empty", d2.ino, "full", 0).code(), Code::kNotEmpty);
  // Type mismatches.
  File(d2.ino, "file");
  EXPECT_EQ(store_->Rename(d1.ino, "empty", d2.ino, "file", 0).code(), Code::kNotDir);
  EXPECT_EQ(store_->Rename(d2.ino, "file", d1.ino, "empty", 0).code(), Code::kIsDir);
  EXPECT_EQ(store_->Rename(d1.ino, "missing", d2.ino, "y", 0).code(), Code::kNotFound);
  EXPECT_EQ(Nlink(d1.ino), 3u);
  EXPECT_EQ(Nlink(d2.ino), 3u);
  EXPECT_EQ(Nlink(full.ino), 3u);
  // A rename onto itself changes nothing.
  ASSERT_TRUE(store_->Rename(d2.ino, "file", d2.ino, "file", 0).ok());
  EXPECT_TRUE(store_->Lookup(d2.ino, "file").ok());
}

TEST_F(StoreNamespaceTest, RenameNoReplace) {
  InodeRecord a = File(kRootIno, "a");
  InodeRecord b = File(kRootIno, "b");
  EXPECT_EQ(store_->Rename(kRootIno, "a", kRootIno, "b", RENAME_NOREPLACE).code(), Code::kExists);
  EXPECT_EQ(store_->Lookup(kRootIno, "a")->ino, a.ino);
  EXPECT_EQ(store_->Lookup(kRootIno, "b")->ino, b.ino);
  ASSERT_TRUE(store_->Rename(kRootIno, "a", kRootIno, "c", RENAME_NOREPLACE).ok());
  EXPECT_EQ(store_->Lookup(kRootIno, "c")->ino, a.ino);
  // Unknown flags are EINVAL, as renameat2(2) answers.
  EXPECT_EQ(store_->Rename(kRootIno, "c", kRootIno, "d", 0x80).code(), Code::kInvalid);
}

TEST_F(StoreNamespaceTest, RenameExchange) {
  InodeRecord d1 = Dir(kRootIno, "d1");
  InodeRecord d2 = Dir(kRootIno, "d2");
  InodeRecord f = File(d1.ino, "f");
  InodeRecord sub = Dir(d2.ino, "sub");
  ASSERT_EQ(Nlink(d1.ino), 2u);
  ASSERT_EQ(Nlink(d2.ino), 3u);
  ASSERT_TRUE(store_->Rename(d1.ino, "f", d2.ino, "sub", RENAME_EXCHANGE).ok());
  EXPECT_EQ(store_->Lookup(d1.ino, "f")->ino, sub.ino);
  EXPECT_EQ(store_->Lookup(d2.ino, "sub")->ino, f.ino);
  EXPECT_EQ(Nlink(d1.ino), 3u) << "d1 now holds the directory";
  EXPECT_EQ(Nlink(d2.ino), 2u);
  InodeRecord g = File(d1.ino, "g");
  ASSERT_TRUE(store_->Rename(d1.ino, "f", d1.ino, "g", RENAME_EXCHANGE).ok());
  EXPECT_EQ(store_->Lookup(d1.ino, "f")->ino, g.ino);
  EXPECT_EQ(store_->Lookup(d1.ino, "g")->ino, sub.ino);
  EXPECT_EQ(Nlink(d1.ino), 3u);
  EXPECT_EQ(store_->Rename(d1.ino, "f", d1.ino, "missing", RENAME_EXCHANGE).code(),
            Code::kNotFound);
}

TEST_F(StoreNamespaceTest, RmdirAndDirectoryLinkCounts) {
  EXPECT_EQ(Nlink(kRootIno), 2u);
  InodeRecord d = Dir(kRootIno, "d");
  EXPECT_EQ(Nlink(kRootIno), 3u);
  Dir(d.ino, "e");
  File(d.ino, "f");
  EXPECT_EQ(Nlink(d.ino), 3u) << "files do not count, subdirectories do";
  EXPECT_EQ(store_->Rmdir(kRootIno, "d").code(), Code::kNotEmpty);
  EXPECT_EQ(store_->Rmdir(d.ino, "f").code(), Code::kNotDir);
  EXPECT_EQ(store_->Unlink(d.ino, "e").code(), Code::kIsDir);
  EXPECT_EQ(store_->Rmdir(d.ino, "nope").code(), Code::kNotFound);
  ASSERT_TRUE(store_->Rmdir(d.ino, "e").ok());
  EXPECT_EQ(Nlink(d.ino), 2u);
  ASSERT_TRUE(store_->Unlink(d.ino, "f").ok());
  ASSERT_TRUE(store_->Rmdir(kRootIno, "d").ok());
  EXPECT_EQ(Nlink(kRootIno), 2u);
  EXPECT_EQ(store_->GetAttr(d.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(List(kRootIno), (std::vector<std::string>{".", ".."}));
}

TEST_F(StoreNamespaceTest, ReadDirResumesAtOffsets) {
  InodeRecord d = Dir(kRootIno, "d");
  std::vector<std::string> want = {".", ".."};
  for (int i = 0; i < 40; ++i) {
    std::string name = "f" + std::to_string((i * 17) % 40);  // not in name order
    File(d.ino, name);
    want.push_back(name);
  }
  EXPECT_EQ(List(d.ino), want);
  // A reader whose buffer takes `room` entries per call, resuming at the offset of the last one.
  for (size_t room : {1, 2, 3, 7}) {
    std::vector<std::string> got;
    uint64_t offset = 0;
    for (int calls = 0; calls < 100; ++calls) {
      size_t taken = 0;
      ASSERT_TRUE(store_
                      ->ReadDir(d.ino, offset,
                                [&](const DirItem& it) {
                                  if (taken == room) return false;  // did not fit: not consumed
                                  got.emplace_back(it.name);
                                  offset = it.next_offset;
                                  ++taken;
                                  return true;
                                })
                      .ok());
      if (taken == 0) break;
    }
    EXPECT_EQ(got, want) << "room " << room;
  }
  // Removing entries between calls: the rest are each seen once, in order.
  std::vector<std::string> got;
  uint64_t offset = 0;
  bool removed = false;
  while (true) {
    size_t taken = 0;
    ASSERT_TRUE(store_
                    ->ReadDir(d.ino, offset,
                              [&](const DirItem& it) {
                                if (taken == 5) return false;
                                got.emplace_back(it.name);
                                offset = it.next_offset;
                                ++taken;
                                return true;
                              })
                    .ok());
    if (taken == 0) break;
    if (!removed) {
      ASSERT_TRUE(store_->Unlink(d.ino, want[4]).ok());   // already listed
      ASSERT_TRUE(store_->Unlink(d.ino, want[20]).ok());  // not yet listed
      removed = true;
    }
  }
  std::vector<std::string> expect = want;
  expect.erase(expect.begin() + 20);
  EXPECT_EQ(got, expect);
}

TEST_F(StoreNamespaceTest, SymlinkAndReadLink) {
  auto s = store_->Symlink(kRootIno, "link", "../some/target", who_);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(S_ISLNK(s->mode));
  EXPECT_EQ(s->size, 14u);
  EXPECT_EQ(*store_->ReadLink(s->ino), "../some/target");
  EXPECT_EQ(store_->Lookup(kRootIno, "link")->ino, s->ino);
  InodeRecord f = File(kRootIno, "f");
  EXPECT_EQ(store_->ReadLink(f.ino).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->Symlink(kRootIno, "link", "x", who_).status().code(), Code::kExists);
  EXPECT_EQ(store_->Symlink(kRootIno, "empty", "", who_).status().code(), Code::kInvalid);
  Reopen();
  EXPECT_EQ(*store_->ReadLink(s->ino), "../some/target");
  ASSERT_TRUE(store_->Unlink(kRootIno, "link").ok());
  EXPECT_EQ(store_->ReadLink(s->ino).status().code(), Code::kNotFound);
}

TEST_F(StoreNamespaceTest, HardLinks) {
  InodeRecord f = File(kRootIno, "f");
  InodeRecord d = Dir(kRootIno, "d");
  const Bytes data = test::RandomBytes(400000, 13);
  WriteFile(f.ino, data);
  const size_t chunks = ChunkFiles();
  auto l = store_->Link(f.ino, d.ino, "g");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->nlink, 2u);
  EXPECT_EQ(store_->Lookup(d.ino, "g")->ino, f.ino);
  EXPECT_EQ(store_->Lookup(d.ino, "g")->size, data.size());
  EXPECT_EQ(Nlink(d.ino), 2u) << "a hard link to a file is not a subdirectory";
  EXPECT_EQ(store_->Link(f.ino, d.ino, "g").status().code(), Code::kExists);
  EXPECT_EQ(store_->Link(d.ino, kRootIno, "d2").status().code(), Code::kPermission);
  EXPECT_EQ(ChunkFiles(), chunks);
  ASSERT_TRUE(store_->Unlink(kRootIno, "f").ok());
  EXPECT_EQ(Nlink(f.ino), 1u);
  EXPECT_TRUE(ReadFile(f.ino) == data);
  EXPECT_EQ(ChunkFiles(), chunks);
  ASSERT_TRUE(store_->Unlink(d.ino, "g").ok());
  EXPECT_EQ(store_->GetAttr(f.ino).status().code(), Code::kNotFound);
  EXPECT_EQ(ChunkFiles(), 0u);
}

TEST_F(StoreNamespaceTest, Xattrs) {
  InodeRecord f = File(kRootIno, "f");
  EXPECT_EQ(store_->GetXattr(f.ino, "user.a").status().code(), Code::kNoData);
  ASSERT_TRUE(store_->SetXattr(f.ino, "user.a", "one", 0).ok());
  ASSERT_TRUE(store_->SetXattr(f.ino, "user.b", std::string("\0\1", 2), XATTR_CREATE).ok());
  EXPECT_EQ(*store_->GetXattr(f.ino, "user.a"), "one");
  EXPECT_EQ(*store_->GetXattr(f.ino, "user.b"), std::string("\0\1", 2));
  EXPECT_EQ(store_->SetXattr(f.ino, "user.a", "x", XATTR_CREATE).code(), Code::kExists);
  EXPECT_EQ(store_->SetXattr(f.ino, "user.c", "x", XATTR_REPLACE).code(), Code::kNoData);
  ASSERT_TRUE(store_->SetXattr(f.ino, "user.a", "two", XATTR_REPLACE).ok());
  EXPECT_EQ(*store_->GetXattr(f.ino, "user.a"), "two");
  EXPECT_EQ(store_->SetXattr(f.ino, "system.posix_acl_access", "x", 0).code(), Code::kUnsupported);
  EXPECT_EQ(store_->SetXattr(f.ino, "user.big", std::string(65537, 'v'), 0).code(), Code::kTooBig);
  EXPECT_EQ(*store_->ListXattrs(f.ino), (std::vector<std::string>{"user.a", "user.b"}));
  Reopen();
  EXPECT_EQ(*store_->GetXattr(f.ino, "user.a"), "two");
  ASSERT_TRUE(store_->RemoveXattr(f.ino, "user.a").ok());
  EXPECT_EQ(store_->RemoveXattr(f.ino, "user.a").code(), Code::kNoData);
  EXPECT_EQ(*store_->ListXattrs(f.ino), (std::vector<std::string>{"user.b"}));
  EXPECT_EQ(store_->GetXattr(424242, "user.a").status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ckptfs
