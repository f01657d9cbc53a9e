// user.ckptfs.status: what `ckptfs status` prints, built by the daemon from what it holds.
#include <unistd.h>

#include <string>

#include "common/log.h"
#include "common/utf8.h"
#include "fs/fs_ops.h"

namespace ckptfs::fs {
namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

std::string Strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + JsonQuote(v[i]);
  return out + "]";
}

}  // namespace

std::string StatusJson(Context& ctx) {
  const Config& cfg = ctx.cfg;
  const Store::Gauges g = ctx.store->gauges();
  const auto now = std::chrono::system_clock::now();
  const double uptime = std::chrono::duration<double>(now - ctx.started).count();
  std::string out = "{";
  out += "\"pid\":" + std::to_string(::getpid());
  out += ",\"version\":" + JsonQuote(CKPTFS_VERSION);
  out += ",\"uptime_s\":" + std::to_string(static_cast<uint64_t>(uptime));
  out += ",\"started_unix\":" + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                   ctx.started.time_since_epoch())
                                                   .count());
  out += ",\"mountpoint\":" + JsonQuote(cfg.mountpoint);
  out += ",\"cache_dir\":" + JsonQuote(cfg.cache_dir);
  out += ",\"passthrough\":" + JsonQuote(ctx.passthrough_mode);
  // The options in force: the ones that shape what the daemon does, as it runs with them.
  out += ",\"options\":{";
  out += "\"durability\":" + JsonQuote(cfg.durability);
  out += ",\"ram_cache\":" + Num(cfg.ram_cache_bytes);
  out += ",\"cache_size\":" + Num(cfg.cache_bytes);
  out += ",\"write_threads\":" + Num(cfg.write_threads);
  out += ",\"write_queue\":" + Num(cfg.write_queue_bytes);
  out += ",\"read_threads\":" + Num(cfg.read_threads);
  out += ",\"readahead_chunks\":" + Num(cfg.readahead_chunks);
  out += ",\"max_readahead\":" + Num(cfg.max_readahead_bytes);
  out += ",\"writeback_cache\":" + std::string(cfg.writeback_cache ? "true" : "false");
  out += ",\"upload_threads\":" + Num(cfg.upload_threads);
  out += ",\"sync_interval_s\":" + std::to_string(cfg.sync_interval_s);
  out += ",\"gc_window_s\":" + std::to_string(cfg.gc_window_s);
  out += ",\"metrics\":" + JsonQuote(cfg.metrics_address);
  out += ",\"fuse\":" + Strings(cfg.fuse_options);
  out += "}";
  out += ",\"local_tier\":{\"bytes\":" + Num(g.cache.disk_bytes) +
         ",\"limit\":" + Num(g.cache.disk_limit) +
         ",\"not_uploaded\":" + Num(g.cache.local_only) + "}";
  out += ",\"ram_tier\":{\"bytes\":" + Num(g.cache.ram_bytes) +
         ",\"limit\":" + Num(g.cache.ram_limit) + "}";
  out += ",\"write_queue\":{\"bytes\":" + Num(g.write_queue_bytes) +
         ",\"limit\":" + Num(g.write_queue_limit) + "}";
  out += ",\"open_files\":" + Num(g.open_files);
  out += ",\"tiers\":[";
  for (size_t t = 0; t < g.tier_names.size(); ++t) {
    out += std::string(t ? "," : "") + "{\"tier\":" + Num(t + 1) +
           ",\"url\":" + JsonQuote(g.tier_names[t]) +
           ",\"waiting\":" + Num(g.ops_waiting[t]) +
           ",\"failing\":" + (g.tier_failing[t] ? "true" : "false") +
           ",\"last_error\":" + JsonQuote(g.tier_errors[t]) + "}";
  }
  out += "]";
  out += ",\"recent_errors\":" + Strings(RecentProblems());
  return out + "}";
}

}  // namespace ckptfs::fs
