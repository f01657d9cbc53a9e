// A view file's recipe: how its bytes are made from literal bytes and byte ranges of source files.
//
// A view file is never materialized. Its bytes are a sequence of segments, each either literal
// bytes (zip headers, a synthesized pickle) or a gather from source files. A gather is `rows`
// rows, each row the concatenation of its parts, and part p of row r is the source bytes
// [offset_p + r * stride_p, + len_p). One gather segment covers a tensor cut along any dimension:
// a dim-0 chunk is one row of one part; a dim-1 slice of a row-major matrix is one part per source
// shard with the source's row pitch as stride; stride 0 repeats a row (vocabulary padding).
// A mean segment computes its bytes: the elementwise float32 mean of its parts' ranges (a
// parameter that universal checkpoints average over TP ranks).
//
// Pure and immutable once built: readers on any thread share one Recipe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckptfs::reshard {

// What a mean segment's floats become: float32 as they are, or rounded to nearest even into
// bfloat16 or float16 (as torch's .to() rounds; NaN becomes the quiet NaN).
enum class MeanOut : uint8_t { kFloat32, kBFloat16, kFloat16 };
inline uint64_t MeanOutSize(MeanOut o) { return o == MeanOut::kFloat32 ? 4 : 2; }

struct Part {
  uint32_t source = 0;  // index into the view's source list
  uint64_t offset = 0;  // in the source file, of row 0
  uint64_t len = 0;     // bytes per row
  uint64_t stride = 0;  // source bytes from one row to the next (0: the same bytes again)
};

struct Segment {
  uint64_t start = 0;    // in the view file
  uint64_t rows = 1;     // literal: 1
  uint64_t row_len = 0;  // sum of the parts' len; literal: its size
  std::vector<Part> parts;  // empty for a literal
  uint32_t literal = 0;     // index into Recipe::literals when parts is empty
  bool mean = false;  // the bytes are the mean of the parts' floats (see AddMean)
  MeanOut mean_out = MeanOut::kFloat32;
  uint64_t size() const { return rows * row_len; }
};

// A piece of a read: literal bytes, one contiguous range of one source file, or bytes of a mean.
struct Piece {
  const uint8_t* literal = nullptr;  // non-null for literal bytes
  uint32_t source = 0;
  uint64_t offset = 0;  // in the source; for a mean, from the start of each of its ranges
  uint64_t len = 0;
  const std::vector<Part>* mean = nullptr;  // non-null: bytes of the mean of these ranges,
  MeanOut mean_out = MeanOut::kFloat32;     // as this type (offset and len count its bytes)
};

class Recipe {
 public:
  uint64_t size() const { return size_; }
  const std::vector<Segment>& segments() const { return segments_; }

  // Appends literal bytes / a gather at the end of the file. Zero-length pieces are dropped.
  void AddLiteral(std::string bytes);
  void AddGather(uint64_t rows, std::vector<Part> parts);
  // Appends the elementwise mean of the float32 arrays in `parts` (one row each, all the same
  // length, a multiple of 4 bytes), computed as Python's sum(arrays) / len(arrays) computes it
  // on torch tensors: 0 + a0 + a1 + ... in order, then divided by their count; then as `out`.
  // REQUIRES: so.
  void AddMean(std::vector<Part> parts, MeanOut out = MeanOut::kFloat32);
  // Replaces 4 bytes at `pos` of literal segment `literal_index` (a CRC filled in later).
  // REQUIRES: not yet shared with readers.
  void PatchLiteral(size_t literal_index, size_t pos, uint32_t le32);
  // The index the next AddLiteral gets (for PatchLiteral).
  size_t next_literal() const { return literals_.size(); }
  size_t segment_count() const { return segments_.size(); }

  // Calls fn for the pieces that make bytes [offset, offset + len) in order (clipped at the
  // end of the file); stops early when fn returns an error and returns it.
  Status Walk(uint64_t offset, uint64_t len, const std::function<Status(const Piece&)>& fn) const;
  // The same for segments [first, last) only.
  Status WalkSegments(size_t first, size_t last,
                      const std::function<Status(const Piece&)>& fn) const;
  // Bytes from the start of segment i.
  uint64_t SegmentStart(size_t i) const { return segments_[i].start; }

 private:
  Status WalkSegment(const Segment& s, uint64_t from, uint64_t to,
                     const std::function<Status(const Piece&)>& fn) const;

  uint64_t size_ = 0;
  std::vector<Segment> segments_;
  std::vector<std::string> literals_;
};

}  // namespace ckptfs::reshard
