#include "backends/mem_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "backends/fault_backend.h"
#include "tests/backends/backend_conformance.h"

namespace ckptfs {
namespace {

INSTANTIATE_BACKEND_CONFORMANCE(Mem, [] {
  return test::BackendUnderTest{std::make_unique<MemBackend>("conformance")};
});

// The way an S3 bucket is tested: one backend shared by every test, each test in a prefix of its
// own, with neighbours outside it that no test may see or delete. (The non-owning FaultBackend
// with no faults is just a handle on the shared backend.)
MemBackend& SharedBucket() {
  static MemBackend* bucket = [] {
    auto* b = new MemBackend("bucket");
    for (const char* key : {"run/6/x", "run/7", "run/70/x", "run/7-x", "zzz"}) {
      EXPECT_TRUE(b->Put(key, "neighbour", 9).ok());
    }
    return b;
  }();
  return *bucket;
}

INSTANTIATE_BACKEND_CONFORMANCE(SharedMemWithPrefix, [] {
  static int test_number = 0;
  std::string prefix = "run/7/" + std::to_string(test_number++) + "/";
  return test::BackendUnderTest{
      std::make_unique<FaultBackend>(&SharedBucket()), prefix, [prefix] {
        std::vector<std::string> keys = SharedBucket().Keys();
        EXPECT_EQ(keys,
                  (std::vector<std::string>{"run/6/x", "run/7", "run/7-x", "run/70/x", "zzz"}))
            << "the suite left objects behind under " << prefix << " or touched a neighbour";
      }};
});

TEST(MemBackendTest, CountsRequestsAndBytes) {
  MemBackend b;
  ASSERT_TRUE(b.Put("a", "12345", 5).ok());
  ASSERT_TRUE(b.Put("b/c", "xy", 2).ok());
  ASSERT_TRUE(b.Put("a", "123", 3).ok());  // replaces 5 bytes with 3
  char buf[8];
  ASSERT_TRUE(b.Get("a", 1, buf, sizeof(buf)).ok());
  EXPECT_EQ(b.Get("none", 0, buf, 1).status().code(), Code::kNotFound);
  ASSERT_TRUE(b.Head("b/c").ok());
  ASSERT_TRUE(b.Delete("none").ok());
  ASSERT_TRUE(b.List("", "", [](const ObjectInfo&) { return true; }).ok());
  EXPECT_EQ(b.Put("/bad", "x", 1).code(), Code::kInvalid);

  MemBackend::Stats s = b.stats();
  EXPECT_EQ(s.puts, 3u);  // the invalid key counts nowhere
  EXPECT_EQ(s.put_bytes, 10u);
  EXPECT_EQ(s.gets, 2u);
  EXPECT_EQ(s.get_bytes, 2u);  // "23"
  EXPECT_EQ(s.heads, 1u);
  EXPECT_EQ(s.deletes, 1u);
  EXPECT_EQ(s.lists, 1u);
  EXPECT_EQ(b.object_count(), 2u);
  EXPECT_EQ(b.stored_bytes(), 5u);
  EXPECT_EQ(b.Keys(), (std::vector<std::string>{"a", "b/c"}));

  ASSERT_TRUE(b.Delete("a").ok());
  EXPECT_EQ(b.stored_bytes(), 2u);
  EXPECT_EQ(b.Keys(), std::vector<std::string>{"b/c"});
  b.ResetStats();
  EXPECT_EQ(b.stats().puts, 0u);
  EXPECT_EQ(b.stats().deletes, 0u);
  EXPECT_EQ(b.object_count(), 1u) << "ResetStats keeps the objects";
}

TEST(MemBackendTest, PutCopiesTheCallersBytes) {
  MemBackend b;
  std::string data = "original";
  ASSERT_TRUE(b.Put("k", data.data(), data.size()).ok());
  data.assign("XXXXXXXX");
  auto got = b.GetObject("k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "original");
}

// MemBackend's GetObject reads one snapshot, so unlike the default (Head, then Get) it never
// reports kCorrupt while another thread changes the object's size.
TEST(MemBackendTest, GetObjectIsOneSnapshot) {
  MemBackend b;
  ASSERT_TRUE(b.Put("k", "a", 1).ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) {
      std::string data(1 + i % 50, static_cast<char>('a' + i % 26));
      ASSERT_TRUE(b.Put("k", data.data(), data.size()).ok());
    }
    done = true;
  });
  int reads = 0;
  while (!done || reads < 10) {
    auto got = b.GetObject("k");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->find_first_not_of((*got)[0]), std::string::npos);
    ++reads;
  }
  writer.join();
}

TEST(MemBackendTest, ListWalksPastOneBatch) {
  // More keys than one batch under the mutex, so the cursor has to resume correctly.
  MemBackend b;
  std::vector<std::string> want;
  for (int i = 0; i < 1000; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "k/%04d", i);
    want.push_back(key);
    ASSERT_TRUE(b.Put(key, "", 0).ok());
  }
  std::vector<std::string> seen;
  ASSERT_TRUE(b.List("k/", "k/0099", [&](const ObjectInfo& o) {
                 seen.push_back(o.key);
                 return true;
               }).ok());
  EXPECT_EQ(seen, std::vector<std::string>(want.begin() + 100, want.end()));
}

}  // namespace
}  // namespace ckptfs
