// Named loggers, one per layer, handed to the objects that log. spdlog's headers stay out of this
// one so that hot headers do not pull them in; .cc files that log include <spdlog/logger.h>.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdlog {
class logger;
}

namespace ckptfs {

using Logger = std::shared_ptr<spdlog::logger>;

// Sends every layer's logger to `file` (empty: stderr) at `level`. Call once, before GetLogger;
// calling again re-targets loggers created later.
Status InitLogging(const std::string& level, const std::string& file);

// The logger of a layer ("fs", "store", "cache", "main"); created on first use.
Logger GetLogger(const std::string& layer);

// Flushes every logger (before exit, and after an error worth reading at once).
void FlushLogs();

// The last warnings and errors logged (at most kRecentProblems, oldest first), as formatted
// lines: what `ckptfs status` shows under "recent errors".
inline constexpr size_t kRecentProblems = 20;
std::vector<std::string> RecentProblems();

}  // namespace ckptfs
