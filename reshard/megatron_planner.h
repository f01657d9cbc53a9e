// The Megatron view planner's insides, shared by megatron.cc (decoding the source, the entry
// points) and megatron_plan_file.cc (one target rank's files). Not an interface: include it from
// those two only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/pickle.h"
#include "reshard/megatron.h"
#include "reshard/megatron_args.h"
#include "reshard/megatron_distopt.h"
#include "reshard/torch_out.h"

namespace ckptfs::reshard::megatron_planner {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// "layers.N" in a key path: the component holding it, and where the digits are.
struct LayerRef {
  size_t component = 0, pos = 0, len = 0;
  int64_t number = -1;
};
std::optional<LayerRef> FindLayer(const std::vector<std::string>& path);
std::vector<std::string> WithLayer(std::vector<std::string> path, const LayerRef& r, int64_t n);
// The path's components joined with dots.
std::string Join(const std::vector<std::string>& path);

// One source file, decoded.
struct ModelEntry {
  std::vector<std::string> path;  // keys from the model root
  ValuePtr leaf;
  const TorchTensor* tensor = nullptr;
};
struct Decoded {
  const MegatronRankFile* rank = nullptr;
  std::unordered_map<const Value*, const TorchTensor*> tensors;
  ValuePtr root, model;
  std::vector<ModelEntry> entries;
  std::map<std::string, ValuePtr> containers;  // by joined path ("" = the model root)
  // Optimizer (non-distributed): the wrapper, the torch optimizer's state dict, the fp32 masters.
  ValuePtr optim_wrapper, optim_inner, fp32;
  std::vector<ValuePtr> groups;
  std::vector<int> group_class;  // per group: 1 when it holds the no-weight-decay parameters
  // Per entry index (tensors only): the Adam state index and group, or -1.
  std::vector<int64_t> opt_index, opt_group, opt_pos;
  // The distributed optimizer: distrib_optim.pt, and per entry index the parameter's first
  // element in its flat tensors (-1: not a parameter).
  std::optional<DistOptSource> dist;
  std::vector<int64_t> dist_offset;
};

// Whether the optimizer keeps entry e out of weight decay (biases and 1-d tensors).
bool NoWeightDecay(const ModelEntry& e);

// Everything about one model entry across the source: its shards by source TP rank.
struct Global {
  std::vector<std::string> path;  // global layer numbering
  std::optional<LayerRef> layer;
  enum Place { kPre, kLayer, kPost, kHead } place = kPost;
  Rule rule = Rule::kExtraState;
  std::vector<size_t> entry;    // per source tp: index into that file's entries
  uint32_t stage = 0;           // source stage
  bool from_embedding = false;  // a head copy made from the word embeddings
};

class Planner {
 public:
  Planner(const MegatronSource& src, uint32_t T, uint32_t P, const Rules& rules)
      : src_(src), T_(T), P_(P), rules_(rules) {}

  Result<std::vector<ViewFile>> Run(std::vector<ViewFile>* distrib);
  // The source's model tensors, whole (the shards of each), for views of another format.
  Result<MegatronTensors> Tensors();

 private:
  // Reads the model, decodes every file and gathers each entry's shards (globals_).
  Status Prepare();
  Decoded& File(uint32_t tp, uint32_t pp) { return files_[pp * src_.tp + tp]; }
  Status DecodeAll();
  Status BuildGlobals();
  // The source's distributed-optimizer layouts (dist_offset), checked against its files.
  Status LayOutSourceDistOpt();
  bool SharedEmbedding(const std::string& name, bool head, uint32_t p, uint32_t P) const;
  // Rank (t, p)'s model_optim_rng.pt, and its distrib_optim.pt when `distrib` is given.
  Result<ViewFile> PlanFile(uint32_t t, uint32_t p, ViewFile* distrib);
  Result<ViewFile> PlanDistOpt(uint32_t t, uint32_t p, const Decoded& primary,
                               const std::vector<const Global*>& params);

  // Building one target file.
  using Out = TorchOut;
  static Result<ValuePtr> Copy(Out* out, const Decoded& d, const ValuePtr& v) {
    return out->Copy(d.tensors, d.rank->source, v);
  }
  // A copy of mapping m (of file d) with the values of the keys in `replace` replaced.
  Result<ValuePtr> Rebuild(Out* out, const Decoded& d, const ValuePtr& m,
                           const std::map<std::string, ValuePtr>& replace);
  Result<ValuePtr> ReshardTensor(Out* out, const Global& g, uint32_t t,
                                 const std::function<Result<const TorchTensor*>(const Decoded&,
                                                                                size_t)>& pick,
                                 const std::string& what);

  const MegatronSource& src_;
  const uint32_t T_, P_;
  const Rules& rules_;
  MegatronModel model_;
  std::vector<Decoded> files_;
  std::vector<Global> globals_;
  bool legacy_ = false;
  bool model_only_ = false;  // Tensors(): the model's tensors only, no target, no optimizer
  bool has_distrib_ = false;  // every source rank has a distrib_optim.pt
  VocabSizes vocab_;
};

}  // namespace ckptfs::reshard::megatron_planner
