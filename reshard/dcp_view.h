// The DCP "consolidated" view (docs/views.md): a PyTorch Distributed Checkpoint directory read as
// one `model.pt`, the file torch.distributed.checkpoint.format_utils.dcp_to_torch_save writes, and
// one `model.safetensors` of the model's tensors; both are recipes over the `.distcp` files.
//
// model.pt rebuilds the nested state dict the way torch's _EmptyStateDictLoadPlanner does: each
// entry of the metadata, tensors first then the non-tensor items (each in metadata order), is set
// at its planner_data key path (a missing path: the flattened name at the top level), creating
// dicts along the way (lists for list indices). Every tensor is whole and contiguous, its bytes
// gathered from the chunks it was saved in.
//
// Pure: the caller parses `.metadata` (dcp::ParseMetadata), describes each data file
// (dcp::DescribeDataFile) and reads the non-tensor items; planning reads nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/dcp.h"
#include "formats/describe.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

struct DcpDataFile {
  std::string relative_path;  // as the metadata names it
  uint32_t source = 0;        // the index Part::source uses for this file
  FileDescription desc;       // dcp::DescribeDataFile of the file
};

// Where the files' descriptions put each chunk: by (relative path, tensor name).
class DcpChunkIndex {
 public:
  explicit DcpChunkIndex(const std::vector<DcpDataFile>& files);
  // The description of chunk c of tensor t (matched by its shape and global offset; a chunk that
  // is the whole tensor also by shape alone), and the source index of its file; nullptr when no
  // description holds it.
  const TensorInfo* Find(const dcp::TensorEntry& t, const dcp::Chunk& c, uint32_t* source) const;

 private:
  std::unordered_map<std::string, std::vector<std::pair<uint32_t, const TensorInfo*>>> infos_;
};

struct DcpView {
  ViewFile model_pt;           // CRCs pending: ComputeCrcs before the first read
  ViewFile model_safetensors;  // no CRCs: crc_tasks is empty
};

// One component of a key path as planner_data records it: a dict key (a str), or a list index
// (an int: torch's traverse_state_dict numbers the items of a list that holds tensors or dicts,
// and set_element rebuilds a list there).
struct DcpKey {
  std::string name;    // the key, or the index in decimal
  bool index = false;  // a list index
};
using DcpKeyPaths = std::map<std::string, std::vector<DcpKey>>;  // by flattened name

// Plans both files. `bytes_items`: every non-tensor entry's item (md.bytes) by flattened name,
// the whole torch.save archive as stored (transforms undone). `key_paths` replaces md.key_paths,
// whose components are all taken as dict keys (dcp::Metadata keeps ints only in decimal).
//
// model.safetensors holds the tensors under the top-level key "model" with that key dropped
// (every tensor when no entry's path starts with "model"; without planner data, the flattened
// names starting with "model."), names sorted, __metadata__ {"format": "pt"}.
//
// Errors (kInvalid, naming the tensor or key): chunks that do not cover their tensor exactly or
// are missing from the descriptions, a non-tensor item missing or unreadable (one that holds
// tensors keeps them: model.pt gets their storages), key paths that collide (a value where a container must be), a model tensor of a dtype
// safetensors lacks, sizes that overflow.
Result<DcpView> PlanDcpConsolidated(const dcp::Metadata& md, const std::vector<DcpDataFile>& files,
                                    const std::map<std::string, std::string>& bytes_items);
Result<DcpView> PlanDcpConsolidated(const dcp::Metadata& md, const DcpKeyPaths& key_paths,
                                    const std::vector<DcpDataFile>& files,
                                    const std::map<std::string, std::string>& bytes_items);

}  // namespace ckptfs::reshard
