#include "cache/io_engine.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace ckptfs {
namespace {

// Runs every test against both engines.
class IoEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<IoEngine> Make(size_t max_op_bytes = 0) {
    IoEngineOptions opts;
    opts.kind = GetParam();
    opts.max_op_bytes = max_op_bytes;
    auto e = MakeIoEngine(opts);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    if (!e.ok()) return nullptr;
    return std::move(*e);
  }

  void SetUp() override {
    ::signal(SIGPIPE, SIG_IGN);  // pipe tests report EPIPE instead of dying
    engine_ = Make();
    ASSERT_TRUE(engine_);
    if (GetParam() == "uring" && std::string(engine_->name()) != "uring") {
      GTEST_SKIP() << "io_uring is not available on this kernel; the pread engine is used instead";
    }
    EXPECT_EQ(std::string(engine_->name()), GetParam());
  }

  int OpenFile(const std::string& name) {
    int fd = ::open(dir_.Sub(name).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    return fd;
  }

  test::TempDir dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(IoEngineTest, SeveralOpsInOneSubmit) {
  int fd = OpenFile("f");
  constexpr size_t kOps = 100;  // more than the default queue depth
  constexpr size_t kLen = 10000;
  std::vector<std::vector<uint8_t>> data;
  std::vector<IoOp> ops(kOps);
  for (size_t i = 0; i < kOps; ++i) {
    data.push_back(test::RandomBytes(kLen, i));
    ops[i] = IoOp{IoOp::Kind::kWrite, fd, data[i].data(), kLen, int64_t(i * kLen)};
  }
  ASSERT_TRUE(engine_->Submit(ops).ok());
  for (const IoOp& op : ops) {
    EXPECT_TRUE(op.status.ok());
    EXPECT_EQ(op.done, kLen);
  }
  EXPECT_EQ(::lseek(fd, 0, SEEK_END), off_t(kOps * kLen));

  std::vector<std::vector<uint8_t>> back(kOps, std::vector<uint8_t>(kLen));
  for (size_t i = 0; i < kOps; ++i) {
    // Read in reverse order, to not depend on the order requests complete in.
    size_t j = kOps - 1 - i;
    ops[i] = IoOp{IoOp::Kind::kRead, fd, back[j].data(), kLen, int64_t(j * kLen)};
  }
  ASSERT_TRUE(engine_->Submit(ops).ok());
  for (size_t i = 0; i < kOps; ++i) {
    EXPECT_EQ(ops[i].done, kLen);
    EXPECT_EQ(back[i], data[i]) << i;
  }
  ::close(fd);
}

TEST_P(IoEngineTest, ZeroLengthOpsAreDone) {
  int fd = OpenFile("f");
  IoOp ops[2] = {{IoOp::Kind::kRead, fd, nullptr, 0, 0}, {IoOp::Kind::kWrite, fd, nullptr, 0, 0}};
  ASSERT_TRUE(engine_->Submit(ops).ok());
  EXPECT_EQ(ops[0].done, 0u);
  EXPECT_EQ(ops[1].done, 0u);
  ::close(fd);
}

TEST_P(IoEngineTest, ReadPastEndOfFileIsShort) {
  int fd = OpenFile("f");
  const std::vector<uint8_t> data = test::RandomBytes(5000, 1);
  ASSERT_TRUE(engine_->WriteAt(fd, data.data(), data.size(), 0).ok());
  std::vector<uint8_t> buf(8192, 0xee);
  auto n = engine_->ReadAt(fd, buf.data(), buf.size(), 1000);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4000u);
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data() + 1000, 4000));
  auto at_end = engine_->ReadAt(fd, buf.data(), buf.size(), 5000);
  ASSERT_TRUE(at_end.ok());
  EXPECT_EQ(*at_end, 0u);
  auto beyond = engine_->ReadAt(fd, buf.data(), buf.size(), 1 << 20);
  ASSERT_TRUE(beyond.ok());
  EXPECT_EQ(*beyond, 0u);
  ::close(fd);
}

// O_DIRECT reads ask for whole blocks; the one that ends off a block boundary is at end of file,
// and is not asked again (that request, at an unaligned offset, would be refused).
TEST_P(IoEngineTest, DirectReadStopsAtEndOfFileOffABlockBoundary) {
  const std::string path = dir_.Sub("direct");
  const std::vector<uint8_t> data = test::RandomBytes(3 * kDirectAlign + 904, 9);
  {
    int fd = OpenFile("direct");
    ASSERT_TRUE(engine_->WriteAt(fd, data.data(), data.size(), 0).ok());
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) GTEST_SKIP() << "the test directory's filesystem refuses O_DIRECT";
  ASSERT_GE(fd, 0) << std::strerror(errno);
  for (size_t max_op : {size_t{0}, kDirectAlign}) {  // one request, and one block per request
    auto engine = Make(max_op);
    void* p = nullptr;
    ASSERT_EQ(::posix_memalign(&p, kDirectAlign, 8 * kDirectAlign), 0);
    std::unique_ptr<uint8_t, decltype(&std::free)> buf(static_cast<uint8_t*>(p), &std::free);
    auto n = engine->ReadAt(fd, buf.get(), 8 * kDirectAlign, 0, /*direct=*/true);
    ASSERT_TRUE(n.ok()) << "max_op_bytes " << max_op << ": " << n.status().ToString();
    EXPECT_EQ(*n, data.size());
    EXPECT_EQ(0, std::memcmp(buf.get(), data.data(), data.size()));
  }
  ::close(fd);
}

TEST_P(IoEngineTest, SmallMaxOpBytesStillMovesEverything) {
  auto engine = Make(/*max_op_bytes=*/4096);
  int fd = OpenFile("f");
  const std::vector<uint8_t> data = test::RandomBytes((1 << 20) + 123, 2);
  ASSERT_TRUE(engine->WriteAt(fd, data.data(), data.size(), 777).ok());
  EXPECT_EQ(::lseek(fd, 0, SEEK_END), off_t(data.size() + 777));
  std::vector<uint8_t> back(data.size() + 1000);
  auto n = engine->ReadAt(fd, back.data(), back.size(), 777);
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, data.size());
  back.resize(data.size());
  EXPECT_EQ(back, data);
  ::close(fd);
}

TEST_P(IoEngineTest, ShortPipeReadsAreResubmitted) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  const std::vector<uint8_t> data = test::RandomBytes(200000, 3);
  // The writer trickles the bytes in, so every read the engine makes comes back short.
  std::thread writer([&] {
    size_t off = 0;
    test::SplitMix64 rng(4);
    while (off < data.size()) {
      size_t n = std::min<size_t>(data.size() - off, 1 + rng.Below(20000));
      ssize_t w = ::write(p[1], data.data() + off, n);
      if (w <= 0) break;
      off += size_t(w);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<uint8_t> back(data.size());
  auto n = engine_->ReadAt(p[0], back.data(), back.size(), -1);
  ::close(p[0]);  // a writer left blocked on a full pipe (a failed read) gets EPIPE, not a hang
  writer.join();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, data.size());
  EXPECT_EQ(back, data);
  ::close(p[1]);
}

TEST_P(IoEngineTest, PipeReadStopsAtEndOfFile) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ASSERT_EQ(::write(p[1], "hello", 5), 5);
  ::close(p[1]);
  char buf[64];
  auto n = engine_->ReadAt(p[0], buf, sizeof(buf), -1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5u);
  EXPECT_EQ(std::string(buf, 5), "hello");
  ::close(p[0]);
}

TEST_P(IoEngineTest, ShortPipeWritesAreResubmitted) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  // A one-page pipe, drained slowly: each write moves at most a page.
  ASSERT_GE(::fcntl(p[1], F_SETPIPE_SZ, 4096), 4096);
  ASSERT_LT(::fcntl(p[1], F_GETPIPE_SZ), 64 * 1024);
  const std::vector<uint8_t> data = test::RandomBytes(1 << 20, 5);
  std::vector<uint8_t> back;
  std::thread reader([&] {
    std::vector<uint8_t> buf(3000);
    while (true) {
      ssize_t r = ::read(p[0], buf.data(), buf.size());
      if (r <= 0) break;
      back.insert(back.end(), buf.begin(), buf.begin() + r);
      if (back.size() % 16 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  Status st = engine_->WriteAt(p[1], data.data(), data.size(), -1);
  ::close(p[1]);
  reader.join();
  ::close(p[0]);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(back.size(), data.size());
  EXPECT_EQ(back, data);
}

TEST_P(IoEngineTest, BadFdFails) {
  char buf[16];
  auto r = engine_->ReadAt(-1, buf, sizeof(buf), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIo) << r.status().ToString();  // EBADF
  int fd = OpenFile("f");
  ::close(fd);  // a closed descriptor
  EXPECT_FALSE(engine_->ReadAt(fd, buf, sizeof(buf), 0).ok());
  EXPECT_FALSE(engine_->WriteAt(fd, buf, sizeof(buf), 0).ok());
}

TEST_P(IoEngineTest, ReadOnWriteOnlyFdFails) {
  int fd = ::open(dir_.Sub("w").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  char buf[16] = {};
  ASSERT_TRUE(engine_->WriteAt(fd, buf, sizeof(buf), 0).ok());
  auto r = engine_->ReadAt(fd, buf, sizeof(buf), 0);
  EXPECT_FALSE(r.ok());
  ::close(fd);
}

TEST_P(IoEngineTest, OneFailedOpDoesNotStopTheOthers) {
  int fd = OpenFile("f");
  const std::vector<uint8_t> data = test::RandomBytes(4096, 6);
  std::vector<uint8_t> a(4096), b(4096);
  ASSERT_TRUE(engine_->WriteAt(fd, data.data(), data.size(), 0).ok());
  IoOp ops[3] = {{IoOp::Kind::kRead, fd, a.data(), 4096, 0},
                 {IoOp::Kind::kRead, -1, b.data(), 4096, 0},
                 {IoOp::Kind::kRead, fd, b.data(), 4096, 0}};
  Status st = engine_->Submit(ops);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(ops[0].status.ok());
  EXPECT_FALSE(ops[1].status.ok());
  EXPECT_TRUE(ops[2].status.ok());
  EXPECT_EQ(a, data);
  EXPECT_EQ(b, data);
  ::close(fd);
}

TEST_P(IoEngineTest, ConcurrentSubmitters) {
  int fd = OpenFile("f");
  constexpr int kThreads = 8;
  constexpr size_t kLen = 64 << 10;
  std::vector<std::thread> threads;
  std::vector<char> ok(kThreads, 0);  // not vector<bool>: its bits share bytes across threads
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> data = test::RandomBytes(kLen, 100 + t), back(kLen);
      bool good = true;
      for (int round = 0; round < 20 && good; ++round) {
        good = engine_->WriteAt(fd, data.data(), kLen, int64_t(t * kLen)).ok();
        auto n = engine_->ReadAt(fd, back.data(), kLen, int64_t(t * kLen));
        good = good && n.ok() && *n == kLen && back == data;
      }
      ok[t] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(ok[t]) << t;
  ::close(fd);
}

TEST(IoEngineFactoryTest, UnknownKindIsInvalid) {
  IoEngineOptions opts;
  opts.kind = "aio";
  auto e = MakeIoEngine(opts);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kInvalid);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest, ::testing::Values("uring", "pread"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ckptfs
