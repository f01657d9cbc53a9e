// S3Backend against a real Ceph radosgw (started by scripts/rgw.sh for this binary): the backend
// conformance suite, multipart uploads, errors at open, and retries through a proxy that
// answers 503 SlowDown (and worse) on command.
#include "backends/s3_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "backends/http.h"
#include "tests/backends/backend_conformance.h"
#include "tests/backends/s3_rgw_env.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using test::Rgw;

// One radosgw for the whole binary, up before the first test and stopped after the last.
const bool kRgwRegistered = test::RegisterRgwEnvironment();

S3Options RgwOptions(const std::string& prefix = "") {
  S3Options o;
  o.endpoint = Rgw().endpoint();
  o.bucket = test::kBucket;
  o.prefix = prefix;
  return o;
}

std::unique_ptr<Backend> MustOpen(S3Options o) {
  auto b = OpenS3Backend(o);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

std::string Bytes(size_t n, uint64_t seed) {
  auto v = test::RandomBytes(n, seed);
  return std::string(v.begin(), v.end());
}

INSTANTIATE_BACKEND_CONFORMANCE(S3Rgw, [] {
  static int n = 0;
  auto b = OpenS3Backend(RgwOptions());
  if (!b.ok()) ADD_FAILURE() << "open: " << b.status().ToString();
  return test::BackendUnderTest{b.ok() ? std::move(b).value() : nullptr,
                                "conformance/" + std::to_string(n++) + "/"};
});

TEST(S3BackendTest, PrefixIsolatesAndDescribeHidesSecrets) {
  auto root = MustOpen(RgwOptions());
  auto b = MustOpen(RgwOptions("prefixed/run7"));
  ASSERT_TRUE(root && b);
  ASSERT_TRUE(b->Put("a/b", "xyz", 3).ok());
  auto info = root->Head("prefixed/run7/a/b");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, 3u);
  std::vector<std::string> keys;
  ASSERT_TRUE(b->List("", "", [&](const ObjectInfo& o) {
                 keys.push_back(o.key);
                 return true;
               }).ok());
  EXPECT_EQ(keys, std::vector<std::string>{"a/b"});
  std::string d = b->Describe();
  EXPECT_NE(d.find("s3://" + test::kBucket + "/prefixed/run7"), std::string::npos) << d;
  EXPECT_EQ(d.find(Rgw().Var("AWS_SECRET_ACCESS_KEY")), std::string::npos) << d;
  EXPECT_EQ(d.find(Rgw().Var("AWS_ACCESS_KEY_ID")), std::string::npos) << d;
  EXPECT_TRUE(b->Delete("a/b").ok());
}

TEST(S3BackendTest, MultipartRoundTrip) {
  S3Options o = RgwOptions("multipart");
  o.multipart_part_bytes = 5 << 20;  // S3's smallest part
  auto b = MustOpen(o);
  ASSERT_TRUE(b);
  auto* s3 = static_cast<S3Backend*>(b.get());
  const std::string data = Bytes((12 << 20) + 12345, 7);  // three parts, the last one short
  uint64_t before = s3->requests();
  ASSERT_TRUE(b->Put("big", data.data(), data.size()).ok());
  EXPECT_GE(s3->requests() - before, 5u) << "create, three parts, complete";
  auto whole = b->GetObject("big");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(*whole == data);
  std::string piece(1 << 20, '\0');  // across the first part boundary
  auto n = b->Get("big", (5 << 20) - 1000, piece.data(), piece.size());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, piece.size());
  EXPECT_TRUE(piece == data.substr((5 << 20) - 1000, piece.size()));
  // radosgw answers the Complete without an ETag; HEAD and List still agree on one.
  auto info = b->Head("big");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, data.size());
  EXPECT_FALSE(info->version.empty());
  std::vector<ObjectInfo> listed;
  ASSERT_TRUE(b->List("big", "", [&](const ObjectInfo& o) {
                 listed.push_back(o);
                 return true;
               }).ok());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].version, info->version);
  EXPECT_EQ(listed[0].size, data.size());
  // An independent client (boto3) sees the same bytes, and no upload is left open.
  std::string out;
  ASSERT_EQ(Rgw().Admin("get " + test::kBucket + " multipart/big", &out), 0) << out;
  EXPECT_EQ(out, std::to_string(data.size()) + " " + Sha256Hex(data.data(), data.size()) + "\n");
  ASSERT_EQ(Rgw().Admin("uploads " + test::kBucket, &out), 0) << out;
  EXPECT_EQ(out, "0\n");
  EXPECT_TRUE(b->Delete("big").ok());
}

TEST(S3BackendTest, ListPagesThroughContinuationTokens) {
  S3Options o = RgwOptions("paged");
  o.list_page_keys = 7;
  auto b = MustOpen(o);
  ASSERT_TRUE(b);
  std::vector<std::string> want;
  for (int i = 0; i < 25; ++i) {
    std::string key = "k " + std::to_string(100 + i) + (i % 3 ? "+x" : "/\xc3\xa9&");
    ASSERT_TRUE(b->Put(key, "v", 1).ok()) << key;
    want.push_back(key);
  }
  std::sort(want.begin(), want.end());
  std::vector<std::string> got;
  ASSERT_TRUE(b->List("k ", "", [&](const ObjectInfo& info) {
                 got.push_back(info.key);
                 return true;
               }).ok());
  EXPECT_EQ(got, want);
  got.clear();
  ASSERT_TRUE(b->List("", want[9], [&](const ObjectInfo& info) {
                 got.push_back(info.key);
                 return true;
               }).ok());
  EXPECT_EQ(got, std::vector<std::string>(want.begin() + 10, want.end()));
  for (const std::string& key : want) EXPECT_TRUE(b->Delete(key).ok());
}

TEST(S3BackendTest, MissingBucketFailsAtOpen) {
  S3Options o = RgwOptions();
  o.bucket = "ckptfs-no-such-bucket";
  auto b = OpenS3Backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kNotFound) << b.status().ToString();
  EXPECT_NE(b.status().message().find("ckptfs-no-such-bucket"), std::string::npos);
  EXPECT_NE(b.status().message().find("NoSuchBucket"), std::string::npos);
}

TEST(S3BackendTest, RefusedCredentialsFailAtOpen) {
  S3Options o = RgwOptions();
  o.credentials = {Rgw().Var("AWS_ACCESS_KEY_ID"), "not-the-secret-key"};
  auto b = OpenS3Backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kPermission) << b.status().ToString();
  EXPECT_EQ(b.status().message().find("not-the-secret-key"), std::string::npos);
  EXPECT_NE(b.status().message().find("SignatureDoesNotMatch"), std::string::npos);

  o.credentials = {"NOSUCHACCESSKEY", Rgw().Var("AWS_SECRET_ACCESS_KEY")};
  b = OpenS3Backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kPermission) << b.status().ToString();
  EXPECT_EQ(b.status().message().find(Rgw().Var("AWS_SECRET_ACCESS_KEY")), std::string::npos);
}

TEST(S3BackendTest, UnreachableEndpointFailsAtOpen) {
  S3Options o = RgwOptions();
  o.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  o.max_attempts = 2;
  o.retry_base_ms = 1;
  auto b = OpenS3Backend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kIo) << b.status().ToString();
  EXPECT_NE(b.status().message().find("cannot reach"), std::string::npos);
}

TEST(S3BackendTest, HttpsWithVerifiedCertificate) {
  std::string url = Rgw().ProxyUrl(/*tls=*/true);
  ASSERT_FALSE(url.empty()) << "the TLS proxy did not start";
  S3Options o = RgwOptions("tls");
  o.endpoint = url;
  o.ca_file = Rgw().TlsCaFile();
  auto b = MustOpen(o);
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->Put("x", "over tls", 8).ok());
  auto got = b->GetObject("x");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "over tls");
  EXPECT_TRUE(b->Delete("x").ok());
  // A certificate nobody vouches for is refused, at once (no retry helps).
  o.ca_file.clear();
  o.retry_base_ms = 1000;
  auto t0 = std::chrono::steady_clock::now();
  auto refused = OpenS3Backend(o);
  EXPECT_EQ(refused.status().code(), Code::kIo) << refused.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  o.verify_tls = false;
  EXPECT_TRUE(OpenS3Backend(o).ok());
}

// Not a benchmark with a verdict: numbers for the log (small-object latency, 64 MiB throughput)
// against this machine's radosgw, with correctness checked on the way.
TEST(S3BackendTest, PerformanceReport) {
  using Clock = std::chrono::steady_clock;
  auto b = MustOpen(RgwOptions("perf"));
  ASSERT_TRUE(b);
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const std::string small = Bytes(4096, 1);
  ASSERT_TRUE(b->Put("small", small.data(), small.size()).ok());
  constexpr int kRounds = 200;
  std::vector<double> lat;
  std::string buf(4096, '\0');
  for (int i = 0; i < kRounds; ++i) {
    auto t0 = Clock::now();
    auto n = b->Get("small", 0, buf.data(), buf.size());
    lat.push_back(ms(Clock::now() - t0));
    ASSERT_TRUE(n.ok() && *n == 4096 && buf == small);
  }
  std::sort(lat.begin(), lat.end());
  auto t0 = Clock::now();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(b->Put("small", small.data(), small.size()).ok());
  double put_ms = ms(Clock::now() - t0) / 50;

  const std::string big = Bytes(64 << 20, 2);
  t0 = Clock::now();
  ASSERT_TRUE(b->Put("big", big.data(), big.size()).ok());
  double put_big = ms(Clock::now() - t0);
  t0 = Clock::now();
  auto whole = b->GetObject("big");
  double get_big = ms(Clock::now() - t0);
  ASSERT_TRUE(whole.ok() && *whole == big);
  std::string into(big.size(), '\0');
  t0 = Clock::now();
  std::vector<std::thread> threads;
  std::atomic<bool> ok{true};
  constexpr size_t kSlice = 8 << 20;
  for (size_t off = 0; off < big.size(); off += kSlice) {
    threads.emplace_back([&, off] {
      auto n = b->Get("big", off, into.data() + off, kSlice);
      if (!n.ok() || *n != kSlice) ok = false;
    });
  }
  for (auto& t : threads) t.join();
  double get_par = ms(Clock::now() - t0);
  ASSERT_TRUE(ok && into == big);
  auto mbps = [](double ms) { return 64.0 / (ms / 1000.0); };
  std::cout << "radosgw (memstore, loopback): 4 KiB GET p50 " << lat[kRounds / 2] << " ms, p99 "
            << lat[kRounds * 99 / 100] << " ms; 4 KiB PUT " << put_ms << " ms\n"
            << "64 MiB: PUT (4 x 16 MiB parts in parallel) " << put_big << " ms = " << mbps(put_big)
            << " MiB/s; GET one stream " << get_big << " ms = " << mbps(get_big)
            << " MiB/s; 8 ranged GETs in parallel " << get_par << " ms = " << mbps(get_par)
            << " MiB/s\n";
  EXPECT_TRUE(b->Delete("big").ok());
  EXPECT_TRUE(b->Delete("small").ok());
}

// --- Through the flaky proxy -------------------------------------------------------------------

class S3FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    proxy_ = Rgw().ProxyUrl();
    ASSERT_FALSE(proxy_.empty()) << "the flaky proxy did not start";
    Arm("mode=error&count=0");
    S3Options o = RgwOptions("faults");
    o.endpoint = proxy_;
    o.max_attempts = 4;
    o.retry_base_ms = 2;
    o.retry_max_ms = 20;
    o.multipart_part_bytes = 5 << 20;
    auto b = OpenS3Backend(o);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    s3_ = static_cast<S3Backend*>(backend_.get());
    ASSERT_TRUE(backend_->Put("obj", "0123456789", 10).ok());
  }
  void TearDown() override {
    if (!backend_) return;
    Arm("mode=error&count=0");
    EXPECT_TRUE(backend_->Delete("obj").ok());
  }

  // Sends a control request to the proxy; returns its answer.
  std::string Control(const std::string& path_and_query) {
    auto http = HttpClient::Create(HttpClient::Options{});
    EXPECT_TRUE(http.ok());
    HttpRequest req{.method = "GET", .url = proxy_ + path_and_query};
    HttpResponse resp;
    bool retryable;
    EXPECT_TRUE((*http)->Perform(req, &resp, &retryable).ok());
    return resp.body;
  }
  void Arm(const std::string& query) { EXPECT_EQ(Control("/__fault/arm?" + query), "armed"); }
  std::string Stats() { return Control("/__fault/stats"); }

  std::string proxy_;
  std::unique_ptr<Backend> backend_;
  S3Backend* s3_ = nullptr;
};

TEST_F(S3FaultTest, RetriesThrottlingAndServerErrorsThenSucceeds) {
  uint64_t before = s3_->retries();
  Arm("mode=error&status=503&code=SlowDown&count=3");
  ASSERT_TRUE(backend_->Put("obj", "abcdefghij", 10).ok());
  EXPECT_EQ(Stats(), "faulted=3 forwarded=1");
  EXPECT_EQ(s3_->retries() - before, 3u);

  Arm("mode=error&status=500&code=InternalError&count=2");
  char buf[10];
  auto n = backend_->Get("obj", 0, buf, 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::string(buf, *n), "abcdefghij");
  EXPECT_EQ(Stats(), "faulted=2 forwarded=1");

  Arm("mode=error&status=429&code=TooManyRequests&count=3");
  auto info = backend_->Head("obj");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, 10u);

  Arm("mode=drop&count=2");  // connections closed without an answer
  std::vector<std::string> keys;
  ASSERT_TRUE(backend_
                  ->List("", "",
                         [&](const ObjectInfo& o) {
                           keys.push_back(o.key);
                           return true;
                         })
                  .ok());
  EXPECT_EQ(keys, std::vector<std::string>{"obj"});
  EXPECT_EQ(Stats(), "faulted=2 forwarded=1");
}

TEST_F(S3FaultTest, ConnectionsAreReused) {
  int before = std::stoi(Control("/__fault/connections"));
  char buf[10];
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(backend_->Get("obj", 0, buf, 10).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(backend_->Put("obj", "0123456789", 10).ok());
  // One for each of the two control requests; the 40 requests above ran on one kept-alive one.
  EXPECT_LE(std::stoi(Control("/__fault/connections")) - before, 3);
}

TEST_F(S3FaultTest, GivesUpWithIoAfterTheRetryBudget) {
  Arm("mode=error&status=503&code=SlowDown&count=1000");
  char buf[10];
  auto n = backend_->Get("obj", 0, buf, 10);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kIo);
  EXPECT_NE(n.status().message().find("SlowDown"), std::string::npos) << n.status().message();
  EXPECT_NE(n.status().message().find("GET faults/obj"), std::string::npos) << n.status().message();
  EXPECT_EQ(Stats(), "faulted=4 forwarded=0");
  Arm("mode=drop&count=1000");
  EXPECT_EQ(backend_->Put("obj", "x", 1).code(), Code::kIo);
  // libcurl itself tries once more when a kept-alive connection turns out closed, so each of
  // the 4 tries may show up twice.
  int faulted = -1, forwarded = -1;
  ASSERT_EQ(std::sscanf(Stats().c_str(), "faulted=%d forwarded=%d", &faulted, &forwarded), 2);
  EXPECT_GE(faulted, 4);
  EXPECT_LE(faulted, 8);
  EXPECT_EQ(forwarded, 0);
}

TEST_F(S3FaultTest, ClientErrorsAreNotRetried) {
  uint64_t before = s3_->retries();
  Arm("mode=error&status=403&code=AccessDenied&count=1");
  char buf[10];
  EXPECT_EQ(backend_->Get("obj", 0, buf, 10).status().code(), Code::kPermission);
  Arm("mode=error&status=400&code=InvalidArgument&count=1");
  EXPECT_EQ(backend_->Put("obj", "x", 1).code(), Code::kInvalid);
  EXPECT_EQ(Stats(), "faulted=1 forwarded=0");
  EXPECT_EQ(s3_->retries(), before);
}

TEST_F(S3FaultTest, BodyShorterOrLongerThanPromisedIsCorrupt) {
  char buf[20];
  Arm("mode=shorten&count=1");
  auto n = backend_->Get("obj", 2, buf, 5);
  EXPECT_EQ(n.status().code(), Code::kCorrupt) << n.status().ToString();
  Arm("mode=lengthen&count=1");
  n = backend_->Get("obj", 2, buf, 5);
  EXPECT_EQ(n.status().code(), Code::kCorrupt) << n.status().ToString();
  Arm("mode=lengthen&count=1");  // asked for more than there is: 10 bytes promised, 11 sent
  n = backend_->Get("obj", 0, buf, 20);
  EXPECT_EQ(n.status().code(), Code::kCorrupt) << n.status().ToString();
  n = backend_->Get("obj", 2, buf, 5);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buf, *n), "23456");
}

TEST_F(S3FaultTest, AWholeObjectLongerThanExpectedIsCorruptAndAShorterOneComesBackShort) {
  char buf[10];
  auto n = backend_->GetExact("obj", buf, 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::string(buf, *n), "0123456789");
  Arm("mode=lengthen&count=1");  // 11 bytes where 10 are expected
  n = backend_->GetExact("obj", buf, 10);
  EXPECT_EQ(n.status().code(), Code::kCorrupt) << n.status().ToString();
  Arm("mode=shorten&count=1");  // 9 bytes: what there is, for the caller (a chunk fetch) to refuse
  n = backend_->GetExact("obj", buf, 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 9u);
  n = backend_->GetExact("obj", buf, 10);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::string(buf, *n), "0123456789");
}

TEST_F(S3FaultTest, FailedMultipartUploadIsAborted) {
  const std::string data = Bytes((10 << 20) + 1, 9);
  // Every part upload is refused (the create and the abort pass).
  Arm("mode=error&status=403&code=AccessDenied&match=partNumber&count=1000");
  Status st = backend_->Put("mp", data.data(), data.size());
  EXPECT_EQ(st.code(), Code::kPermission) << st.ToString();
  Arm("mode=error&count=0");
  std::string out;
  ASSERT_EQ(Rgw().Admin("uploads " + test::kBucket, &out), 0) << out;
  EXPECT_EQ(out, "0\n") << "the upload was not aborted";
  EXPECT_EQ(backend_->Head("mp").status().code(), Code::kNotFound);
  // And with throttling in the middle, it completes.
  Arm("mode=error&status=503&code=SlowDown&skip=2&count=2");
  ASSERT_TRUE(backend_->Put("mp", data.data(), data.size()).ok());
  auto got = backend_->GetObject("mp");
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == data);
  EXPECT_TRUE(backend_->Delete("mp").ok());
}

}  // namespace
}  // namespace ckptfs
