#include "metrics/exporter.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "backends/mem_backend.h"
#include "backends/timed_backend.h"
#include "tests/store/store_fixture.h"

namespace ckptfs {
namespace {

TEST(ExporterTest, EveryCounterHasAPrometheusName) {
  Metrics m;
  for (const auto& [name, value] : m.Snapshot()) {
    EXPECT_NE(MetricsServer::CounterName(name), "") << name << " is not exported";
  }
}

class ExporterStoreTest : public test::StoreFixture {
 protected:
  void SetUp() override {
    StoreFixture::SetUp();
    store_.reset();
    auto s = Store::Open(cfg_, {}, std::make_unique<MemBackend>());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
};

TEST(LatencyHistogramTest, BucketsAreUpperBoundsAndTheSumIsInSeconds) {
  LatencyHistogram h;
  h.Observe(std::chrono::milliseconds(1));  // exactly a bound: in its bucket (le="0.001")
  h.Observe(std::chrono::microseconds(1001));
  h.Observe(std::chrono::seconds(6));  // above every bound
  const LatencyHistogram::Snapshot s = h.Get();
  const size_t ms = 4;  // kBounds[4] == 0.001
  ASSERT_EQ(LatencyHistogram::kBounds[ms], 0.001);
  EXPECT_EQ(s.counts[ms], 1u);
  EXPECT_EQ(s.counts[ms + 1], 1u);
  EXPECT_EQ(s.counts.back(), 1u);
  EXPECT_EQ(s.count, 3u);
  EXPECT_NEAR(s.sum_s, 6.002001, 1e-9);
}

TEST(TimedBackendTest, TimesEveryRequestByKindAndOutcome) {
  Metrics m;
  TimedBackend b(std::make_unique<MemBackend>(), &m, 1);
  ASSERT_TRUE(b.Put("k", "abc", 3).ok());
  char buf[8];
  ASSERT_TRUE(b.Get("k", 0, buf, sizeof(buf)).ok());
  EXPECT_EQ(b.Get("absent", 0, buf, sizeof(buf)).status().code(), Code::kNotFound);
  EXPECT_EQ(b.Head("absent").status().code(), Code::kNotFound);
  EXPECT_EQ(m.backend(1, BackendRequest::kPut, Outcome::kOk).Get().count, 1u);
  EXPECT_EQ(m.backend(1, BackendRequest::kGet, Outcome::kOk).Get().count, 1u);
  EXPECT_EQ(m.backend(1, BackendRequest::kGet, Outcome::kNotFound).Get().count, 1u);
  EXPECT_EQ(m.backend(1, BackendRequest::kHead, Outcome::kNotFound).Get().count, 1u);
  EXPECT_EQ(m.backend(0, BackendRequest::kPut, Outcome::kOk).Get().count, 0u);  // another tier's
}

TEST_F(ExporterStoreTest, RendersCountersGaugesAndHistograms) {
  const InodeRecord f = File(kRootIno, "f");
  const test::Bytes bytes = test::RandomBytes(3 << 20, 7);
  WriteFile(f.ino, bytes);
  store_->metrics().fuse(FuseOp::kWrite).Observe(std::chrono::microseconds(300));

  const std::string text = MetricsServer::Render(store_.get());
  EXPECT_NE(text.find("# TYPE ckptfs_file_commits_total counter\nckptfs_file_commits_total 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("ckptfs_file_commit_bytes_total " + std::to_string(bytes.size())),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE ckptfs_local_tier_bytes gauge"), std::string::npos);
  EXPECT_NE(text.find("ckptfs_tier_ops_waiting{tier=\"1\"}"), std::string::npos);
  // 300 us lands in the 0.0005 bucket and every one above it.
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_bucket{op=\"write\",le=\"0.00025\"} 0"),
            std::string::npos) << text;
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_bucket{op=\"write\",le=\"0.0005\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_bucket{op=\"write\",le=\"+Inf\"} 1"),
            std::string::npos);
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_count{op=\"write\"} 1"), std::string::npos);
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_sum{op=\"write\"} 0.0003"), std::string::npos);
  // Cumulative: every bucket from 0.0005 up holds it.
  EXPECT_NE(text.find("ckptfs_fuse_request_seconds_bucket{op=\"write\",le=\"5\"} 1"),
            std::string::npos);
  // Backend requests by tier, kind and outcome: one series each for the store's one tier.
  EXPECT_NE(text.find("ckptfs_backend_request_seconds_count{tier=\"1\",op=\"put\",outcome=\"ok\"}"),
            std::string::npos);
}

TEST_F(ExporterStoreTest, RendersThePeerPathOnlyForAMountWithPeers) {
  EXPECT_EQ(MetricsServer::Render(store_.get()).find("ckptfs_peer"), std::string::npos);
  PeerMetrics p;
  p.served_chunks.Add(3);
  p.fallback(PeerFallback::kBadBytes).Add(2);
  p.refusal(PeerRefusal::kReplay).Add(1);
  p.request(Outcome::kOk).Observe(std::chrono::microseconds(300));
  p.peers = 7;
  p.peers_down = 2;
  const std::string text = MetricsServer::Render(store_.get(), &p);
  for (const char* want : {
           "# TYPE ckptfs_peer_served_chunks_total counter\nckptfs_peer_served_chunks_total 3\n",
           "ckptfs_peer_fallbacks_total{reason=\"bad_bytes\"} 2\n",
           "ckptfs_peer_fallbacks_total{reason=\"slow\"} 0\n",
           "ckptfs_peer_refused_requests_total{reason=\"replay\"} 1\n",
           "ckptfs_peer_unserved_requests_total{reason=\"not_here\"} 0\n",
           "ckptfs_peer_request_seconds_count{outcome=\"ok\"} 1\n",
           "# TYPE ckptfs_peers_live gauge\nckptfs_peers_live 5\n",
           "ckptfs_peers_down 2\n"}) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
}

TEST_F(ExporterStoreTest, RefusesAnAddressWithoutAPort) {
  for (const char* bad : {"127.0.0.1:", "localhost:http", "", "127.0.0.1:70000"}) {
    auto s = MetricsServer::Start(bad, store_.get());
    EXPECT_EQ(s.status().code(), Code::kInvalid) << bad;
  }
}

TEST_F(ExporterStoreTest, ServesOnTheAddressAskedFor) {
  auto s = MetricsServer::Start("127.0.0.1:0", store_.get());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_GT((*s)->port(), 0);
  // A port in use is an error at start, not a silent exporter-less mount.
  auto again = MetricsServer::Start("127.0.0.1:" + std::to_string((*s)->port()), store_.get());
  EXPECT_FALSE(again.ok());
}

}  // namespace
}  // namespace ckptfs
