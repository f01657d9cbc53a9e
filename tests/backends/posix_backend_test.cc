#include "backends/posix_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/backends/backend_conformance.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

test::BackendUnderTest MakePosix(const PosixBackendOptions& options) {
  auto dir = std::make_shared<test::TempDir>();
  auto b = PosixBackend::Open(dir->path(), options);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return {};
  return test::BackendUnderTest{std::move(*b), "", [dir]() mutable { dir.reset(); }};
}

INSTANTIATE_BACKEND_CONFORMANCE(Posix, [] { return MakePosix({}); });
INSTANTIATE_BACKEND_CONFORMANCE(PosixNoFsync, [] {
  PosixBackendOptions options;
  options.fsync = false;
  return MakePosix(options);
});

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        names.emplace_back(e->d_name);
      }
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

class PosixBackendTest : public ::testing::Test {
 protected:
  void Open(const PosixBackendOptions& options = {}) {
    auto b = PosixBackend::Open(dir_.path(), options);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b);
  }
  std::vector<std::string> List() {
    std::vector<std::string> keys;
    Status s = backend_->List("", "", [&](const ObjectInfo& o) {
      keys.push_back(o.key);
      return true;
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    return keys;
  }

  test::TempDir dir_;
  std::unique_ptr<PosixBackend> backend_;
};

TEST_F(PosixBackendTest, MissingRootIsNotFoundAndNotCreated) {
  std::string root = dir_.Sub("no/such/dir");
  auto b = PosixBackend::Open(root);
  EXPECT_EQ(b.status().code(), Code::kNotFound);
  EXPECT_NE(b.status().message().find(root), std::string::npos) << b.status().message();
  EXPECT_FALSE(Exists(dir_.Sub("no")));
}

TEST_F(PosixBackendTest, FileAsRootIsNotDir) {
  WriteFile(dir_.Sub("file"), "x");
  EXPECT_EQ(PosixBackend::Open(dir_.Sub("file")).status().code(), Code::kNotDir);
}

TEST_F(PosixBackendTest, DescribeNamesTheResolvedRoot) {
  ASSERT_EQ(::mkdir(dir_.Sub("r").c_str(), 0755), 0);
  auto b = PosixBackend::Open(dir_.Sub("r/../r/"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->Describe(), "file://" + dir_.Sub("r"));
}

// The on-disk layout is documented in posix_backend.h; ops people read it, so it is pinned here.
TEST_F(PosixBackendTest, LayoutKeepsFilesAndDirectoriesApart) {
  Open();
  ASSERT_TRUE(backend_->Put("chunks/ab/0f3c", "chunk", 5).ok());
  ASSERT_TRUE(backend_->Put("a/b", "1", 1).ok());
  ASSERT_TRUE(backend_->Put("a/b/c", "2", 1).ok());
  ASSERT_TRUE(backend_->Put(".x", "3", 1).ok());
  ASSERT_TRUE(backend_->Put("y.d", "4", 1).ok());
  EXPECT_EQ(backend_->PathOf("chunks/ab/0f3c"), dir_.Sub("chunks.d/ab.d/0f3c"));
  std::ifstream in(dir_.Sub("chunks.d/ab.d/0f3c"));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "chunk");
  EXPECT_TRUE(Exists(dir_.Sub("a.d/b")));
  EXPECT_TRUE(Exists(dir_.Sub("a.d/b.d/c")));
  EXPECT_EQ(Names(dir_.path()),
            (std::vector<std::string>{"%.x", ".tmp", "a.d", "chunks.d", "y.d.e"}));
}

TEST_F(PosixBackendTest, PutLeavesNoTemporaryFiles) {
  Open();
  EXPECT_TRUE(Exists(dir_.Sub(".tmp")));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(backend_->Put("k" + std::to_string(i), "x", 1).ok());
  EXPECT_EQ(Names(dir_.Sub(".tmp")), std::vector<std::string>{});
}

// What other programs leave in the tree (NFS's silly-renamed files, files dropped in by hand that
// do not follow the encoding, a directory where a file belongs) is not an object.
TEST_F(PosixBackendTest, ListSkipsWhatItDidNotWrite) {
  Open();
  ASSERT_TRUE(backend_->Put("a/obj", "x", 1).ok());
  WriteFile(dir_.Sub(".nfs000000001"), "x");
  WriteFile(dir_.Sub("a.d/.nfs000000002"), "x");
  WriteFile(dir_.Sub(".tmp/host.1.2.3"), "in-flight put");
  WriteFile(dir_.Sub("foo.e"), "x");                       // "foo" would be stored as plain "foo"
  WriteFile(dir_.Sub("file.d"), "x");                      // a file named like a directory
  ASSERT_EQ(::mkdir(dir_.Sub("plain").c_str(), 0755), 0);  // a directory named like a file
  EXPECT_EQ(List(), std::vector<std::string>{"a/obj"});
  EXPECT_EQ(backend_->Head("foo").status().code(), Code::kNotFound);
}

TEST_F(PosixBackendTest, OpenRemovesOnlyStaleTemporaryFiles) {
  ASSERT_EQ(::mkdir(dir_.Sub(".tmp").c_str(), 0755), 0);
  WriteFile(dir_.Sub(".tmp/dead.1.0"), "from a crashed put");
  WriteFile(dir_.Sub(".tmp/live.2.0"), "another node's put in flight");
  struct timespec times[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, dir_.Sub(".tmp/dead.1.0").c_str(), times, 0), 0);
  PosixBackendOptions options;
  options.stale_temp_age = std::chrono::hours(1);
  Open(options);
  EXPECT_EQ(Names(dir_.Sub(".tmp")), std::vector<std::string>{"live.2.0"});
}

TEST_F(PosixBackendTest, DeletePrunesEmptyDirectoriesOnly) {
  Open();
  ASSERT_TRUE(backend_->Put("a/b/c/d", "1", 1).ok());
  ASSERT_TRUE(backend_->Put("a/x", "2", 1).ok());
  ASSERT_TRUE(backend_->Delete("a/b/c/d").ok());
  EXPECT_FALSE(Exists(dir_.Sub("a.d/b.d")));
  EXPECT_TRUE(Exists(dir_.Sub("a.d/x")));
  ASSERT_TRUE(backend_->Delete("a/x").ok());
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{".tmp"}) << "the root stays";
}

// Threads put and at once delete keys in one directory chain, so that each Delete prunes the
// directories another thread's Put has just made, between its mkdir and its rename. Every Put
// must make them again and succeed. Run on `backends` instances of one root: within one
// instance a lock keeps the race out, across instances (across nodes) retries take it.
void HammerPutAndPrune(const std::vector<PosixBackend*>& backends) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      PosixBackend* b = backends[t % backends.size()];
      std::string key = "p/q/r/k" + std::to_string(t);
      for (int i = 0; i < 200 && failures == 0; ++i) {
        Status s = b->Put(key, "x", 1);
        if (s.ok()) s = b->Delete(key);
        if (!s.ok()) {
          ADD_FAILURE() << key << " round " << i << ": " << s.ToString();
          failures++;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

TEST_F(PosixBackendTest, PutSurvivesConcurrentPruning) {
  PosixBackendOptions options;
  options.fsync = false;  // a denser race
  Open(options);
  HammerPutAndPrune({backend_.get()});
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{".tmp"});
}

TEST_F(PosixBackendTest, PutSurvivesPruningByAnotherNode) {
  PosixBackendOptions options;
  options.fsync = false;
  Open(options);
  auto other = PosixBackend::Open(dir_.path(), options);
  ASSERT_TRUE(other.ok());
  HammerPutAndPrune({backend_.get(), other->get()});
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{".tmp"});
}

TEST_F(PosixBackendTest, OverlongComponentIsNameTooLong) {
  Open();
  std::string key = "d/" + std::string(300, 'n');
  EXPECT_EQ(backend_->Put(key, "x", 1).code(), Code::kNameTooLong);
  EXPECT_EQ(Names(dir_.Sub(".tmp")), std::vector<std::string>{}) << "temporary file left behind";
  EXPECT_EQ(backend_->Head(key).status().code(), Code::kNameTooLong);
}

TEST_F(PosixBackendTest, TwoBackendsShareOneRoot) {
  Open();
  auto other = PosixBackend::Open(dir_.path());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(backend_->Put("shared/k", "from one", 8).ok());
  auto got = (*other)->GetObject("shared/k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "from one");
  ASSERT_TRUE((*other)->Delete("shared/k").ok());
  EXPECT_EQ(backend_->Head("shared/k").status().code(), Code::kNotFound);
}

// The root is a 1 MiB tmpfs: a Put that does not fit is kNoSpace, leaves no temporary file and
// keeps the old object whole.
TEST_F(PosixBackendTest, FullFilesystemIsNoSpace) {
  std::string root = dir_.Sub("small");
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  if (::mount("tmpfs", root.c_str(), "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << "); needs root";
  }
  {
    auto b = PosixBackend::Open(root);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE((*b)->Put("k", "old", 3).ok());
    std::string big(2 << 20, 'x');
    Status s = (*b)->Put("k", big.data(), big.size());
    EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
    EXPECT_EQ(Names(root + "/.tmp"), std::vector<std::string>{});
    auto got = (*b)->GetObject("k");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, "old");
  }
  EXPECT_EQ(::umount(root.c_str()), 0) << std::strerror(errno);
}

}  // namespace
}  // namespace ckptfs
