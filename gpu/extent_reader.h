// ExtentReader: reads many byte ranges of one file into memory, several requests in flight.
//
// Two implementations, as in cache/io_engine.h: io_uring (up to queue_depth requests in one ring)
// and plain pread, one request at a time, for kernels that refuse io_uring. gpu/ keeps its own
// small reader instead of linking cache/ so that libckptfs_gpu.so does not pull in the backends
// (libcurl, OpenSSL) and spdlog: it is loaded into every training process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "gpu/loader.h"

namespace ckptfs::gpu {

struct ReadOp {
  char* dst = nullptr;
  uint64_t offset = 0;
  size_t len = 0;
  size_t extent = 0;  // the caller's tag (which extent this piece belongs to), for messages
  size_t done = 0;    // filled by ReadAll
};

class ExtentReader {
 public:
  virtual ~ExtentReader() = default;
  virtual const char* name() const = 0;

  // Reads every op in full from fd. A short read is requeued for the rest; a read that returns
  // 0 bytes (end of file) before its op is full fails that op with Code::kCorrupt and stores the
  // op's index in *failed. Returns Ok or the first error, and in both cases only once no request
  // is in flight any more, so the caller may free or reuse the destinations at once.
  // Not thread-safe: one ReadAll at a time per reader.
  virtual Status ReadAll(int fd, std::span<ReadOp> ops, size_t* failed) = 0;
};

// The reader named by options.engine ("uring" falls back to "pread" when io_uring is refused).
Result<std::unique_ptr<ExtentReader>> NewExtentReader(const LoadOptions& options);

// Appends the pieces of one extent to *ops: requests of at most piece_bytes (0: one request).
void AppendPieces(size_t extent, char* dst, uint64_t offset, uint64_t len, size_t piece_bytes,
                  std::vector<ReadOp>* ops);

}  // namespace ckptfs::gpu
