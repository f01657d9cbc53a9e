// Content-defined chunking (FastCDC: gear rolling hash, normalized chunking, cut-point skipping).
//
// A cut depends only on the bytes just before it, so inserting or deleting bytes early in a file
// moves the boundaries near the edit and leaves the later ones where they were (relative to the
// content): the same later bytes produce the same chunks, and dedup survives the edit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/config.h"

namespace ckptfs {

class Chunker {
 public:
  explicit Chunker(const ChunkingOptions& opts);

  // `data[0..len)` is the pending chunk so far: it starts at the previous cut, and each call must
  // pass the same bytes again plus any new ones (the scan resumes where it stopped). Returns the
  // length of the chunk to cut, or 0 when no cut is found yet and more bytes are needed. Never
  // returns more than max_bytes; returns max_bytes as soon as that many are pending.
  size_t FindCut(const uint8_t* data, size_t len);
  // Forgets the scan state: call after a cut is taken, or when the pending bytes changed.
  void Reset() {
    pos_ = 0;
    hash_ = 0;
  }

  const ChunkingOptions& options() const { return opts_; }
  // How many pending bytes the scan has looked at (the next call must pass at least these).
  size_t scanned() const { return pos_; }

 private:
  ChunkingOptions opts_;
  uint64_t mask_small_;  // more bits: cuts are rarer before the average size
  uint64_t mask_large_;  // fewer bits: cuts are likelier after it
  size_t pos_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace ckptfs
