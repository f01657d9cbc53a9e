// The DeepSpeed planners' shared parts (reshard/deepspeed*.cc): a tag directory decoded, and
// ZeRO stage 1/2's partitioning arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/pickle.h"
#include "reshard/deepspeed.h"
#include "reshard/torch_out.h"

namespace ckptfs::reshard::ds {

// ZeRO stage 1/2 partitioning (DeepSpeedZeroOptimizer): a group's flat buffer is aligned to
// 2 * dp elements and cut into dp equal partitions; the padding sits at the end.
struct Partitioning {
  uint64_t total = 0, dp = 1, size = 0;  // elements: real, ranks, per partition
  Partitioning(uint64_t total_, uint64_t dp_) : total(total_), dp(dp_) {
    const uint64_t align = 2 * dp;
    size = (total + align - 1) / align * align / dp;
  }
  uint64_t Begin(uint64_t r) const { return std::min(total, r * size); }
  uint64_t End(uint64_t r) const { return std::min(total, (r + 1) * size); }
  uint64_t Real(uint64_t r) const { return End(r) - Begin(r); }
  uint64_t Padding(uint64_t r) const { return size - Real(r); }
  // The rank whose partition holds element e (0 for an empty group).
  uint64_t RankOf(uint64_t e) const { return size ? std::min(e / size, dp - 1) : 0; }
};

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0, offset = 0;  // in its group's flat buffer, elements
  bool operator==(const Param&) const = default;
};

// One optimizer file (one dp rank of one TP rank), decoded.
struct Optim {
  const DsSourceFile* file = nullptr;
  TensorIndex tensors;
  pickle::ValuePtr root, osd, base, state;
  std::vector<const TorchTensor*> fp32;  // per group (padding stripped, but for BF16_Optimizer)
  std::vector<pickle::ValuePtr> group_state;          // per group: the state mapping (null: none yet)
  std::vector<pickle::ValuePtr> mappings;             // per group: param_slice_mappings
};

// One TP rank: its model-states file and its optimizer files by dp rank.
struct TpRank {
  const DsSourceFile* model = nullptr;
  TensorIndex model_tensors;
  std::vector<std::vector<Param>> groups;  // param_shapes, with offsets
  std::vector<Optim> optim;                // by dp rank
  std::vector<uint64_t> totals;            // per group: real elements
};

// ZeRO stage 3 (DeepSpeedZeroOptimizer_Stage3): each parameter is cut on its own into dp
// partitions of ceil(numel / dp) elements, the last ones padded; a rank's flat fp32 buffer of a
// sub-group is its partition of each of the sub-group's parameters, one after another.
struct Zero3Param : Param {  // offset: of its partition in every rank's sub-group buffer
  uint64_t part = 0;          // elements of one partition
  uint64_t Real(uint64_t r) const { return std::min(part, numel - std::min(numel, r * part)); }
};
struct Zero3Rank {
  const DsSourceFile* model = nullptr;  // zero_pp_rank_D_mp_rank_00_model_states.pt
  const DsSourceFile* optim = nullptr;
  TensorIndex model_tensors;           // of the model-states file
  TensorIndex tensors;                 // of the optimizer file
  pickle::ValuePtr osd;                // its optimizer_state_dict
  std::vector<const TorchTensor*> fp32;        // fp32_flat_groups, per sub-group
  std::vector<pickle::ValuePtr> group_state;   // per sub-group: the state mapping (null: none)
};
struct Zero3 {
  std::vector<std::vector<Zero3Param>> groups;  // param_shapes: one per sub-group
  std::vector<Zero3Rank> ranks;                 // by dp rank
};

// Native DeepSpeed MoE (deepspeed.moe.layer.MoE) at ZeRO stage 1/2: the optimizer's param
// groups mix dense groups (partitioned over the dp ranks) and `moe` groups named ep_size_EP
// (partitioned over the expert-data-parallel ranks of one EP rank, its local experts only).
struct Moe {
  struct Group {
    bool moe = false;
    // Per domain (dense: one, all dp ranks; moe: one per EP rank, its expert-dp ranks): the
    // real elements, the parameters the source's param_slice_mappings name (offsets in the
    // domain's flat buffer), and how far they reach (elements [0, known) are named).
    std::vector<uint64_t> totals;
    std::vector<std::vector<Param>> params;
    std::vector<uint64_t> known;
  };
  uint32_t ep = 1;
  // ds_config's use_data_before_expert_parallelism: rank r's EP rank is r / (dp / ep) and its
  // expert-dp rank r % (dp / ep); otherwise (DeepSpeed's default) r % ep and r / ep.
  bool data_before_expert = false;
  // The moe groups' param_slice_mappings are cut by the full dp size (DeepSpeed 0.14.4 and
  // older; fixed in 0.14.5): partition r's window is [r * a / dp, (r + 1) * a / dp) of the
  // aligned buffer of a elements, not the partition itself.
  bool full_dp_mappings = false;
  std::vector<Group> groups;
  // The (EP rank, expert-dp rank) of dp rank r of dp, and back.
  std::pair<uint32_t, uint32_t> Split(uint32_t r, uint32_t dp) const;
  uint32_t Join(uint32_t e, uint32_t q, uint32_t dp) const;
};

// A tag directory's files, decoded and checked against each other.
class Checkpoint {
 public:
  explicit Checkpoint(const DeepSpeedSource& source) : src(source) {}
  // Errors (kInvalid, naming the file): see PlanDeepSpeed.
  Status Decode();

  // The source pieces holding elements [from, to) of group g's flat buffer of TP rank tr, of the
  // tensor `pick` selects in each dp rank's file (the fp32 partition, or a state tensor).
  Result<std::vector<Part>> Flat(const TpRank& tr, size_t g, uint64_t from, uint64_t to,
                                 const std::function<const TorchTensor*(const Optim&)>& pick,
                                 const std::string& what) const;
  // State tensor `key` of group g in o; nullptr when absent or not a tensor.
  static const TorchTensor* StateTensor(const Optim& o, size_t g, const std::string& key);

  // An optimizer file's structure (G parameter groups), no sizes checked. Errors: see
  // PlanDeepSpeed.
  Status ParseOptim(Optim* o, size_t G);
  // Group g of o as partition r of `part` (`by` says where part comes from, for errors).
  Status CheckOptimGroup(const Optim& o, size_t g, const Partitioning& part, uint64_t r,
                         const std::string& by) const;

  const DeepSpeedSource& src;
  std::vector<TpRank> tp;    // by TP rank (stages 1 and 2)
  std::unique_ptr<Zero3> z3;  // stage 3 instead (deepspeed_zero3.cc)
  std::unique_ptr<Moe> moe;   // native MoE at stage 1/2 (deepspeed_moe.cc); tp[0] then has no
                              // param_shapes (groups, totals empty)
  uint32_t D = 0;            // the source's data-parallel size
  std::string optim_prefix;  // "", "bf16_" or "fp16_"
  // DeepSpeed's BF16_Optimizer (bf16 with ZeRO stage 1 and fp32 gradient accumulation) wrote
  // the optimizer files: no zero_stage, and each rank's fp32 partition keeps its alignment
  // padding (Partitioning::size elements); group_paddings holds the whole padding on the last
  // rank only. Decided by the first file; every other file must agree.
  std::optional<bool> bf16_optimizer;

 private:
  Status DecodeZero3(const std::map<uint32_t, const DsSourceFile*>& models,
                     const std::map<uint32_t, const DsSourceFile*>& optims);
  Status DecodeOptim(TpRank* tr, uint32_t d);
  Status DecodeMoe(const std::map<uint32_t, const DsSourceFile*>& models,
                   const std::map<std::pair<uint32_t, uint32_t>, const DsSourceFile*>& optims);
  Status CheckMappings(const TpRank& tr, uint32_t d) const;
};

// The fragment a dp rank's partition holds of each parameter, as DeepSpeed's
// _create_param_mapping computes it: (name, (numel, start in the partition)).
std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> Fragments(
    const std::vector<Param>& params, const Partitioning& part, uint64_t d);
// The same for the window [lo, hi) of the group's flat buffer (start relative to lo).
std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> FragmentsIn(
    const std::vector<Param>& params, uint64_t lo, uint64_t hi);
// The source pieces holding elements [from, to) of a flat buffer cut as `part`, partition r
// held by optim_of(r), of the tensor `pick` selects.
Result<std::vector<Part>> FlatOf(const Partitioning& part,
                                 const std::function<const Optim&(uint64_t r)>& optim_of,
                                 uint64_t from, uint64_t to,
                                 const std::function<const TorchTensor*(const Optim&)>& pick,
                                 const std::string& what);

// Integer field `key` of a pickled object's state (or of a mapping); nullopt when absent.
std::optional<int64_t> IntField(const pickle::ValuePtr& obj, std::string_view key);
// param_shapes of a model-states file: per group (stage 3: per sub-group) its parameters'
// names, shapes and element counts, offsets 0. Errors (naming `where`): not a list of mappings
// of shapes.
Result<std::vector<std::vector<Param>>> ParamShapes(const pickle::ValuePtr& root,
                                                    const std::string& where);
// The element count of `shape`. Errors (naming `what`): a negative size, 2^56 elements or more.
Result<uint64_t> Numel(const std::vector<int64_t>& shape, const std::string& what);
std::string ModelName(uint32_t tp);
std::string OptimFileName(const std::string& prefix, uint32_t dp, uint32_t tp);
// torch.save names a file's records after the file: "fp32.pt" -> "fp32/...".
std::string ArchivePrefix(std::string_view file_name);

// How ds_to_universal merges a parameter's TP slices into the full tensor.
struct Merge {
  // kAverage: the float32 mean of the slices (Python's sum(slices) / len(slices)).
  enum Kind { kCat, kReplicated, kAverage, kTwoSubParams, kSubParams } kind = kCat;
  int cat_dim = 0;            // kCat, kTwoSubParams
  bool vocab = false;         // then cut to original_rows rows
  int64_t original_rows = -1;
  // kSubParams (parameter_with_sub_params): the full tensor viewed as `sub_shape` holds the
  // sub-parameters one after another along `partition_dim`, `subs` elements each, and every TP
  // rank holds its 1/T of each. `sub_spec` is the entry as universal_checkpoint_info gives it
  // (patterns, shape, partition_dim), written back into the universal files.
  std::vector<int64_t> sub_shape, subs;
  size_t partition_dim = 0;
  pickle::ValuePtr sub_spec;
};

// universal_checkpoint_info's patterns (Python regular expressions matched at the name's start).
struct UcInfo {
  struct Patterns;  // compiled (deepspeed_universal.cc keeps <regex> out of this header)
  bool present = false;
  // Whether it lists tp_replicated_parameter_patterns or parameter_with_row_parallelism_patterns
  // (Megatron-DeepSpeed writes both only when TP > 1).
  bool tp_lists = false;
  std::shared_ptr<const Patterns> patterns;
  int64_t original_vocab_size = -1;
  // From the first model-states file. Errors: a malformed entry.
  static Result<UcInfo> Read(const Checkpoint& c);
  // The merge of parameter `name` (without original_rows). Errors: a vocabulary parameter
  // without original_vocab_size.
  Result<Merge> Classify(const std::string& name) const;
};

// A merge as rows of pieces: the full tensor (`shape`) is `rows` rows, and row r is, in order,
// for each piece, elements [r * widths[slice] + from, + len) of that TP slice (row-major). For
// kReplicated only slice 0 is used.
struct MergeLayout {
  struct Piece {
    size_t slice = 0;
    uint64_t from = 0, len = 0;
  };
  std::vector<int64_t> shape;
  uint64_t rows = 1;
  std::vector<uint64_t> widths;  // elements per row, by slice
  std::vector<Piece> pieces;
};
// Errors: slices that do not fit the merge (`what` names the tensor).
Result<MergeLayout> LayoutOf(const Merge& m, const std::vector<std::vector<int64_t>>& slices,
                             const std::string& what);

// Gather streams (GatherBytes, view_file.h: the bytes of one): bytes [from, to) of row r of g
// as parts (`strided`: parts that go on to the next rows); bytes [from, to) of the stream gs
// makes; and for a stream of whole rows, the byte ranges `ranges` of every row, in order.
std::vector<Part> RowPiece(const Gather& g, uint64_t r, uint64_t from, uint64_t to,
                           bool strided = false);
// REQUIRES (Cut): a cut inside a mean gather falls between its output elements.
std::vector<Gather> Cut(const std::vector<Gather>& gs, uint64_t from, uint64_t to);
std::vector<Gather> Columns(const std::vector<Gather>& gs,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

// A parameter's slice in one TP rank.
struct Located {
  const TpRank* tr = nullptr;
  size_t g = 0;
  const Param* p = nullptr;
};
// The parameter's slice in every TP rank, in rank order. Errors: a rank lacks it.
Result<std::vector<Located>> Locate(const Checkpoint& c, const std::string& name);

// The full tensor of state `key` ("fp32" or an optimizer state) of a parameter: its shape, the
// gathers of its bytes (row-major), and a source tensor of its type.
struct FullTensor {
  std::vector<int64_t> shape;
  std::vector<Gather> gathers;
  const TorchTensor* like = nullptr;
};
Result<FullTensor> Full(const Checkpoint& c, const std::vector<Located>& slices, const Merge& m,
                        const std::string& key);

// How one group of one target file is cut: the partitioning and the partition, the fragments its
// param_slice_mappings list, its partition_count entry, and the gathers of any element range of a
// state's flat buffer ("fp32" or a state key).
struct GroupCut {
  Partitioning part{0, 1};
  uint64_t r = 0;
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> fragments;
  int64_t count = 1;
  std::function<Result<std::vector<Gather>>(const std::string& key, uint64_t from, uint64_t to)>
      range;
};

// The flat buffers of a target TP rank: per group its parameters in order, and the gathers of any
// element range of a state's buffer.
struct Target {
  const TpRank* primary = nullptr;  // whose dp rank 0 file gives every unpartitioned entry
  std::vector<std::vector<Param>> groups;
  std::vector<uint64_t> totals;
  std::function<Result<std::vector<Gather>>(size_t g, const std::string& key, uint64_t from,
                                            uint64_t to)>
      range;
  // When set, how group g of target file d is cut; `groups` then only gives the group count.
  // Unset: every group is partitioned over all D ranks (totals, groups, range).
  std::function<Result<GroupCut>(size_t g, uint32_t d)> cut;
};
// Optimizer file `d` of D of target TP rank `tp` (docs/views.md, dpD).
Result<ViewEntry> PlanOptimFile(const Checkpoint& c, const Target& target, uint32_t tp, uint32_t d,
                                uint32_t D);

// The views (docs/views.md), appended to *out.
Status PlanDp(const Checkpoint& c, uint32_t D, std::vector<ViewEntry>* out);
Status PlanUniversal(const Checkpoint& c, std::vector<ViewEntry>* out);
Status PlanUniversalZero3(const Checkpoint& c, std::vector<ViewEntry>* out);
Status PlanDpZero3(const Checkpoint& c, uint32_t D, std::vector<ViewEntry>* out);
Status PlanDpMoe(const Checkpoint& c, uint32_t D, std::vector<ViewEntry>* out);
// `latest` (the source's tag) and `files` of the tag as they are (deepspeed_dp.cc).
void PlanLatestAndCopies(const Checkpoint& c, const std::vector<DsLayerFile>& files,
                         std::vector<ViewEntry>* out);
// A model-states file with dp_world_size set to D (deepspeed_dp.cc).
Result<ViewEntry> PlanModelStates(const Checkpoint& c, const TpRank& tr, uint32_t tp, uint32_t D);
// The tensor state keys of one group, over its ranks' state mappings (null: none) and their
// files' tensors, in the order the optimizer made them ('step' apart). Errors: a state that is
// not a tensor (the universal view cannot split it per parameter).
Result<std::vector<std::string>> TensorStateKeys(
    const std::vector<std::pair<pickle::ValuePtr, const TensorIndex*>>& states);
Status PlanTpDp(const Checkpoint& c, uint32_t T, uint32_t D, std::vector<ViewEntry>* out);

}  // namespace ckptfs::reshard::ds
