// Content-defined chunking (FastCDC: gear rolling hash, normalized chunking, cut-point skipping).
//
// A cut depends only on the bytes just before it, so inserting or deleting bytes early in a file
// moves the boundaries near the edit and leaves the later ones where they were (relative to the
// content): the same later bytes produce the same chunks, and dedup survives the edit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/config.h"

namespace ckptfs {

// The cut candidates of a span of stream bytes, found ahead of the chunker (by several threads at
// once: store/file_writer.cc): each byte whose hash over the bytes before it meets the large mask,
// and whether it meets the small one too. A chunk's cut is then read off them instead of scanned.
struct CutCandidates {
  uint64_t begin = 0;  // every candidate at a stream offset in [begin, end) is listed in `at`
  uint64_t end = 0;
  std::vector<uint64_t> at;  // (stream offset << 1) | meets the small mask, ascending

  bool Covers(uint64_t from, uint64_t to) const { return begin <= from && to <= end; }
  void Clear() {
    begin = end = 0;
    at.clear();
  }
};

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

  // The candidates of data[0..len), the bytes at stream offset `begin`, appended to *out. The
  // `history` bytes before data (readable; at most 63 are used) feed the hash first; a byte with
  // fewer than 63 bytes before it in all is not listed. Returns false, listing nothing, when the
  // bytes give four times the candidates random bytes would (a repeated pattern): a list of them
  // would cost more than scanning them. Thread-safe.
  bool FindCandidates(const uint8_t* data, size_t len, size_t history, uint64_t begin,
                      std::vector<uint64_t>* out) const;
  // What FindCut(data, len) returns for a chunk not scanned yet, the chunk starting at stream
  // offset `pos`, taking its cut from `c`. The bytes before its 64th scanned one are scanned (their
  // hash covers fewer bytes than a candidate's); c must cover the rest, i.e.
  // [pos + CandidatesFrom(), pos + min(len, max_bytes)). Leaves the chunker reset.
  size_t FindCutWith(const CutCandidates& c, uint64_t pos, const uint8_t* data, size_t len);
  // The first chunk offset whose cut FindCutWith reads from candidates.
  size_t CandidatesFrom() const { return static_cast<size_t>(opts_.min_bytes) + kExactBytes; }

  const ChunkingOptions& options() const { return opts_; }
  // How many pending bytes the scan has looked at (the next call must pass at least these).
  size_t scanned() const { return pos_; }

 private:
  // The masked bits of the hash after a byte depend on it and the 62 bytes before it: from the
  // 63rd byte of the scan on, the scan's hash and a candidate's agree there.
  static constexpr size_t kExactBytes = 63;

  ChunkingOptions opts_;
  uint64_t mask_small_;  // more bits: cuts are rarer before the average size
  uint64_t mask_large_;  // fewer bits: cuts are likelier after it
  size_t pos_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace ckptfs
