// PeerServer: a node's endpoint for its peers (-o peer_listen=ADDR:PORT). It serves chunks by
// id and nothing else (peers/peer_protocol.h): one request per connection, checked against the
// bucket's peer key first. A request without a valid proof, with a time too far off, or with a
// nonce seen before is refused and logged with the peer's address; a good one is answered from
// `serve`. Counts what it served and refused, by reason, in PeerMetrics.
//
// Runs its own threads from Start to Stop (or destruction). Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/chunk_id.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/mutex.h"
#include "common/status.h"
#include "peers/peer_net.h"

namespace ckptfs {

class PeerServer {
 public:
  // The bytes of chunk `id` of `len` bytes, in a buffer that stays valid until `done` runs:
  // kNotFound when this node neither has it nor owns it. Called on the server's threads.
  struct Chunk {
    const void* bytes = nullptr;
    std::shared_ptr<const void> keep;  // holds the bytes
  };
  using Serve = std::function<Result<Chunk>(const ChunkId& id, uint64_t len)>;
  static constexpr int kThreads = 32;

  // Listens on `address` ("IPV4:PORT", exactly that address; port 0 with `any_port`: one the
  // kernel picks, for tests), checks requests against `key`,
  // answers with `serve` on `threads` threads. Chunks longer than `max_len` are refused. Counts
  // into `metrics` (one of its own when null), which must outlive it.
  // Test fault (CKPTFS_PEER_FAULTS=corrupt in the environment): every answer's first byte is
  // flipped, so that receivers must catch it; logged at start.
  static Result<std::unique_ptr<PeerServer>> Start(const std::string& address, std::string key,
                                                   uint64_t max_len, Serve serve,
                                                   bool any_port = false, int threads = kThreads,
                                                   PeerMetrics* metrics = nullptr);
  ~PeerServer();
  // Stops accepting and waits for the requests being answered.
  void Stop();
  uint16_t port() const { return port_; }
  PeerMetrics& metrics() { return *metrics_; }

 private:
  PeerServer(Socket listen, std::string key, uint64_t max_len, Serve serve, PeerMetrics* metrics);
  void Refuse(Socket& conn, const std::string& from, PeerRefusal reason, const std::string& why);
  void Run();
  void Handle(Socket conn);
  // Whether `nonce` is new (then remembered for twice the allowed skew).
  bool FreshNonce(const std::string& nonce, int64_t now);

  Socket listen_;
  const std::string key_;
  const uint64_t max_len_;
  const Serve serve_;
  uint16_t port_ = 0;
  bool corrupt_ = false;  // test fault
  Logger log_;
  std::unique_ptr<PeerMetrics> own_metrics_;  // when none was given
  PeerMetrics* const metrics_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
  Mutex mu_;
  std::unordered_map<std::string, int64_t> nonces_ GUARDED_BY(mu_);  // nonce -> time seen
  int64_t last_prune_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs
