// Process-wide counters with plain names (cache_hit_bytes, chunk_dedup_hits, ...). Cheap to bump
// from any thread; read as a snapshot by `ckptfs stats` and the tests.
#pragma once

#include <atomic>
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

struct Metrics {
  Counter chunks_written;       // new chunks put on the local tier
  Counter chunk_bytes_written;  // their bytes
  Counter chunk_dedup_hits;     // chunks a file referenced that were already stored
  Counter chunk_dedup_bytes;    // their bytes
  Counter chunks_reclaimed;     // chunk files removed when their last reference went
  Counter cache_hit_bytes;      // read bytes served from the RAM tier
  Counter cache_miss_bytes;     // read bytes that had to come from the local disk tier
  Counter chunk_verify_failures;
  Counter file_commits;         // manifests committed
  Counter staging_switches;     // files that left the streaming write path for a staging file
  Counter tensor_chunk_bytes;   // bytes cut at tensor boundaries (the rest: content-defined)
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

  std::vector<std::pair<std::string, uint64_t>> Snapshot() const;
};

}  // namespace ckptfs
