// A store's counters with plain names (cache_hit_bytes, chunk_dedup_hits, ...) and latency
// histograms. Cheap to bump from any thread; read as snapshots by the Prometheus exporter
// (metrics/exporter.h) and the tests.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckptfs {

class Counter {
 public:
  void Add(uint64_t n) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// How long one kind of operation took: counts per fixed bucket, their sum and number.
class LatencyHistogram {
 public:
  // Upper bounds in seconds, from a local NVMe read to a slow object-store request.
  static constexpr std::array<double, 14> kBounds = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
      0.01,    0.025,  0.05,    0.1,    0.25,  1.0,    5.0};
  struct Snapshot {
    std::array<uint64_t, kBounds.size() + 1> counts{};  // the last: above every bound
    uint64_t count = 0;
    double sum_s = 0;
  };

  void Observe(std::chrono::steady_clock::duration d);
  Snapshot Get() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> sum_ns_{0};
};

// Observes the time from construction to destruction.
class ScopedLatency {
 public:
  explicit ScopedLatency(LatencyHistogram& h) : h_(h), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedLatency() { h_.Observe(std::chrono::steady_clock::now() - t0_); }
  ScopedLatency(const ScopedLatency&) = delete;
  ScopedLatency& operator=(const ScopedLatency&) = delete;

 private:
  LatencyHistogram& h_;
  std::chrono::steady_clock::time_point t0_;
};

// The kinds of FUSE request timed (fs/fs_ops.h) and of backend request (backends/timed_backend.h).
enum class FuseOp { kLookup, kGetattr, kSetattr, kOpen, kCreate, kRead, kWrite, kFlush, kRelease,
                    kFsync, kReaddir, kGetxattr, kSetxattr, kOther, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(FuseOp::kCount)> kFuseOpNames = {
    "lookup", "getattr", "setattr", "open", "create", "read", "write", "flush", "release",
    "fsync", "readdir", "getxattr", "setxattr", "other"};
enum class BackendRequest { kPut, kGet, kHead, kDelete, kList, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(BackendRequest::kCount)> kBackendRequestNames = {
    "put", "get", "head", "delete", "list"};
enum class Outcome { kOk, kNotFound, kError, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(Outcome::kCount)> kOutcomeNames = {
    "ok", "not_found", "error"};
inline constexpr int kMetricTiers = 4;  // store/meta_store.h's kMaxTiers

// The peer path (peers/, -o peer_listen=, -o peers=): what this node's endpoint served or
// refused, and what its reads got from their chunks' owners or fetched from the store instead.
enum class PeerRefusal { kProof, kReplay, kLength, kIncomplete, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(PeerRefusal::kCount)> kPeerRefusalNames = {
    "proof", "replay", "length", "incomplete"};
enum class PeerUnserved { kNotHere, kFailed, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(PeerUnserved::kCount)> kPeerUnservedNames = {
    "not_here", "failed"};
// Why a read whose chunk another node owns went to the store: the owner was marked down, said it
// had not the chunk, refused the request, failed, took longer than peer_timeout, or answered bytes
// that are not the chunk's.
enum class PeerFallback { kDown, kNotHere, kRefused, kFailed, kSlow, kBadBytes, kCount };
inline constexpr std::array<const char*, static_cast<size_t>(PeerFallback::kCount)> kPeerFallbackNames = {
    "down", "not_here", "refused", "failed", "slow", "bad_bytes"};

struct PeerMetrics {
  // The endpoint.
  Counter served_chunks;  // requests answered with the chunk
  Counter served_bytes;
  std::array<Counter, static_cast<size_t>(PeerRefusal::kCount)> refused;
  std::array<Counter, static_cast<size_t>(PeerUnserved::kCount)> unserved;
  // The reads.
  Counter fetched_chunks;  // chunks a peer served, verified
  Counter fetched_bytes;
  std::array<Counter, static_cast<size_t>(PeerFallback::kCount)> fallbacks;
  // Requests to peers by outcome (ok, not_found: the peer had not the chunk, error: any other).
  std::array<LatencyHistogram, static_cast<size_t>(Outcome::kCount)> requests;
  // The other nodes counted, and of those, the ones marked down (until a read asks them again).
  std::atomic<int64_t> peers{0};
  std::atomic<int64_t> peers_down{0};

  Counter& refusal(PeerRefusal r) { return refused[static_cast<size_t>(r)]; }
  Counter& unserved_by(PeerUnserved u) { return unserved[static_cast<size_t>(u)]; }
  Counter& fallback(PeerFallback f) { return fallbacks[static_cast<size_t>(f)]; }
  LatencyHistogram& request(Outcome o) { return requests[static_cast<size_t>(o)]; }
};

struct Metrics {
  Counter chunks_written;       // new chunks put on the local tier
  Counter chunk_bytes_written;  // their bytes
  Counter chunk_adopted_bytes;  // of those, stored where the file's own write put them (no copy)
  Counter chunk_direct_write_bytes;  // chunks written by the direct path (their last partial block buffered)
  Counter chunk_dedup_hits;     // chunks a file referenced that were already stored
  Counter chunk_dedup_bytes;    // their bytes
  Counter chunks_reclaimed;     // chunk files removed when their last reference went
  Counter cache_hit_bytes;      // read bytes served from the RAM tier
  Counter cache_miss_bytes;     // read bytes that had to come from the local disk tier
  Counter cache_direct_read_bytes;  // of those, read with O_DIRECT (the page cache held none)
  Counter chunk_verify_failures;
  Counter file_commits;         // manifests committed
  Counter file_commit_bytes;    // the sizes of the files they describe
  Counter staging_switches;     // files that left the streaming write path for a staging file
  Counter tensor_chunk_bytes;   // bytes cut at tensor boundaries (the rest: content-defined)
  Counter cut_ahead_cuts;       // seal chunks whose cut was read off candidates found ahead
  Counter cut_ahead_refused;    // parts whose candidates were too many: scanned in line
  Counter staged_files;         // files written through a passthrough staging file
  Counter staged_seals;         // staged files cut into chunks and committed
  Counter staged_seal_bytes;    // their bytes
  // The remote tier.
  Counter remote_fetches;          // chunks fetched from the backend on a local miss
  Counter remote_fetch_bytes;
  Counter remote_fetch_fallthrough;  // of those, served by a farther tier than the first
  Counter tier_files_dropped;  // files dropped from a nearer tier by its keep= policy
  Counter tier_chunks_restored;  // chunks a read put back into a nearer tier that had lost them
  Counter remote_verify_failures;  // fetched chunks whose bytes did not match their name
  Counter chunks_uploaded;         // chunks put to the backend
  Counter chunk_upload_bytes;
  Counter chunk_upload_skips;      // chunks the backend already held (another node's upload)
  Counter files_published;         // file records put to the backend
  Counter chunks_evicted;          // local copies of remote-held chunks removed for room
  Counter chunk_evict_bytes;
  Counter view_plans;  // view directories planned (kept until unmount: a gauge of the plans held)

  // Latencies: FUSE requests by kind (the time in the daemon's handler), backend requests by
  // tier, kind and outcome, and fetches of chunks missing locally, for a read or a prefetch
  // (every tier and retry included).
  std::array<LatencyHistogram, static_cast<size_t>(FuseOp::kCount)> fuse_requests;
  std::array<std::array<std::array<LatencyHistogram, static_cast<size_t>(Outcome::kCount)>,
                        static_cast<size_t>(BackendRequest::kCount)>,
             kMetricTiers>
      backend_requests;
  LatencyHistogram chunk_fetches;

  LatencyHistogram& fuse(FuseOp op) { return fuse_requests[static_cast<size_t>(op)]; }
  LatencyHistogram& backend(int tier, BackendRequest op, Outcome o) {
    return backend_requests[static_cast<size_t>(tier)][static_cast<size_t>(op)]
                           [static_cast<size_t>(o)];
  }

  std::vector<std::pair<std::string, uint64_t>> Snapshot() const;
};

}  // namespace ckptfs
