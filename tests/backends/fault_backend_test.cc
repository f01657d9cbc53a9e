#include "backends/fault_backend.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <string>
#include <vector>

#include "backends/mem_backend.h"
#include "tests/backends/backend_conformance.h"

namespace ckptfs {
namespace {

// With no faults configured, the wrapper is just the backend it wraps.
INSTANTIATE_BACKEND_CONFORMANCE(FaultFree, [] {
  return test::BackendUnderTest{std::make_unique<FaultBackend>(std::make_unique<MemBackend>())};
});

constexpr int kOps = 2000;

// Within about five standard deviations of the binomial mean: with a fixed seed the count is
// fixed, the tolerance only keeps the test honest about what it promises.
void ExpectRate(uint64_t observed, double p, int n, const char* what) {
  double mean = p * n;
  double tolerance = 5 * std::sqrt(n * p * (1 - p)) + 1;
  EXPECT_NEAR(static_cast<double>(observed), mean, tolerance) << what;
}

class FaultBackendTest : public ::testing::Test {
 protected:
  void SetSpec(const std::string& text) {
    auto spec = FaultSpec::Parse(text);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    ASSERT_TRUE(fault_.SetSpec(*spec).ok());
  }

  MemBackend mem_;
  FaultBackend fault_{&mem_};
};

TEST_F(FaultBackendTest, FailsAtTheConfiguredRateWithoutTouchingTheBackend) {
  SetSpec("fail=0.1,seed=42");
  int failed = 0;
  for (int i = 0; i < kOps; ++i) {
    Status s = fault_.Put("k" + std::to_string(i % 10), "x", 1);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), Code::kIo);
      EXPECT_EQ(s.message().rfind("injected fault", 0), 0u) << s.message();
      ++failed;
    }
  }
  ExpectRate(failed, 0.1, kOps, "failed puts");
  EXPECT_EQ(fault_.counts().fail, static_cast<uint64_t>(failed));
  EXPECT_EQ(mem_.stats().puts, static_cast<uint64_t>(kOps - failed)) << "a failed put got through";
}

TEST_F(FaultBackendTest, TruncatedGetsAreShortPrefixes) {
  const std::string data(100, 'd');
  ASSERT_TRUE(mem_.Put("k", data.data(), data.size()).ok());
  SetSpec("truncate=0.05,seed=7,ops=get");
  int shorter = 0;
  for (int i = 0; i < kOps; ++i) {
    char buf[100];
    auto n = fault_.Get("k", 0, buf, sizeof(buf));
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_LE(*n, 100u);
    EXPECT_EQ(std::string(buf, *n), data.substr(0, *n));
    if (*n < 100) ++shorter;
  }
  ExpectRate(shorter, 0.05, kOps, "truncated gets");
  EXPECT_EQ(fault_.counts().truncate, static_cast<uint64_t>(shorter));
}

TEST_F(FaultBackendTest, TruncatedPutsStoreLessAndSayOk) {
  SetSpec("truncate=0.2,seed=9,ops=put");
  const std::string data = "0123456789abcdefghij";
  int shorter = 0;
  for (int i = 0; i < kOps / 4; ++i) {
    std::string key = "t/" + std::to_string(i);
    ASSERT_TRUE(fault_.Put(key, data.data(), data.size()).ok()) << "a lying put reports OK";
    auto stored = mem_.GetObject(key);
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(*stored, data.substr(0, stored->size()));
    if (stored->size() < data.size()) ++shorter;
  }
  ExpectRate(shorter, 0.2, kOps / 4, "truncated puts");
  EXPECT_EQ(fault_.counts().truncate, static_cast<uint64_t>(shorter));
}

int BitsDiffering(const std::string& a, const std::string& b) {
  int bits = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    bits += std::popcount(static_cast<unsigned>(static_cast<uint8_t>(a[i] ^ b[i])));
  }
  return bits;
}

TEST_F(FaultBackendTest, FlippedGetsDifferInOneBit) {
  const std::string data(64, '\x5a');
  ASSERT_TRUE(mem_.Put("k", data.data(), data.size()).ok());
  SetSpec("flip=0.1,seed=3");
  int flipped = 0;
  for (int i = 0; i < kOps; ++i) {
    std::string buf(64, '\0');
    auto n = fault_.Get("k", 0, buf.data(), buf.size());
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(*n, 64u) << "a flip must not change the length";
    int bits = BitsDiffering(buf, data);
    ASSERT_LE(bits, 1);
    flipped += bits;
  }
  ExpectRate(flipped, 0.1, kOps, "flipped gets");
  EXPECT_EQ(fault_.counts().flip, static_cast<uint64_t>(flipped));
}

TEST_F(FaultBackendTest, FlippedPutsStoreOneWrongBitAndLeaveTheCallersBytes) {
  SetSpec("flip=0.3,seed=5");
  const std::string data(32, '\x0f');
  std::string mine = data;
  int flipped = 0;
  for (int i = 0; i < kOps / 4; ++i) {
    std::string key = "f/" + std::to_string(i);
    ASSERT_TRUE(fault_.Put(key, mine.data(), mine.size()).ok());
    ASSERT_EQ(mine, data) << "the caller's buffer was modified";
    auto stored = mem_.GetObject(key);
    ASSERT_TRUE(stored.ok());
    ASSERT_EQ(stored->size(), data.size());
    int bits = BitsDiffering(*stored, data);
    ASSERT_LE(bits, 1);
    flipped += bits;
  }
  ExpectRate(flipped, 0.3, kOps / 4, "flipped puts");
  EXPECT_EQ(fault_.counts().flip, static_cast<uint64_t>(flipped));
}

TEST_F(FaultBackendTest, DelaysSleep) {
  ASSERT_TRUE(mem_.Put("k", "x", 1).ok());
  SetSpec("delay=0.25,delay_ms=2,seed=1,ops=head");
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(fault_.Head("k").ok());
  auto elapsed = std::chrono::steady_clock::now() - start;
  uint64_t delays = fault_.counts().delay;
  ExpectRate(delays, 0.25, 200, "delayed heads");
  EXPECT_GE(elapsed, std::chrono::milliseconds(2 * delays));
  EXPECT_EQ(fault_.counts().total(), delays);
}

TEST_F(FaultBackendTest, CountLimitsFaults) {
  SetSpec("fail=1,count=5");
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(fault_.Delete("k").ok(), i >= 5) << "call " << i;
  }
  EXPECT_EQ(fault_.counts().fail, 5u);
  SetSpec("fail=1,count=2");  // a new spec restarts the count
  EXPECT_FALSE(fault_.Delete("k").ok());
  EXPECT_FALSE(fault_.Delete("k").ok());
  EXPECT_TRUE(fault_.Delete("k").ok());
  EXPECT_EQ(fault_.counts().fail, 7u);
}

TEST_F(FaultBackendTest, OnlyTheChosenOperationsFault) {
  ASSERT_TRUE(mem_.Put("k", "x", 1).ok());
  SetSpec("fail=1,ops=head+list");
  char c;
  EXPECT_TRUE(fault_.Put("k", "y", 1).ok());
  EXPECT_TRUE(fault_.Get("k", 0, &c, 1).ok());
  EXPECT_TRUE(fault_.Delete("other").ok());
  EXPECT_EQ(fault_.Head("k").status().code(), Code::kIo);
  bool called = false;
  EXPECT_EQ(fault_.List("", "", [&](const ObjectInfo&) { return called = true; }).code(),
            Code::kIo);
  EXPECT_FALSE(called) << "a failed List reported objects";
  EXPECT_EQ(fault_.counts().fail, 2u);
}

TEST_F(FaultBackendTest, SameSeedSameFaults) {
  auto outcomes = [](uint64_t seed) {
    MemBackend mem;
    FaultBackend fault(&mem);
    FaultSpec spec;
    spec.fail = 0.3;
    spec.seed = seed;
    EXPECT_TRUE(fault.SetSpec(spec).ok());
    std::vector<bool> ok;
    for (int i = 0; i < 200; ++i) ok.push_back(fault.Put("k", "x", 1).ok());
    return ok;
  };
  EXPECT_EQ(outcomes(42), outcomes(42));
  EXPECT_NE(outcomes(42), outcomes(43));
}

TEST_F(FaultBackendTest, SetSpecChangesBehaviourAtRunTime) {
  SetSpec("fail=1");
  EXPECT_FALSE(fault_.Put("k", "x", 1).ok());
  SetSpec("");
  EXPECT_TRUE(fault_.Put("k", "x", 1).ok());
  FaultSpec bad;
  bad.fail = 2;
  EXPECT_EQ(fault_.SetSpec(bad).code(), Code::kInvalid);
  EXPECT_EQ(fault_.spec().fail, 0) << "a refused spec replaced the old one";
}

// The default GetObject (Head, then Get) catches a body cut short: the lying backend is caught.
TEST_F(FaultBackendTest, TruncatedBodyMakesGetObjectCorrupt) {
  ASSERT_TRUE(mem_.Put("k", "0123456789", 10).ok());
  SetSpec("truncate=1,ops=get");
  EXPECT_EQ(fault_.GetObject("k").status().code(), Code::kCorrupt);
}

TEST(FaultSpecTest, ParsesEveryKey) {
  auto spec = FaultSpec::Parse(
      "fail=0.1,delay_ms=5,truncate=0.01,flip=0.02,delay=0.5,seed=42,count=100,ops=put+get");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->fail, 0.1);
  EXPECT_EQ(spec->truncate, 0.01);
  EXPECT_EQ(spec->flip, 0.02);
  EXPECT_EQ(spec->delay, 0.5);
  EXPECT_EQ(spec->delay_ms, 5u);
  EXPECT_EQ(spec->seed, 42u);
  EXPECT_EQ(spec->count, 100u);
  EXPECT_EQ(spec->ops, kOpPut | kOpGet);
  auto again = FaultSpec::Parse(spec->ToString());
  ASSERT_TRUE(again.ok()) << spec->ToString() << ": " << again.status().ToString();
  EXPECT_EQ(again->ToString(), spec->ToString());
  EXPECT_EQ(again->fail, 0.1);
}

TEST(FaultSpecTest, EmptyInjectsNothing) {
  auto spec = FaultSpec::Parse("");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->fail + spec->truncate + spec->flip, 0);
  EXPECT_EQ(spec->delay_ms, 0u);
  EXPECT_EQ(spec->ops, kOpAll);
  EXPECT_TRUE(FaultSpec::Parse("ops=all").ok());
}

TEST(FaultSpecTest, BadInputIsInvalidAndSaysWhy) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"fail", "not key=value"},
      {"fail=abc", "fail=abc is not a number"},
      {"fail=", "is not a number"},
      {"fail=0.1x", "is not a number"},
      {"fail=1.5", "not a probability"},
      {"flip=-0.1", "not a probability"},
      {"fail=nan", "is not a number"},
      {"bogus=1", "unknown key 'bogus'"},
      {"fail=0.1,fail=0.2", "given twice"},
      {"fail=0.1,", "trailing ','"},
      {"ops=put+bogus", "unknown operation 'bogus'"},
      {"ops=", "unknown operation ''"},
      {"fail=0.6,flip=0.6", "exceeds 1"},
      {"delay_ms=-1", "not a non-negative integer"},
      {"delay_ms=999999", "exceeds"},
      {"seed=x", "not a non-negative integer"},
      {"count=1.5", "not a non-negative integer"},
  };
  for (const Case& c : cases) {
    auto spec = FaultSpec::Parse(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_EQ(spec.status().code(), Code::kInvalid) << c.text;
    EXPECT_NE(spec.status().message().find(c.says), std::string::npos)
        << c.text << " -> " << spec.status().message();
  }
}

TEST(FaultSpecTest, WrapParsesAndOwns) {
  auto wrapped = FaultBackend::Wrap(std::make_unique<MemBackend>("m"), "fail=1,ops=head");
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  EXPECT_EQ((*wrapped)->Describe(), "fault(mem://m)");
  EXPECT_TRUE((*wrapped)->Put("k", "x", 1).ok());
  EXPECT_EQ((*wrapped)->Head("k").status().code(), Code::kIo);
  EXPECT_EQ(FaultBackend::Wrap(std::make_unique<MemBackend>(), "fail=2").status().code(),
            Code::kInvalid);
}

}  // namespace
}  // namespace ckptfs
