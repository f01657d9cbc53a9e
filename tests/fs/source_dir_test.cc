// DirSource: a plain directory as the views' CheckpointSource (ckptfs convert): ids per path,
// listings in the store's readdir numbering, reads of any size equal to the file's bytes, and
// versions that notice a change.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fs/checkpoint_source.h"
#include "tests/test_util.h"

namespace ckptfs::fs {
namespace {

std::string Bytes(const std::vector<ReadSlice>& slices) {
  std::string out;
  for (const ReadSlice& s : slices) out.append(reinterpret_cast<const char*>(s.data), s.len);
  return out;
}

class DirSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / ("dirsource-" + std::to_string(::getpid()));
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ / "iter_0000100" / "mp_rank_00");
    auto b = test::RandomBytes(3 << 20, 7);
    data_.assign(b.begin(), b.end());
    Write(root_ / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt", data_);
    Write(root_ / "latest_checkpointed_iteration.txt", "100");
    auto src = DirSource::Make(root_.string());
    ASSERT_TRUE(src.ok()) << src.status().ToString();
    src_ = std::move(*src);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  static void Write(const std::filesystem::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }

  std::filesystem::path root_;
  std::string data_;
  std::unique_ptr<DirSource> src_;
};

TEST_F(DirSourceTest, LooksUpListsAndReads) {
  auto iter = src_->Lookup(DirSource::kRootId, "iter_0000100");
  ASSERT_TRUE(iter.ok());
  EXPECT_TRUE(S_ISDIR(iter->mode));
  EXPECT_EQ(src_->Lookup(DirSource::kRootId, "iter_0000100")->ino, iter->ino) << "ids are stable";
  EXPECT_EQ(src_->Lookup(DirSource::kRootId, "nothing").status().code(), Code::kNotFound);
  EXPECT_EQ(src_->Lookup(DirSource::kRootId, "..").status().code(), Code::kNotFound);
  EXPECT_EQ(src_->Lookup(iter->ino, "mp_rank_00/model_optim_rng.pt").status().code(),
            Code::kNotFound) << "one name, not a path";
  std::vector<std::pair<std::string, uint64_t>> items;
  ASSERT_TRUE(src_->ReadDir(DirSource::kRootId, 0, [&](const DirItem& d) {
    items.emplace_back(std::string(d.name), d.next_offset);
    return true;
  }).ok());
  const std::vector<std::pair<std::string, uint64_t>> want{
      {".", 1}, {"..", 2}, {"iter_0000100", 3}, {"latest_checkpointed_iteration.txt", 4}};
  EXPECT_EQ(items, want);
  items.clear();
  ASSERT_TRUE(src_->ReadDir(DirSource::kRootId, 3, [&](const DirItem& d) {
    items.emplace_back(std::string(d.name), d.next_offset);
    return true;
  }).ok());
  EXPECT_EQ(items, (std::vector<std::pair<std::string, uint64_t>>{want[3]})) << "from an offset";

  auto rank = src_->Lookup(iter->ino, "mp_rank_00");
  auto file = src_->Lookup(rank->ino, "model_optim_rng.pt");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->size, data_.size());
  EXPECT_EQ(src_->Describe(rank->ino), (root_ / "iter_0000100" / "mp_rank_00").string());
  EXPECT_EQ(src_->Open(iter->ino).status().code(), Code::kIsDir);
  auto f = src_->Open(file->ino);
  ASSERT_TRUE(f.ok());
  // Large reads, small reads in order and out of it (rows of a gather), and past the end
  // (clipped).
  std::vector<std::pair<uint64_t, uint64_t>> reads{{0, 3 << 20}, {5, 2 << 20}};
  for (uint64_t at = 1000; at < (3 << 20); at += 70001) reads.emplace_back(at, 2048);
  for (uint64_t at = (3 << 20) - 5000; at > 300007; at -= 300007) reads.emplace_back(at, 4096);
  reads.emplace_back((3 << 20) - 100, 4096);
  reads.emplace_back(3 << 20, 10);
  for (const auto& [at, len] : reads) {
    std::vector<ReadSlice> slices;
    ASSERT_TRUE((*f)->Read(at, len, &slices).ok());
    EXPECT_EQ(Bytes(slices), data_.substr(at, len)) << at << " " << len;
  }
}

TEST_F(DirSourceTest, AVersionNoticesAChange) {
  const auto path = root_ / "latest_checkpointed_iteration.txt";
  auto id = src_->Lookup(DirSource::kRootId, "latest_checkpointed_iteration.txt");
  ASSERT_TRUE(id.ok());
  auto before = src_->Open(id->ino);
  auto same = src_->Open(id->ino);
  ASSERT_TRUE(before.ok() && same.ok());
  EXPECT_TRUE((*before)->SameVersion(**same));
  Write(path, "200");  // same size, new bytes: ctime and mtime move
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  auto after = src_->Open(id->ino);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE((*before)->SameVersion(**after));
  std::filesystem::remove(path);
  EXPECT_EQ(src_->Open(id->ino).status().code(), Code::kNotFound);
  EXPECT_FALSE(DirSource::Make((root_ / "iter_0000100" / "nothing").string()).ok());
}

}  // namespace
}  // namespace ckptfs::fs
