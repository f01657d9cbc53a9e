// user.ckptfs.status: what `ckptfs status` prints, built by the daemon from what it holds.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "common/log.h"
#include "common/utf8.h"
#include "formats/json.h"
#include "fs/fs_ops.h"

namespace ckptfs::fs {
namespace {

// The reply must fit one attribute value (64 KiB): long strings are cut, and the oldest log
// lines go first.
constexpr size_t kMaxJson = 60 * 1024;
constexpr size_t kMaxString = 1000;

std::string Num(uint64_t v) { return std::to_string(v); }

// A JSON number, or null for what JSON cannot hold (an infinite or NaN option).
std::string Real(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// `s` quoted, cut at kMaxString bytes, with bytes that are not UTF-8 (a path, a log line
// naming one) replaced by U+FFFD: the reply stays valid JSON.
std::string Quote(std::string_view s) {
  s = s.substr(0, kMaxString);
  if (json::IsValidUtf8(s)) return JsonQuote(s);
  std::string clean;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                   : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (n && i + n <= s.size() && json::IsValidUtf8(s.substr(i, n))) {
      clean.append(s.substr(i, n));
      i += n;
    } else {
      AppendUtf8(0xFFFD, &clean);
      ++i;
    }
  }
  return JsonQuote(clean);
}

std::string Strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out.append(i ? "," : "").append(Quote(v[i]));
  return out + "]";
}

}  // namespace

std::string StatusJson(Context& ctx) {
  const Config& cfg = ctx.cfg;
  const Store::Gauges g = ctx.store->gauges();
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.started_steady).count();
  std::string out = "{";
  out += "\"pid\":" + std::to_string(::getpid());
  out += ",\"version\":" + Quote(CKPTFS_VERSION);
  out += ",\"uptime_s\":" + std::to_string(static_cast<uint64_t>(uptime));
  out += ",\"started_unix\":" + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                   ctx.started.time_since_epoch())
                                                   .count());
  out += ",\"mountpoint\":" + Quote(cfg.mountpoint);
  out += ",\"cache_dir\":" + Quote(cfg.cache_dir);
  out += ",\"passthrough\":" + Quote(ctx.passthrough_mode);
  // The options in force: the ones that shape what the daemon does, as it runs with them.
  out += ",\"options\":{";
  out += "\"durability\":" + Quote(cfg.durability);
  out += ",\"ram_cache\":" + Num(cfg.ram_cache_bytes);
  out += ",\"cache_size\":" + Num(cfg.cache_bytes);
  out += ",\"write_threads\":" + Num(cfg.write_threads);
  out += ",\"cut_threads\":" + Num(cfg.cut_threads);
  out += ",\"write_queue\":" + Num(cfg.write_queue_bytes);
  out += ",\"read_threads\":" + Num(cfg.read_threads);
  out += ",\"readahead_chunks\":" + Num(cfg.readahead_chunks);
  out += ",\"max_readahead\":" + Num(cfg.max_readahead_bytes);
  out += ",\"writeback_cache\":" + std::string(cfg.writeback_cache ? "true" : "false");
  out += ",\"packs\":" + std::string(cfg.packs ? "true" : "false");
  out += ",\"upload_threads\":" + Num(cfg.upload_threads);
  out += ",\"sync_interval_s\":" + Real(cfg.sync_interval_s);
  out += ",\"sync_full_interval_s\":" + Real(cfg.sync_full_interval_s);
  out += ",\"warm\":" + Quote(cfg.warm);
  out += ",\"gc_window_s\":" + Real(cfg.gc_window_s);
  out += ",\"metrics\":" + Quote(cfg.metrics_address);
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
  out += ",\"files_not_yet_durable\":" + Num(g.fallback_files);
  out += ",\"tiers\":[";
  for (size_t t = 0; t < g.tier_names.size(); ++t) {
    out += std::string(t ? "," : "") + "{\"tier\":" + Num(t + 1) +
           ",\"url\":" + Quote(g.tier_names[t]) +
           ",\"waiting\":" + Num(g.ops_waiting[t]) +
           ",\"failing\":" + (g.tier_errors[t].empty() ? "false" : "true") +
           ",\"last_error\":" + Quote(g.tier_errors[t]) + "}";
  }
  out += "]";
  out += ",\"namespace_sync\":{\"mode\":" + Quote(g.sync_mode) +
         ",\"journal_entry\":" + Num(g.journal_entry) + "}";
  std::vector<std::string> recent = RecentProblems();
  while (recent.size() > 1 && out.size() + Strings(recent).size() > kMaxJson) {
    recent.erase(recent.begin());
  }
  out += ",\"recent_errors\":" + Strings(recent);
  return out + "}";
}

}  // namespace ckptfs::fs
