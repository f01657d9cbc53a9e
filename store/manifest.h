// Manifest: a file's bytes as a sequence of extents, each a whole chunk or a hole (zeros).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/chunk_id.h"
#include "common/status.h"

namespace ckptfs {

struct Extent {
  ChunkId id;        // zero: a hole of `len` zero bytes, backed by no chunk
  uint64_t len = 0;  // for a chunk: the chunk's whole length
  bool hole() const { return id.IsZero(); }
  friend bool operator==(const Extent&, const Extent&) = default;
};

class Manifest {
 public:
  void Append(const Extent& e);
  // Appends a hole, merging it into a hole that ends the manifest.
  void AppendHole(uint64_t len);
  // Drops the last extent.
  void PopBack();

  uint64_t size() const { return size_; }
  // The bytes of the chunk extents: size() less the holes.
  uint64_t DataBytes() const;
  bool empty() const { return extents_.empty(); }
  const std::vector<Extent>& extents() const { return extents_; }
  // File offset where extent i starts.
  uint64_t StartOf(size_t i) const { return starts_[i]; }
  // Index of the extent holding byte `offset`; extents().size() when offset >= size().
  size_t Find(uint64_t offset) const;
  // lseek(2)'s SEEK_DATA (data) and SEEK_HOLE: the first offset at or after `offset` in a chunk
  // (data) or in a hole, the end of the file counting as a hole. nullopt when offset >= size(),
  // or for data when none follows (ENXIO).
  std::optional<uint64_t> Seek(uint64_t offset, bool data) const;

  std::string Encode() const;
  static Result<Manifest> Decode(std::string_view bytes);
  friend bool operator==(const Manifest& a, const Manifest& b) { return a.extents_ == b.extents_; }

 private:
  std::vector<Extent> extents_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

}  // namespace ckptfs
