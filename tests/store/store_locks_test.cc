// One slow writer never stalls the mount: a writer that waits for room on the local tier (full
// of chunks the backend has not taken yet) holds no lock that another operation needs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "tests/store/shared_backend.h"

namespace ckptfs {
namespace {

using test::SharedBackend;

class StoreLocksTest : public test::NodesTest {};

TEST_F(StoreLocksTest, AWriterWaitingForRoomStallsNoOtherOperation) {
  // Every upload is held inside the backend's put until the test lets it go.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_open = false;
  auto open_gate = [&] {
    {
      std::lock_guard lock(gate_mu);
      gate_open = true;
    }
    gate_cv.notify_all();
  };
  SharedBackend* backend = nullptr;
  auto s = OpenStore("a", &backend, [](Config& c) {
    c.cache_bytes = 1 << 20;  // four chunks of chunk_max
    c.remote_timeout_s = 600;
  });
  ASSERT_TRUE(s);
  backend->on_put = [&](const std::string&) {
    std::unique_lock lock(gate_mu);
    gate_cv.wait(lock, [&] { return gate_open; });
  };
  const Caller who{};
  const uint64_t run1 = s->MakeNode(kRootIno, "run1", S_IFDIR | 0755, 0, who)->ino;
  const uint64_t run2 = s->MakeNode(kRootIno, "run2", S_IFDIR | 0755, 0, who)->ino;
  // 1 MiB committed and not uploaded: the local tier is full.
  Write(*s, run1, "step1.pt", test::RandomBytes(1 << 20, 1));
  const uint64_t w = s->MakeNode(run1, "step2.pt", S_IFREG | 0644, 0, who)->ino;

  // The writer: its write waits for room (until uploads make some).
  const Bytes data = test::RandomBytes(1 << 20, 2);
  std::atomic<bool> writer_done{false};
  Status written;
  ASSERT_TRUE(s->Open(w).ok());
  std::thread writer([&] {
    written = s->Write(w, 0, data.data(), data.size());
    writer_done = true;
  });
  // Past the daemon-wide budget, the write is at its admission (a few instructions on).
  while (s->gauges().write_queue_bytes < data.size() && !writer_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_FALSE(writer_done) << "the write did not wait for room: " << written.ToString();

  // ls, stat, chmod and link of that file, and a save of another file into another directory.
  auto others = std::async(std::launch::async, [&]() -> Status {
    std::vector<std::string> names;
    RETURN_IF_ERROR(s->ReadDir(run1, 0, [&](const DirItem& it) {
      names.emplace_back(it.name);
      return true;
    }));
    RETURN_IF_ERROR(s->GetAttr(w).status());
    SetAttrRequest chmod;
    chmod.mode = 0600;
    RETURN_IF_ERROR(s->SetAttr(w, chmod).status());
    RETURN_IF_ERROR(s->Link(w, run2, "step2-link.pt").status());
    uint64_t fh = 0;
    int fd = -1;
    ASSIGN_OR_RETURN(InodeRecord other, s->CreateFile(run2, "other.pt", 0644, Caller{}, &fh,
                                                      nullptr, &fd));
    const Bytes small = test::RandomBytes(100000, 3);
    if (fd >= 0) {
      if (::pwrite(fd, small.data(), small.size(), 0) != static_cast<ssize_t>(small.size())) {
        return Status::FromErrno(errno, "pwrite");
      }
    } else {
      RETURN_IF_ERROR(s->Write(other.ino, 0, small.data(), small.size(), fh));
    }
    RETURN_IF_ERROR(s->Flush(other.ino, fh));
    return s->Release(other.ino, fh);
  });
  // A bound, not a measurement: they need no room and wait for nobody.
  const bool finished = others.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "operations on the mount waited for a writer waiting for room";
  EXPECT_FALSE(writer_done) << "the writer still waits: nothing above waited for it";
  open_gate();  // the uploads go through; the writer gets its room
  writer.join();
  EXPECT_TRUE(written.ok()) << written.ToString();
  EXPECT_TRUE(others.get().ok());
  ASSERT_TRUE(s->Flush(w).ok());
  ASSERT_TRUE(s->Release(w).ok());
  EXPECT_TRUE(Read(*s, w) == data);
  EXPECT_EQ(s->GetAttr(w)->mode & 07777, 0600u);
}

}  // namespace
}  // namespace ckptfs
