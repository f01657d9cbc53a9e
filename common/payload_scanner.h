// PayloadScanner: where tensor bytes lie in a file that is being written front to back.
//
// The store cuts chunks at tensor boundaries, with fixed-size pieces inside large tensors, so the
// same tensor dedups fully whatever file, offset, step or rank it is saved in; everything else
// (headers, pickles, unknown files) gets content-defined chunks. Knowing where tensors lie is the
// formats' business (formats/payload_scan.h implements this), cutting chunks is the store's; the
// interface lives in common/ so that neither library depends on the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

namespace ckptfs {

struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// One instance per file being written; used by one thread at a time.
class PayloadScanner {
 public:
  virtual ~PayloadScanner() = default;
  // The file's next bytes: the first call gets offset 0, each later one continues right where the
  // previous one ended.
  virtual void Feed(const uint8_t* data, size_t len) = 0;
  // The first payload range with end > pos among those found so far. Ranges come in file order
  // and do not overlap. A range is found before any of its bytes are fed (the header announcing
  // it precedes it), so once Feed returns, every range that begins within the fed bytes is known.
  virtual std::optional<ByteRange> NextPayload(uint64_t pos) = 0;
  // The format recognized so far ("torch-zip", "safetensors", ...; "unknown" when none).
  virtual std::string_view format() const = 0;
};

// Makes a scanner for a new file; null when hints are off.
using PayloadScannerFactory = std::function<std::unique_ptr<PayloadScanner>()>;

}  // namespace ckptfs
