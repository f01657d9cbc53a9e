// The PayloadScanner (common/payload_scanner.h) that knows checkpoint formats.
//
// It reads a file's bytes as they are written, front to back, and keeps only what it must parse:
// - torch zip (and DCP .distcp files, which are torch.save archives back to back): each local
//   header. data.pkl comes first in the archive; its storage ids give every storage's byte size,
//   so when the header of <prefix>/data/<key> arrives, the whole record is known to be payload,
//   even though torch writes its size only after the data (in the data descriptor). The descriptor
//   is then checked; on any mismatch the scanner stops hinting (chunking stays correct either way:
//   hints only move cut points).
// - safetensors: the JSON header, which lists every tensor's byte range up front.
// Anything else, and anything after something unexpected, gets no hints.
#pragma once

#include <memory>

#include "common/payload_scanner.h"

namespace ckptfs {

struct PayloadScanOptions {
  // Tensors smaller than this are left to content-defined chunking with the bytes around them
  // (a chunk per norm weight would only add metadata).
  uint64_t min_payload_bytes = 64 * 1024;
  // data.pkl or a safetensors header larger than this stops the scan (memory bound per file).
  uint64_t max_header_bytes = 64ull << 20;
};

std::unique_ptr<PayloadScanner> NewPayloadScanner(const PayloadScanOptions& opts);

}  // namespace ckptfs
