#include "metrics/exporter.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

namespace ckptfs {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

struct CounterInfo {
  std::string_view snapshot_name;  // Metrics::Snapshot's
  std::string_view name;           // Prometheus', without the _total suffix
  std::string_view help;
};

// Every counter of Metrics::Snapshot (a unit test checks that none is missing).
constexpr CounterInfo kCounters[] = {
    {"chunks_written", "ckptfs_chunks_written", "New chunks stored on the local tier."},
    {"chunk_bytes_written", "ckptfs_chunk_written_bytes", "Bytes of new chunks stored on the local tier."},
    {"chunk_adopted_bytes", "ckptfs_chunk_adopted_bytes", "Bytes of those stored in place in the staging file that took the write (a pack), not copied."},
    {"chunk_direct_write_bytes", "ckptfs_disk_direct_write_bytes", "Bytes of chunks written to the local tier with O_DIRECT (a chunk's last partial block through the page cache)."},
    {"chunk_dedup_hits", "ckptfs_chunk_dedup_hits", "Chunks a file referenced that were already stored."},
    {"chunk_dedup_bytes", "ckptfs_chunk_dedup_bytes", "Bytes of chunks a file referenced that were already stored."},
    {"chunks_reclaimed", "ckptfs_chunks_reclaimed", "Chunk files removed when their last reference went."},
    {"cache_hit_bytes", "ckptfs_ram_cache_hit_bytes", "Bytes read from the RAM tier."},
    {"cache_miss_bytes", "ckptfs_ram_cache_miss_bytes", "Bytes read from the local disk tier after a RAM tier miss."},
    {"cache_direct_read_bytes", "ckptfs_disk_direct_read_bytes", "Bytes of those read with O_DIRECT (not in the page cache)."},
    {"chunk_verify_failures", "ckptfs_chunk_verify_failures", "Chunks on the local tier whose bytes did not match their name."},
    {"file_commits", "ckptfs_file_commits", "File versions committed (manifests)."},
    {"file_commit_bytes", "ckptfs_file_commit_bytes", "Sizes of the file versions committed."},
    {"staging_switches", "ckptfs_staging_switches", "Files moved from the streaming write path to a staging file."},
    {"staged_files", "ckptfs_staged_files", "Files written through a passthrough staging file."},
    {"staged_seals", "ckptfs_staged_seals", "Staged files cut into chunks and committed."},
    {"staged_seal_bytes", "ckptfs_staged_seal_bytes", "Bytes of staged files cut into chunks."},
    {"tensor_chunk_bytes", "ckptfs_tensor_chunk_bytes", "Bytes chunked at tensor boundaries."},
    {"cut_ahead_cuts", "ckptfs_cut_ahead_cuts", "Seal chunks cut from candidates found ahead (cut_threads)."},
    {"cut_ahead_refused", "ckptfs_cut_ahead_refused", "Parts of a seal with too many cut candidates, scanned in line."},
    {"remote_fetches", "ckptfs_remote_fetches", "Chunks fetched from a remote tier."},
    {"remote_fetch_bytes", "ckptfs_remote_fetch_bytes", "Bytes fetched from remote tiers."},
    {"remote_fetch_fallthrough", "ckptfs_remote_fetch_fallthrough", "Fetched chunks a farther tier than the nearest served."},
    {"tier_files_dropped", "ckptfs_tier_files_dropped", "Files dropped from a nearer tier by its keep policy."},
    {"tier_chunks_restored", "ckptfs_tier_chunks_restored", "Chunks put back into a nearer tier that had lost them."},
    {"remote_verify_failures", "ckptfs_remote_verify_failures", "Fetched chunks whose bytes did not match their name."},
    {"chunks_uploaded", "ckptfs_chunks_uploaded", "Chunks put to remote tiers."},
    {"chunk_upload_bytes", "ckptfs_chunk_upload_bytes", "Bytes of chunks put to remote tiers."},
    {"chunk_upload_skips", "ckptfs_chunk_upload_skips", "Chunks a remote tier already held."},
    {"files_published", "ckptfs_files_published", "File records put to remote tiers."},
    {"chunks_evicted", "ckptfs_chunks_evicted", "Local copies of remote-held chunks removed for room."},
    {"chunk_evict_bytes", "ckptfs_chunk_evict_bytes", "Bytes of local copies removed for room."},
};

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(MetricFamily& f, double v, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = v;
  } else {
    m.gauge.value = v;
  }
  f.metric.push_back(std::move(m));
}

void AddHistogram(MetricFamily& f, const LatencyHistogram& h,
                  std::vector<ClientMetric::Label> labels) {
  const LatencyHistogram::Snapshot s = h.Get();
  ClientMetric m;
  m.label = std::move(labels);
  m.histogram.sample_count = s.count;
  m.histogram.sample_sum = s.sum_s;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < LatencyHistogram::kBounds.size(); ++b) {
    cumulative += s.counts[b];
    m.histogram.bucket.push_back({cumulative, LatencyHistogram::kBounds[b]});
  }
  m.histogram.bucket.push_back({s.count, std::numeric_limits<double>::infinity()});
  f.metric.push_back(std::move(m));
}

void CollectPeers(const PeerMetrics& p, std::vector<MetricFamily>& out) {
  auto counter = [&](std::string name, std::string help, const Counter& c) {
    out.push_back(Family(std::move(name), std::move(help), MetricType::Counter));
    AddValue(out.back(), static_cast<double>(c.Get()));
  };
  auto by_reason = [&](std::string name, std::string help, const auto& counters,
                       const auto& names) {
    out.push_back(Family(std::move(name), std::move(help), MetricType::Counter));
    for (size_t r = 0; r < names.size(); ++r) {
      AddValue(out.back(), static_cast<double>(counters[r].Get()), {{"reason", names[r]}});
    }
  };
  counter("ckptfs_peer_served_chunks_total", "Chunks this node served to its peers.",
          p.served_chunks);
  counter("ckptfs_peer_served_bytes_total", "Bytes of chunks this node served to its peers.",
          p.served_bytes);
  by_reason("ckptfs_peer_refused_requests_total",
            "Peer requests refused: not a request with the bucket's proof and a time near this "
            "node's clock (proof), a replayed nonce, a bad chunk length, or cut short.",
            p.refused, kPeerRefusalNames);
  by_reason("ckptfs_peer_unserved_requests_total",
            "Good peer requests not answered with the chunk: not held or owned here, or not "
            "readable.",
            p.unserved, kPeerUnservedNames);
  counter("ckptfs_peer_fetched_chunks_total", "Chunks this node's reads got from their owners.",
          p.fetched_chunks);
  counter("ckptfs_peer_fetched_bytes_total", "Bytes of chunks got from their owners.",
          p.fetched_bytes);
  by_reason("ckptfs_peer_fallbacks_total",
            "Chunks another node owns that this node fetched from the store, by why: the owner "
            "was marked down, had not the chunk, refused, failed, was slower than peer_timeout, "
            "or answered bytes that are not the chunk's.",
            p.fallbacks, kPeerFallbackNames);
  out.push_back(Family("ckptfs_peer_request_seconds",
                       "Chunk requests to peers by outcome (not_found: the peer had not the chunk).",
                       MetricType::Histogram));
  for (size_t o = 0; o < kOutcomeNames.size(); ++o) {
    AddHistogram(out.back(), p.requests[o], {{"outcome", kOutcomeNames[o]}});
  }
  const int64_t peers = p.peers.load(std::memory_order_relaxed);
  const int64_t down = p.peers_down.load(std::memory_order_relaxed);
  out.push_back(Family("ckptfs_peers_live",
                       "Other nodes counted for owning chunks and not marked down.",
                       MetricType::Gauge));
  AddValue(out.back(), static_cast<double>(std::max<int64_t>(peers - down, 0)));
  out.push_back(Family("ckptfs_peers_down",
                       "Nodes marked down after a failure: their chunks come from the store until a "
                       "read asks them again, after a while (30 s).",
                       MetricType::Gauge));
  AddValue(out.back(), static_cast<double>(down));
}

std::vector<MetricFamily> Collect(Store* store, const PeerMetrics* peers) {
  std::vector<MetricFamily> out;
  const Metrics& metrics = store->metrics();
  std::map<std::string, uint64_t, std::less<>> values;
  for (auto& [name, v] : metrics.Snapshot()) values.emplace(name, v);
  for (const CounterInfo& c : kCounters) {
    auto it = values.find(c.snapshot_name);
    if (it == values.end()) continue;
    out.push_back(Family(std::string(c.name) + "_total", std::string(c.help), MetricType::Counter));
    AddValue(out.back(), static_cast<double>(it->second));
  }

  const Store::Gauges g = store->gauges();
  auto gauge = [&](std::string name, std::string help, double v) {
    out.push_back(Family(std::move(name), std::move(help), MetricType::Gauge));
    AddValue(out.back(), v);
  };
  gauge("ckptfs_local_tier_bytes", "Bytes of chunk files on the local tier.", g.cache.disk_bytes);
  gauge("ckptfs_local_tier_limit_bytes", "The local tier's limit (cache_size; 0: none).",
        g.cache.disk_limit);
  gauge("ckptfs_local_only_bytes", "Bytes on the local tier no remote tier holds yet.",
        g.cache.local_only);
  gauge("ckptfs_ram_tier_bytes", "Memory held by the RAM tier's chunk buffers.", g.cache.ram_bytes);
  gauge("ckptfs_ram_tier_limit_bytes", "The RAM tier's size (ram_cache).", g.cache.ram_limit);
  gauge("ckptfs_write_queue_bytes", "Bytes written, acknowledged and not yet chunked.",
        g.write_queue_bytes);
  gauge("ckptfs_write_queue_limit_bytes", "The write queue's limit.", g.write_queue_limit);
  gauge("ckptfs_put_copy_bytes", "Memory of chunk copies on their way to the local tier.",
        g.put_copy_bytes);
  gauge("ckptfs_put_copy_limit_bytes", "The limit of chunk copies on their way to the local tier.",
        g.put_copy_limit);
  gauge("ckptfs_open_files", "Files with open handles or uncommitted bytes.", g.open_files);
  gauge("ckptfs_files_not_yet_durable",
        "Files whose newest version, closed without fsync, is not yet synced (a fallback kept).",
        g.fallback_files);
  gauge("ckptfs_view_plans", "View directories planned and held (until unmount).",
        metrics.view_plans.Get());
  out.push_back(Family("ckptfs_tier_ops_waiting",
                       "Files and namespace changes waiting to be published to a remote tier.",
                       MetricType::Gauge));
  for (size_t t = 0; t < g.ops_waiting.size(); ++t) {
    AddValue(out.back(), static_cast<double>(g.ops_waiting[t]), {{"tier", std::to_string(t + 1)}});
  }
  out.push_back(Family("ckptfs_tier_failing",
                       "1 while a remote tier's last request failed (it is being retried).",
                       MetricType::Gauge));
  for (size_t t = 0; t < g.tier_errors.size(); ++t) {
    AddValue(out.back(), g.tier_errors[t].empty() ? 0 : 1, {{"tier", std::to_string(t + 1)}});
  }

  out.push_back(Family("ckptfs_fuse_request_seconds",
                       "Time the daemon spent on a FUSE request, by kind.", MetricType::Histogram));
  for (size_t k = 0; k < kFuseOpNames.size(); ++k) {
    AddHistogram(out.back(), metrics.fuse_requests[k], {{"op", kFuseOpNames[k]}});
  }
  out.push_back(Family("ckptfs_backend_request_seconds",
                       "Remote tier requests by tier, kind and outcome.", MetricType::Histogram));
  for (size_t t = 0; t < g.ops_waiting.size() && t < metrics.backend_requests.size(); ++t) {
    for (size_t k = 0; k < kBackendRequestNames.size(); ++k) {
      for (size_t o = 0; o < kOutcomeNames.size(); ++o) {
        AddHistogram(out.back(), metrics.backend_requests[t][k][o],
                     {{"tier", std::to_string(t + 1)}, {"op", kBackendRequestNames[k]},
                      {"outcome", kOutcomeNames[o]}});
      }
    }
  }
  out.push_back(Family("ckptfs_chunk_fetch_seconds",
                       "Fetches of chunks missing locally from the remote tiers (reads and "
                       "prefetches; every tier and retry included).",
                       MetricType::Histogram));
  AddHistogram(out.back(), metrics.chunk_fetches, {});
  if (peers) CollectPeers(*peers, out);
  return out;
}

class Collector : public prometheus::Collectable {
 public:
  Collector(Store* store, const PeerMetrics* peers) : store_(store), peers_(peers) {}
  std::vector<MetricFamily> Collect() const override { return ckptfs::Collect(store_, peers_); }

 private:
  Store* const store_;
  const PeerMetrics* const peers_;
};

}  // namespace

struct MetricsServer::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<Collector> collector;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                            Store* store,
                                                            const PeerMetrics* peers) {
  const size_t colon = address.rfind(':');
  const size_t port = colon == std::string::npos ? 0 : colon + 1;
  if (port == address.size() || address.size() - port > 5 ||
      address.find_first_not_of("0123456789", port) != std::string::npos ||
      std::stoul(address.substr(port)) > 65535) {
    return Invalid("metrics=" + address + ": expected ADDRESS:PORT (127.0.0.1:9567)");
  }
  auto impl = std::make_unique<Impl>();
  try {
    // Two threads serve scrapes: a scrape is cheap, and an idle connection (a second
    // Prometheus, a port scanner) must not hold up the next one.
    impl->exposer = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return Status(Code::kIo, "metrics=" + address + ": cannot listen: " + e.what());
  }
  impl->collector = std::make_shared<Collector>(store, peers);
  impl->exposer->RegisterCollectable(impl->collector);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

int MetricsServer::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

std::string MetricsServer::Render(Store* store, const PeerMetrics* peers) {
  return prometheus::TextSerializer().Serialize(ckptfs::Collect(store, peers));
}

std::string MetricsServer::CounterName(std::string_view snapshot_name) {
  for (const CounterInfo& c : kCounters) {
    if (c.snapshot_name == snapshot_name) return std::string(c.name);
  }
  return "";
}

}  // namespace ckptfs
