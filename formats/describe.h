// One entry point for "what is this file": its format and its tensors with their byte ranges, as
// served by the user.ckptfs.format / user.ckptfs.tensors extended attributes and `ckptfs inspect`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/format.h"
#include "formats/safetensors.h"
#include "formats/zip.h"

namespace ckptfs {

struct TensorInfo {
  std::string name;
  std::string dtype;  // torch's names ("float32", "bfloat16", ...) whatever the format
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // elements; empty when the tensor is contiguous
  uint64_t offset = 0;          // its bytes in the file: [offset, offset + length)
  uint64_t length = 0;
  // A chunk of a larger tensor (a DCP shard): the whole tensor's shape and where this chunk
  // starts in it. Empty for a whole tensor.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> global_offset;
};

struct FileDescription {
  FileFormat format = FileFormat::kUnknown;
  std::vector<TensorInfo> tensors;
};

// torch's name for a safetensors dtype ("BF16" -> "bfloat16"); the format's own name where torch
// has none.
std::string TorchDtypeName(safetensors::Dtype d);
// The safetensors dtype torch's name stands for; nullopt for a dtype safetensors lacks.
std::optional<safetensors::Dtype> SafetensorsDtypeOf(const std::string& torch_dtype);

// Describes a file of `size` bytes read through read_at; `name` is its file name (a hint only).
// A file in no known format is kUnknown with no tensors, not an error. Errors: a file that claims
// a known format but is damaged (kCorrupt, naming what is wrong), and read errors.
Result<FileDescription> DescribeFile(std::string_view name, uint64_t size,
                                     const zip::ReadAtFn& read_at);

// The tensors as a JSON array of {"name","dtype","shape",["stride",]"offset","length"
// [,"global_shape","global_offset"]}, from
// tensor `first` on, as many as fit in `max_bytes` (at least one); *next gets the index after the
// last one written.
std::string TensorsJson(const std::vector<TensorInfo>& tensors, size_t first, size_t max_bytes,
                        size_t* next);

}  // namespace ckptfs
