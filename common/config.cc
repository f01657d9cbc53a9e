#include "common/config.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>

namespace ckptfs {

Status Config::Validate() {
  if (mountpoint.empty()) return Invalid("no mountpoint given");
  if (cache_dir.empty()) cache_dir = DefaultCacheDir(mountpoint);
  const ChunkingOptions& c = chunking;
  if (c.avg_bytes == 0 || (c.avg_bytes & (c.avg_bytes - 1)) != 0) {
    return Invalid("chunk average size must be a power of two");
  }
  if (!(c.min_bytes >= 4096 && c.min_bytes < c.avg_bytes && c.avg_bytes < c.max_bytes)) {
    return Invalid("chunk sizes must satisfy 4096 <= min < avg < max");
  }
  if (c.max_bytes > kMaxChunkBytes) return Invalid("chunk maximum size is at most 64 MiB");
  if (c.piece_bytes != 0 && (c.piece_bytes < 4096 || c.piece_bytes > c.max_bytes)) {
    return Invalid("tensor piece size must be in 4K..chunk maximum");
  }
  if (durability != "local" && durability != "remote") {
    return Invalid("durability must be 'local' or 'remote', not '" + durability + "'");
  }
  if ((!peer_listen.empty() || !peers.empty()) && backends.empty()) {
    return Invalid("peer_listen and peers need a backend (--backend s3://...)");
  }
  if (!(peer_timeout_s > 0 && peer_timeout_s <= 600)) {
    return Invalid("peer_timeout must be in (0, 600] seconds");
  }
  if (!(peer_heartbeat_s >= 1 && peer_heartbeat_s <= 3600)) {
    return Invalid("peer_heartbeat must be in [1, 3600] seconds");
  }
  if (backends.empty() && (durability == "remote" || cache_bytes > 0)) {
    return Invalid("durability=remote and cache_size need a backend (--backend URL)");
  }
  if (!tier_keep.empty() && tier_keep.size() >= backends.size()) {
    return Invalid("keep= takes one count per nearer tier (" +
                   std::to_string(backends.empty() ? 0 : backends.size() - 1) +
                   " here); the farthest tier keeps everything (ckptfs retain deletes)");
  }
  if (tier_keep_every.size() > tier_keep.size()) {
    return Invalid("keep_every= needs keep= for the same tiers");
  }
  for (int t : durability_tiers) {
    if (t < 0 || static_cast<size_t>(t) >= backends.size()) {
      return Invalid("durability_tier=" + std::to_string(t + 1) + ": there are " +
                     std::to_string(backends.size()) + " backends");
    }
  }
  for (double t : {gc_window_s, sync_interval_s, remote_timeout_s, mount_timeout_s, attr_timeout_s,
                   entry_timeout_s, settle_interval_s}) {
    if (!std::isfinite(t)) return Invalid("times in seconds must be finite numbers");
  }
  if (settle_interval_s < 0) return Invalid("settle_interval must be 0 or more seconds");
  if (!(gc_window_s > 0)) return Invalid("gc_window must be positive");
  if (upload_threads == 0 || upload_threads > 256) return Invalid("upload_threads must be 1..256");
  if (cache_bytes > 0 && cache_bytes < 4 * uint64_t{chunking.max_bytes}) {
    return Invalid("cache_size must hold at least four chunks (" +
                   std::to_string(4 * uint64_t{chunking.max_bytes}) + " bytes)");
  }
  if (!(remote_timeout_s > 0)) return Invalid("remote_timeout must be positive");
  if (io_engine != "uring" && io_engine != "pread") {
    return Invalid("io engine must be 'uring' or 'pread', not '" + io_engine + "'");
  }
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool level_ok = false;
  for (const char* l : kLevels) level_ok |= log_level == l;
  if (!level_ok) return Invalid("unknown log level '" + log_level + "'");
  if (max_threads < 1 || max_threads > 256) return Invalid("max_threads must be in 1..256");
  if (max_write_bytes < 4096 || max_write_bytes > (1u << 20)) {
    return Invalid("max_write must be in 4K..1M");
  }
  if (read_threads < 1 || read_threads > 64) return Invalid("read_threads must be in 1..64");
  if (readahead_chunks > 64) return Invalid("readahead_chunks must be at most 64");
  if (write_threads < 1 || write_threads > 64) return Invalid("write_threads must be in 1..64");
  if (cut_threads > 64) return Invalid("cut_threads must be in 0..64");
  if (write_queue_bytes < max_write_bytes) return Invalid("write queue smaller than one write");
  if (reorder_bytes < max_write_bytes) return Invalid("reorder buffer smaller than one write");
  if (write_memory_bytes < 2ull * max_write_bytes) {
    return Invalid("write_memory smaller than two writes");
  }
  if (attr_timeout_s < 0 || entry_timeout_s < 0) return Invalid("timeouts must be >= 0");
  return Status::Ok();
}

std::string DefaultCacheDir(const std::string& abs_mountpoint) {
  std::string base;
  if (geteuid() == 0) {
    base = "/var/cache/ckptfs";
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    base = std::string(xdg) + "/ckptfs";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::string(home) + "/.cache/ckptfs";
  } else {
    base = "/tmp/ckptfs-" + std::to_string(geteuid());
  }
  // /mnt/ckpt -> mnt-ckpt: one cache per mountpoint, readable in a listing.
  std::string name;
  for (char ch : abs_mountpoint) {
    if (ch == '/') {
      if (!name.empty() && name.back() != '-') name += '-';
    } else {
      name += ch;
    }
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  return base + "/" + (name.empty() ? "root" : name);
}

Result<uint64_t> ParseSize(const std::string& text) {
  if (text.empty()) return Invalid("empty size");
  size_t pos = 0;
  uint64_t v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    v = v * 10 + static_cast<uint64_t>(text[pos] - '0');
    ++pos;
  }
  if (pos == 0) return Invalid("size '" + text + "' does not start with a number");
  std::string unit = text.substr(pos);
  if (unit == "" || unit == "B") return v;
  if (unit == "K" || unit == "KiB" || unit == "k") return v << 10;
  if (unit == "M" || unit == "MiB") return v << 20;
  if (unit == "G" || unit == "GiB") return v << 30;
  if (unit == "T" || unit == "TiB") return v << 40;
  return Invalid("unknown size unit in '" + text + "'");
}

}  // namespace ckptfs
