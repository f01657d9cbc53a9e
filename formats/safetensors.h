// safetensors: reading and writing the header of a .safetensors file.
//
// The file is an 8-byte little-endian length N, N bytes of JSON (the header), then the byte
// buffer. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]},
// offsets relative to the start of the buffer, plus an optional "__metadata__" of string to string.
//
// The checks follow the reference implementation (huggingface/safetensors, safetensors/src/
// tensor.rs: SafeTensors::read_metadata and Metadata::validate), so that ckptfs accepts what
// safetensors loads and rejects what it rejects:
//   - N at most kMaxHeaderLen; the header is UTF-8 JSON, an object; no duplicate names;
//   - sorted by offsets, the tensors tile the buffer exactly: the first begins at 0, each begins
//     where the previous ended, the last ends at the end of the file (no holes, no overlaps, no
//     trailing bytes: the spec forbids polyglot files);
//   - each tensor's byte length is its element count times its dtype's bits, divided by 8, and the
//     bit count must be a whole number of bytes (sub-byte dtypes such as F4);
//   - arithmetic overflow anywhere is an error.
// Like the reference reader, leading and trailing JSON whitespace around the object is accepted
// (writers pad the header with spaces; recent writers may pad in front to align the buffer), and
// unknown fields inside a tensor entry are ignored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ckptfs::safetensors {

// The dtypes of the format, in the reference's order, which is increasing alignment: the
// reference writer lays tensors out by descending dtype (then by name) so each stays aligned.
enum class Dtype : uint8_t {
  kBool,
  kF4,      // 4-bit float (OCP MX FP4)
  kF6E2M3,  // 6-bit floats (OCP MX FP6)
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3Fnuz,
  kF8E5M2Fnuz,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,  // complex64: two F32
  kF64,
  kI64,
  kU64,
};

// The name used in the header ("BOOL", "F8_E4M3", "BF16", ...).
std::string_view DtypeName(Dtype d);
std::optional<Dtype> DtypeFromName(std::string_view name);
// Bits per element: 4 for F4, 6 for the F6 types, otherwise a multiple of 8.
uint32_t DtypeBits(Dtype d);

// The reference rejects longer headers as a guard against memory exhaustion; so does ckptfs.
inline constexpr uint64_t kMaxHeaderLen = 100'000'000;

using Metadata = std::vector<std::pair<std::string, std::string>>;  // header order

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;  // empty: a scalar
  uint64_t offset = 0;          // absolute byte offset of the data in the file
  uint64_t length = 0;          // bytes of data (0 for a tensor with a zero dimension)
};

struct Header {
  uint64_t header_len = 0;           // N: the JSON bytes, padding included
  uint64_t data_len = 0;             // bytes in the buffer: the sum of the tensors' lengths
  std::vector<TensorInfo> tensors;   // in header order (not necessarily offset order)
  std::optional<Metadata> metadata;  // absent when the header has no "__metadata__" (or null)

  uint64_t data_start() const { return 8 + header_len; }
  // The size the file must have.
  uint64_t file_size() const { return data_start() + data_len; }
};

// For a streaming caller: given the first `len` bytes of a file, how many bytes from the start
// ParseHeader needs (8 + N). With fewer than 8 bytes the answer is 8: read that much and ask again.
// Errors (Code::kCorrupt): N larger than kMaxHeaderLen.
Result<uint64_t> HeaderBytesNeeded(const uint8_t* head, size_t len);

// Parses and validates the header. `data` holds at least the first 8 + N bytes of the file (more
// is ignored). If `file_size` is given, the tensors must end exactly there, as the reference
// requires; without it that check is left to the caller (compare with Header::file_size()), e.g.
// while the file is still being written.
// Errors (Code::kCorrupt, message says what and for which tensor): fewer bytes than the header
// needs, any violation of the rules listed at the top of this file.
Result<Header> ParseHeader(const uint8_t* data, size_t len,
                           std::optional<uint64_t> file_size = std::nullopt);
inline Result<Header> ParseHeader(std::string_view data,
                                  std::optional<uint64_t> file_size = std::nullopt) {
  return ParseHeader(reinterpret_cast<const uint8_t*>(data.data()), data.size(), file_size);
}

// What the writer needs to know about a tensor.
struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
};

struct BuiltHeader {
  std::string bytes;                // the 8-byte length, the JSON, the space padding
  std::vector<TensorInfo> tensors;  // in the order written, with absolute offsets
  uint64_t file_size = 0;           // bytes.size() plus every tensor's data
};

// Produces the header of a file holding `tensors` back to back in the given order (use
// SortLikeReference first to get the reference writer's layout), with "__metadata__" first when
// `metadata` is given. The JSON is compact and escaped like the reference's (serde_json), and
// padded with spaces to a multiple of 8 bytes, as the reference writer pads, so the buffer starts
// 8-byte aligned. The caller then appends each tensor's bytes in order.
// Errors (Code::kInvalid): duplicate or reserved ("__metadata__") names, names or metadata that
// are not valid UTF-8, a sub-byte tensor that does not fill whole bytes, sizes that overflow, a
// header longer than kMaxHeaderLen.
Result<BuiltHeader> BuildHeader(const std::vector<TensorSpec>& tensors,
                                const std::optional<Metadata>& metadata);

// Sorts into the reference writer's order: by descending dtype (see Dtype), then by name.
void SortLikeReference(std::vector<TensorSpec>* tensors);

}  // namespace ckptfs::safetensors
