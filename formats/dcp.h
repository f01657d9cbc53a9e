// PyTorch Distributed Checkpoint (torch.distributed.checkpoint, "DCP") as FileSystemWriter lays
// it out: a directory of `__R_N.distcp` data files and one `.metadata`, written last.
//
// `.metadata` is a pickle of torch.distributed.checkpoint.metadata.Metadata. It is read here as
// data (formats/pickle.h), never executed: state_dict_metadata gives every entry of the flattened
// state dict (a tensor: dtype, global size and the chunks it was saved in; anything else: bytes),
// storage_data says where each item lies (data file, offset, length), planner_data the original
// key path of each flattened name.
//
// What lies at a storage range depends on the writer's serialization format:
// - torch_save (the default): each item is a whole torch.save archive (a tensor chunk, or the
//   pickled non-tensor value), the items back to back, nothing in between.
// - safetensors (torch >= 2.8): the non-tensor items as above, then one safetensors blob holding
//   the file's tensors by name; every tensor's storage range starts at that blob.
// Both are described by DescribeDataFile.
//
// Versions: the class layout of torch 2.0 through 2.9 is accepted (TensorProperties in either
// torch.distributed._shard.sharded_tensor.metadata or torch.distributed.checkpoint.metadata, its
// state a tuple or a dict; the optional storage_meta and version fields; _StorageInfo with or
// without transform_descriptors).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/describe.h"
#include "formats/zip.h"

namespace ckptfs::dcp {

struct StorageRef {
  std::string relative_path;  // of the data file, relative to the checkpoint directory
  uint64_t offset = 0;
  uint64_t length = 0;
  // Transforms applied to the item's bytes, outermost first (e.g. "stream.zstd/1"); empty: the
  // bytes are stored as they are.
  std::vector<std::string> transforms;
};

struct Chunk {
  std::vector<int64_t> offsets;  // where the chunk starts in the global tensor
  std::vector<int64_t> sizes;
  StorageRef storage;
};

struct TensorEntry {
  std::string fqn;    // the flattened state-dict name ("model.layers.0.weight")
  std::string dtype;  // torch's name
  std::vector<int64_t> size;
  bool requires_grad = false;
  std::vector<Chunk> chunks;  // in the order the metadata lists them
};

struct BytesEntry {
  std::string fqn;
  StorageRef storage;
};

struct Metadata {
  std::vector<TensorEntry> tensors;  // in state_dict_metadata order
  std::vector<BytesEntry> bytes;
  // Every entry in state_dict_metadata order (the state dict's, as saved): (is a tensor, its
  // index in `tensors` or `bytes`).
  std::vector<std::pair<bool, size_t>> order;
  // planner_data: each flattened name's key path in the original state dict (when the planner
  // recorded it; keys that were ints are written in decimal).
  std::map<std::string, std::vector<std::string>> key_paths;
  // Per key path component: whether it was an int (a list index; dict keys are always strings,
  // since the planner writes str(key)).
  std::map<std::string, std::vector<bool>> key_path_index;
  std::string version;  // Metadata.version ("1.0.0"), empty before torch 2.9

  // Every data file the metadata names, sorted.
  std::vector<std::string> Files() const;
  uint64_t TensorBytes() const;  // sum of the tensors' bytes (all chunks)
};

// Parses a `.metadata` file. Errors (kCorrupt, naming the entry): not a pickle of Metadata, a
// field of the wrong shape, a chunk outside its tensor or of the wrong rank, chunks whose
// volumes do not add up to the tensor's, an item with no storage entry, an unknown dtype.
Result<Metadata> ParseMetadata(std::string_view bytes);

// The tensors held by data file `relative_path` (of `size` bytes, read through read_at), named by
// their flattened state-dict names, each with the byte range of its raw data in the file; a
// chunk of a larger tensor carries its place in it (TensorInfo::global_*). Errors (kCorrupt): an
// item outside the file, an item that is not what the metadata says (dtype, shape), transforms
// (compressed items have no raw range).
Result<FileDescription> DescribeDataFile(const Metadata& md, std::string_view relative_path,
                                         uint64_t size, const zip::ReadAtFn& read_at);

}  // namespace ckptfs::dcp
