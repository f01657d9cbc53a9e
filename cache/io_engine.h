// IoEngine: the only way ckptfs moves chunk bytes to and from the local tier's files.
//
// Two implementations: io_uring (batches of reads/writes in one submission) and plain
// pread/pwrite. Both resubmit short transfers until the whole range is done, so a caller sees
// either the full length, a short count at end of file (reads only), or an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace ckptfs {

inline constexpr size_t kDirectAlign = 4096;
// n rounded up to whole kDirectAlign blocks: what a direct transfer of n bytes moves.
constexpr size_t DirectBlocks(size_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

struct IoOp {
  enum class Kind : uint8_t { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  void* buf = nullptr;  // for kWrite the bytes are only read
  size_t len = 0;
  int64_t offset = 0;   // -1: at the file's position (pipes, sockets)
  // The fd was opened with O_DIRECT (buf, len and offset aligned to kDirectAlign): a read that
  // stops off a block boundary stopped at end of file, where asking again would be refused.
  bool direct = false;
  // Results, filled by Submit: bytes moved (a read may stop short at end of file) and status.
  size_t done = 0;
  Status status;
};

struct IoEngineOptions {
  std::string kind = "uring";  // "uring" or "pread"
  unsigned queue_depth = 64;
  // Testing aid: no single request moves more than this many bytes (0: no limit), which makes
  // every large transfer take the short-transfer path.
  size_t max_op_bytes = 0;
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // Runs every op to completion (possibly concurrently) and fills in done/status of each.
  // Returns the first failed op's status, or Ok. Thread-safe: any number of threads may submit.
  virtual Status Submit(std::span<IoOp> ops) = 0;
  virtual const char* name() const = 0;

  // Single-op conveniences. ReadAt returns the bytes read (fewer than len only at end of file);
  // `direct`: see IoOp::direct.
  Result<size_t> ReadAt(int fd, void* buf, size_t len, int64_t offset, bool direct = false);
  Status WriteAt(int fd, const void* buf, size_t len, int64_t offset);
};

// Creates the engine named in opts. "uring" falls back to "pread" (with a log line) when the
// kernel refuses io_uring, so the daemon runs anywhere.
Result<std::unique_ptr<IoEngine>> MakeIoEngine(const IoEngineOptions& opts);

}  // namespace ckptfs
