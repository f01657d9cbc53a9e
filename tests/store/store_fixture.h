// The fixture shared by the Store tests: a Store on a temporary cache directory with small chunks,
// and helpers that write, read and count what is on the local tier.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "store/store.h"
#include "tests/test_util.h"

namespace ckptfs::test {

using Bytes = std::vector<uint8_t>;

class StoreFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.mountpoint = "/unused";
    cfg_.cache_dir = dir_.Sub("cache");
    // Small chunks, so that a file of a few hundred KiB is several chunks.
    cfg_.chunking.min_bytes = 16 << 10;
    cfg_.chunking.avg_bytes = 64 << 10;
    cfg_.chunking.max_bytes = 256 << 10;
    // The layout these tests look into (ChunkFiles, chunk paths they damage): one file per chunk.
    // Packs, the default, have their fixture (store_packs_test.cc) and the mount's tests.
    cfg_.packs = false;
    ASSERT_TRUE(cfg_.Validate().ok());
    Reopen();
  }

  void Reopen() {
    store_.reset();
    auto s = Store::Open(cfg_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }

  InodeRecord Make(uint64_t parent, const std::string& name, uint32_t mode) {
    auto r = store_->MakeNode(parent, name, mode, 0, who_);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    return r.ok() ? *r : InodeRecord{};
  }
  InodeRecord File(uint64_t parent, const std::string& name) {
    return Make(parent, name, S_IFREG | 0644);
  }
  InodeRecord Dir(uint64_t parent, const std::string& name) {
    return Make(parent, name, S_IFDIR | 0755);
  }

  // Writes `data` at 0 through an open handle in 100 KiB pieces, then closes it.
  void WriteFile(uint64_t ino, const Bytes& data) {
    ASSERT_TRUE(store_->Open(ino).ok());
    for (size_t off = 0; off < data.size(); off += 100000) {
      size_t n = std::min<size_t>(100000, data.size() - off);
      ASSERT_TRUE(store_->Write(ino, off, data.data() + off, n).ok());
    }
    ASSERT_TRUE(store_->Flush(ino).ok());
    ASSERT_TRUE(store_->Release(ino).ok());
  }

  // A new file in `parent` holding `data`, fsync'd (durable: no fallback).
  InodeRecord DurableFile(uint64_t parent, const std::string& name, const Bytes& data) {
    InodeRecord f = File(parent, name);
    WriteFile(f.ino, data);
    EXPECT_TRUE(store_->Fsync(f.ino).ok());
    return f;
  }

  // Reads through a handle that is already open.
  Bytes ReadOpen(uint64_t ino, uint64_t off = 0, size_t len = 64 << 20) {
    std::vector<ReadSlice> slices;
    Status st = store_->Read(ino, off, len, &slices);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Bytes out;
    for (const ReadSlice& s : slices) out.insert(out.end(), s.data, s.data + s.len);
    return out;
  }
  Bytes ReadFile(uint64_t ino) {
    EXPECT_TRUE(store_->Open(ino).ok());
    Bytes b = ReadOpen(ino);
    EXPECT_TRUE(store_->Release(ino).ok());
    return b;
  }

  // Chunk files on the local tier: <cache_dir>/chunks/??/<id>.
  size_t ChunkFiles() {
    size_t n = 0;
    const std::string chunks = cfg_.cache_dir + "/chunks";
    DIR* top = ::opendir(chunks.c_str());
    if (!top) return 0;
    while (dirent* e = ::readdir(top)) {
      if (std::strlen(e->d_name) != 2 || e->d_name[0] == '.') continue;
      DIR* sub = ::opendir((chunks + "/" + e->d_name).c_str());
      while (dirent* f = ::readdir(sub)) n += f->d_name[0] != '.';
      ::closedir(sub);
    }
    ::closedir(top);
    return n;
  }

  // Entries of a directory on the host, "." and ".." not counted.
  static size_t Entries(const std::string& dir) {
    size_t n = 0;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  }

  // Names in `dir` by readdir, "." and ".." included.
  std::vector<std::string> List(uint64_t dir) {
    std::vector<std::string> names;
    Status st = store_->ReadDir(dir, 0, [&](const DirItem& it) {
      names.emplace_back(it.name);
      return true;
    });
    EXPECT_TRUE(st.ok());
    return names;
  }

  // A crash, as a unit test can show one: the cache directory as it is now (the store open),
  // less what `lose` takes from it (what had not reached the disk), opens in another boot (or in
  // this one: a daemon crash).
  void Crash(const std::function<void(const std::string& cache)>& lose,
             const std::string& boot = "after-the-crash") {
    namespace fs = std::filesystem;
    const fs::path copy = dir_.Sub("crash" + std::to_string(++crashes_));
    for (const auto& e : fs::recursive_directory_iterator(cfg_.cache_dir)) {
      const fs::path rel = fs::relative(e.path(), cfg_.cache_dir);
      if (rel.filename() == "lock.mdb") continue;  // LMDB's reader table: made anew
      if (e.is_directory()) {
        fs::create_directories(copy / rel);
      } else {
        fs::create_directories((copy / rel).parent_path());
        fs::copy_file(e.path(), copy / rel);
      }
    }
    store_.reset();
    cfg_.cache_dir = copy.string();
    if (lose) lose(copy.string());
    ::setenv("CKPTFS_BOOT_ID", boot.c_str(), 1);
    Reopen();
    ::unsetenv("CKPTFS_BOOT_ID");
  }

  uint32_t Nlink(uint64_t ino) {
    auto r = store_->GetAttr(ino);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->nlink : 0;
  }

  test::TempDir dir_;
  Config cfg_;
  Caller who_{1000, 100};
  std::unique_ptr<Store> store_;
  int crashes_ = 0;
};

}  // namespace ckptfs::test
