#include "common/metrics.h"

namespace ckptfs {

void LatencyHistogram::Observe(std::chrono::steady_clock::duration d) {
  const double s = std::chrono::duration<double>(d).count();
  size_t b = 0;
  while (b < kBounds.size() && s > kBounds[b]) ++b;
  counts_[b].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::chrono::nanoseconds(d).count()),
                    std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Get() const {
  Snapshot out;
  for (size_t b = 0; b < counts_.size(); ++b) {
    out.counts[b] = counts_[b].load(std::memory_order_relaxed);
    out.count += out.counts[b];
  }
  out.sum_s = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return out;
}

std::vector<std::pair<std::string, uint64_t>> Metrics::Snapshot() const {
  return {
      {"chunks_written", chunks_written.Get()},
      {"chunk_bytes_written", chunk_bytes_written.Get()},
      {"chunk_adopted_bytes", chunk_adopted_bytes.Get()},
      {"chunk_direct_write_bytes", chunk_direct_write_bytes.Get()},
      {"chunk_dedup_hits", chunk_dedup_hits.Get()},
      {"chunk_dedup_bytes", chunk_dedup_bytes.Get()},
      {"chunks_reclaimed", chunks_reclaimed.Get()},
      {"cache_hit_bytes", cache_hit_bytes.Get()},
      {"cache_miss_bytes", cache_miss_bytes.Get()},
      {"cache_direct_read_bytes", cache_direct_read_bytes.Get()},
      {"chunk_verify_failures", chunk_verify_failures.Get()},
      {"file_commits", file_commits.Get()},
      {"file_commit_bytes", file_commit_bytes.Get()},
      {"staging_switches", staging_switches.Get()},
      {"staged_files", staged_files.Get()},
      {"staged_seals", staged_seals.Get()},
      {"staged_seal_bytes", staged_seal_bytes.Get()},
      {"tensor_chunk_bytes", tensor_chunk_bytes.Get()},
      {"cut_ahead_cuts", cut_ahead_cuts.Get()},
      {"cut_ahead_refused", cut_ahead_refused.Get()},
      {"remote_fetches", remote_fetches.Get()},
      {"remote_fetch_bytes", remote_fetch_bytes.Get()},
      {"remote_fetch_fallthrough", remote_fetch_fallthrough.Get()},
      {"tier_files_dropped", tier_files_dropped.Get()},
      {"tier_chunks_restored", tier_chunks_restored.Get()},
      {"remote_verify_failures", remote_verify_failures.Get()},
      {"chunks_uploaded", chunks_uploaded.Get()},
      {"chunk_upload_bytes", chunk_upload_bytes.Get()},
      {"chunk_upload_skips", chunk_upload_skips.Get()},
      {"files_published", files_published.Get()},
      {"chunks_evicted", chunks_evicted.Get()},
      {"chunk_evict_bytes", chunk_evict_bytes.Get()},
  };
}

}  // namespace ckptfs
