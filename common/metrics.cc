#include "common/metrics.h"

namespace ckptfs {

std::vector<std::pair<std::string, uint64_t>> Metrics::Snapshot() const {
  return {
      {"chunks_written", chunks_written.Get()},
      {"chunk_bytes_written", chunk_bytes_written.Get()},
      {"chunk_dedup_hits", chunk_dedup_hits.Get()},
      {"chunk_dedup_bytes", chunk_dedup_bytes.Get()},
      {"chunks_reclaimed", chunks_reclaimed.Get()},
      {"cache_hit_bytes", cache_hit_bytes.Get()},
      {"cache_miss_bytes", cache_miss_bytes.Get()},
      {"chunk_verify_failures", chunk_verify_failures.Get()},
      {"file_commits", file_commits.Get()},
      {"staging_switches", staging_switches.Get()},
      {"tensor_chunk_bytes", tensor_chunk_bytes.Get()},
  };
}

}  // namespace ckptfs
