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

// What a model entry is to mixture-of-experts resharding (megatron.core's expert modules, under
// "<layer>.mlp.experts."): see megatron_moe.cc.
struct ExpertKey {
  enum Kind : uint8_t {
    kDense,        // not an expert tensor
    kPerExpert,    // one local expert's: local_experts.{k}.* (SequentialMLP), linear_fcN.weight{k}
                   // (TEGroupedMLP)
    kModuleState,  // a grouped module's own entry (TEGroupedMLP's linear_fcN._extra_state)
    kGrouped1,     // legacy GroupedMLP weight1: every local expert's [H, fc1 cols] in one tensor
    kGrouped2,     // legacy GroupedMLP weight2: every local expert's [fc2 rows, H]
  } kind = kDense;
  bool sequential = false;  // SequentialMLP: its experts' entries are grouped by expert
  int64_t local = -1;       // k, for kPerExpert
  size_t pos = 0, len = 0;  // where k's digits are in the (single) path component
  std::string tmpl;         // the name with k's digits replaced by '*'
};
// Errors (kInvalid): an entry under mlp.experts. of no known form.
Result<ExpertKey> ParseExpertKey(const std::vector<std::string>& path);
// The rule of the model entry named `name` (the key path with "model."), expert entries included.
Result<Rule> ClassifyEntry(const Rules& rules, const std::string& name, const ExpertKey& key,
                           bool swiglu);

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
  // Optimizer (non-distributed), per sub-optimizer (megatron.core's ChainedOptimizer saves a list
  // [dense, experts] when expert parallelism gives the experts an optimizer of their own, else
  // one state dict): the wrapper, the torch optimizer's state dict, the fp32 masters.
  struct SubOpt {
    ValuePtr wrapper, inner, fp32;
    std::vector<ValuePtr> groups;
    std::vector<int> group_class;  // per group: 1 when it holds the no-weight-decay parameters
    bool expert = false;           // the experts' optimizer
  };
  std::vector<SubOpt> subs;
  bool optim_list = false;  // `optimizer` is a list of sub-optimizer states
  // Per entry index (tensors only): the sub-optimizer, the Adam state index and group, or -1.
  std::vector<int64_t> opt_sub, opt_index, opt_group, opt_pos;
  std::vector<ExpertKey> expert;  // per entry
  // The distributed optimizer: distrib_optim.pt (per sub-optimizer: the dense one, then at EP > 1
  // the experts'; None where this rank does not hold it), and per entry index its sub-optimizer
  // and the parameter's first element in that one's flat tensors (-1: not a parameter, or its
  // state is not in this file).
  std::optional<DistOptStates> dist;
  std::vector<int64_t> dist_offset;
  std::vector<int> dist_sub;
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
  uint32_t ep = 0;              // source expert-parallel rank of its files
  bool from_embedding = false;  // a head copy made from the word embeddings
  // Experts: what the entry is, its global expert number (kPerExpert, kGrouped*: one Global per
  // expert of a grouped tensor, `local` its index there) and where that number's digits are in
  // `path` (kPerExpert).
  ExpertKey expert;
  int64_t global_expert = -1, local = -1;
  size_t expert_pos = 0, expert_len = 0;
};

class Planner {
 public:
  using Out = TorchOut;
  Planner(const MegatronSource& src, uint32_t T, uint32_t P, uint32_t E, const Rules& rules)
      : src_(src), T_(T), P_(P), E_(E ? E : src.ep), asked_E_(E), rules_(rules) {}

  Result<std::vector<ViewFile>> Run(std::vector<ViewFile>* distrib);
  // The source's model tensors, whole (the shards of each), for views of another format.
  Result<MegatronTensors> Tensors();

 private:
  // Reads the model, decodes every file and gathers each entry's shards (globals_).
  Status Prepare();
  size_t FileIndex(uint32_t tp, uint32_t pp, uint32_t ep) const {
    return (size_t{pp} * src_.ep + ep) * src_.tp + tp;
  }
  Decoded& File(uint32_t tp, uint32_t pp, uint32_t ep = 0) { return files_[FileIndex(tp, pp, ep)]; }
  // Source TP rank k's file of g.
  const Decoded& FileOf(const Global& g, uint32_t k) const {
    return files_[FileIndex(k, g.stage, g.ep)];
  }
  // Source file (tp, pp)'s entries in the order the globals take them: EP rank 0's, with each
  // layer's expert entries replaced by those of every EP rank in global expert order, as
  // (ep, entry index, global expert or -1, index in a grouped tensor or -1).
  struct Item {
    uint32_t ep;
    size_t entry;
    int64_t global_expert, local;
  };
  Result<std::vector<Item>> MergedEntries(uint32_t tp, uint32_t pp);
  // Whether an entry of kind k is an expert parameter of its own sub-optimizer at EP size E.
  static bool ExpertParallel(ExpertKey::Kind k, uint32_t E) {
    return E > 1 && (k == ExpertKey::kPerExpert || k == ExpertKey::kGrouped1 ||
                     k == ExpertKey::kGrouped2);
  }
  static bool ExpertParallel(const Global& g, uint32_t E) { return ExpertParallel(g.expert.kind, E); }
  // Whether g belongs to target EP rank e.
  bool InTargetEp(const Global& g, uint32_t e) const;
  // Target parameter g's shard for TP rank t: ReshardTensor, or for a grouped tensor the
  // target's experts (the E/EP globals from g on) cut one by one.
  Result<ValuePtr> ReshardParam(
      Out* out, const Global& g, uint32_t t,
      const std::function<Result<const TorchTensor*>(const Decoded&, size_t)>& pick,
      const std::string& what);
  // The optimizer of target rank (t, p): its sub-optimizers' states.
  Result<ValuePtr> PlanOptimizer(Out* out, uint32_t t, const Decoded& primary,
                                 const std::vector<std::pair<const Global*, ValuePtr>>& params);
  Result<ValuePtr> PlanSubOptimizer(Out* out, uint32_t t, const Decoded& primary, bool expert,
                                    const std::vector<const Global*>& params, bool sorted_groups);
  Status DecodeAll();
  Status BuildGlobals();
  // The source's distributed-optimizer layouts (dist_offset), checked against its files.
  Status LayOutSourceDistOpt();
  bool SharedEmbedding(const std::string& name, bool head, uint32_t p, uint32_t P) const;
  // Rank (t, p)'s model_optim_rng.pt, and its distrib_optim.pt when `distrib` is given.
  Result<ViewFile> PlanFile(uint32_t t, uint32_t p, uint32_t e, ViewFile* distrib);
  Result<ViewFile> PlanDistOpt(uint32_t t, uint32_t p, uint32_t e, const Decoded& primary,
                               const std::vector<const Global*>& params);
  // The sub-optimizer holding parameter entry `x` of `d` (a file of an EP size `ep` run): 1 for
  // an expert's at EP > 1, else 0.
  static int DistSub(const Decoded& d, size_t x, uint32_t ep) {
    return ExpertParallel(d.expert[x].kind, ep) ? 1 : 0;
  }

  // Building one target file.
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
  const uint32_t T_, P_, E_;
  const uint32_t asked_E_;  // the spec's EP, 0 for tpT-ppP (then E_ is the source's)
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
