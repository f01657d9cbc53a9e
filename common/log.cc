#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>

namespace ckptfs {
namespace {

std::mutex g_mu;
spdlog::sink_ptr g_sink;  // guarded by g_mu
spdlog::level::level_enum g_level = spdlog::level::info;
// Every logger's second sink: the last warnings and errors, for `ckptfs status`.
const std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> g_recent = [] {
  auto s = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(kRecentProblems);
  s->set_level(spdlog::level::warn);
  return s;
}();

// Loggers pass warnings on whatever the level, for the ring buffer; the log's sink filters.
spdlog::level::level_enum LoggerLevel() { return std::min(g_level, spdlog::level::warn); }

}  // namespace

Status InitLogging(const std::string& level, const std::string& file) {
  std::lock_guard lock(g_mu);
  g_level = spdlog::level::from_str(level);
  try {
    if (file.empty()) {
      g_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    } else {
      g_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file);
    }
  } catch (const spdlog::spdlog_ex& e) {
    return IoError(std::string("cannot open log: ") + e.what());
  }
  g_sink->set_level(g_level);
  spdlog::apply_all([&](const Logger& l) {
    l->sinks().assign({g_sink, g_recent});
    l->set_level(LoggerLevel());
  });
  return Status::Ok();
}

Logger GetLogger(const std::string& layer) {
  std::lock_guard lock(g_mu);
  if (Logger l = spdlog::get(layer)) return l;
  if (!g_sink) {
    g_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    g_sink->set_level(g_level);
  }
  auto l = std::make_shared<spdlog::logger>(layer, spdlog::sinks_init_list{g_sink, g_recent});
  l->set_level(LoggerLevel());
  // Info lines are rare (mounts, recoveries, stalls) and worth reading while the daemon runs.
  l->flush_on(spdlog::level::info);
  spdlog::register_logger(l);
  return l;
}

std::vector<std::string> RecentProblems() {
  std::vector<std::string> lines = g_recent->last_formatted();
  for (std::string& l : lines) {
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
  }
  return lines;
}

void FlushLogs() {
  spdlog::apply_all([](const Logger& l) { l->flush(); });
}

}  // namespace ckptfs
