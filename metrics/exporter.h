// The Prometheus exporter of a mount (-o metrics=ADDRESS:PORT): serves the store's counters,
// gauges and latency histograms in the text exposition format at http://ADDRESS:PORT/metrics,
// through prometheus-cpp's pull server. Names and units: docs/metrics.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "store/store.h"

namespace ckptfs {

class MetricsServer {
 public:
  // Listens on `address` ("127.0.0.1:9567", "[::1]:9567", "9567" for every address) until
  // destroyed. kInvalid or kIo when the address cannot be used. With `peers` (a mount with
  // peer_listen= or peers=), the peer path's metrics too; it must outlive the server.
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& address, Store* store,
                                                      const PeerMetrics* peers = nullptr);
  ~MetricsServer();
  // The port listened on (the one asked for, or the one the kernel chose for port 0).
  int port() const;

  // The exposition text, as a scrape gets it (tests, `ckptfs status`).
  static std::string Render(Store* store, const PeerMetrics* peers = nullptr);
  // The Prometheus name of a counter of Metrics::Snapshot (without _total); "" for none.
  static std::string CounterName(std::string_view snapshot_name);

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptfs
