#include "common/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace ckptfs {
namespace {

std::mutex g_mu;
spdlog::sink_ptr g_sink;  // guarded by g_mu
spdlog::level::level_enum g_level = spdlog::level::info;

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
  spdlog::apply_all([&](const Logger& l) {
    l->sinks().assign(1, g_sink);
    l->set_level(g_level);
  });
  return Status::Ok();
}

Logger GetLogger(const std::string& layer) {
  std::lock_guard lock(g_mu);
  if (Logger l = spdlog::get(layer)) return l;
  if (!g_sink) g_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto l = std::make_shared<spdlog::logger>(layer, g_sink);
  l->set_level(g_level);
  // Info lines are rare (mounts, recoveries, stalls) and worth reading while the daemon runs.
  l->flush_on(spdlog::level::info);
  spdlog::register_logger(l);
  return l;
}

void FlushLogs() {
  spdlog::apply_all([](const Logger& l) { l->flush(); });
}

}  // namespace ckptfs
