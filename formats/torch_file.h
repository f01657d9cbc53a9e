// What a torch.save file (torch >= 1.6: a zip) holds: its storages and the tensors viewing them,
// read from data.pkl without executing it.
//
// data.pkl names each storage by a persistent id ('storage', torch.<Type>Storage, key, location,
// numel); the storage's bytes are the record <prefix>/data/<key>. Each tensor is a call of
// torch._utils._rebuild_tensor_v2 (or _v3, or wrapped by _rebuild_parameter) with the storage,
// its element offset, size and stride.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/pickle.h"
#include "formats/zip.h"

namespace ckptfs {

struct TorchStorage {
  std::string key;    // the record is <prefix>/data/<key>
  std::string dtype;  // torch's name: "float32", "bfloat16", ...
  uint32_t itemsize = 0;
  uint64_t numel = 0;
  std::string location;  // "cpu", "cuda:0", ...: kept as recorded
  uint64_t nbytes() const { return numel * itemsize; }
  uint64_t data_offset = 0;  // in the file; 0 until the zip directory is known
};

struct TorchTensor {
  std::string name;  // the key path from the root, joined with '.'
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t storage_offset = 0;  // in elements
  std::string storage_key;
  bool requires_grad = false;
  bool parameter = false;  // an nn.Parameter
  // The bytes the tensor spans in its storage: [offset, offset + length) in the file (offset is
  // relative to the storage until the zip directory is known). For a contiguous tensor these are
  // exactly its bytes in row-major order.
  uint64_t offset = 0;
  uint64_t length = 0;
  // The call node in the pickle tree that rebuilds this tensor (the outer _rebuild_parameter call
  // for a parameter); valid while the tree lives.
  const pickle::Value* node = nullptr;
};

struct TorchPickle {
  std::map<std::string, TorchStorage> storages;  // by key
  std::vector<TorchTensor> tensors;              // in the order the pickle reaches them
};

// The element size and torch dtype name of a storage class (e.g. "FloatStorage" -> 4, "float32").
bool StorageType(const std::string& cls, std::string* dtype, uint32_t* itemsize);
// Whether a tensor of this shape and stride (in elements) is laid out row-major without gaps.
bool IsContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride);
// The row-major strides (in elements) of a contiguous tensor of this shape.
std::vector<int64_t> ContiguousStride(const std::vector<int64_t>& shape);
// The element size of a torch dtype name ("float32" -> 4); 0 when unknown.
uint32_t DtypeSize(const std::string& dtype);

// Finds the storages and tensors in a data.pkl tree. Errors (kCorrupt): a storage id or a tensor
// call that is malformed, a tensor reaching past its storage.
Result<TorchPickle> DescribeTorchPickle(const pickle::ValuePtr& root);

struct TorchFile {
  std::string prefix;  // the archive's record prefix, e.g. "archive"
  TorchPickle pickle;  // with storage data offsets and tensor byte ranges in the file
  pickle::ValuePtr root;
  zip::Directory dir;
};

// Reads a whole torch zip file through read_at. Errors name what is wrong: not a zip, no
// data.pkl, a compressed record, a storage record missing or of the wrong size, a bad pickle.
Result<TorchFile> ReadTorchFile(uint64_t file_size, const zip::ReadAtFn& read_at);

}  // namespace ckptfs
