// Megatron-LM's distributed optimizer in the legacy checkpoint format: the distrib_optim.pt that
// DP rank 0 of every TP x PP rank writes beside model_optim_rng.pt (with experts at EP > 1, one
// state per sub-optimizer), holding the fp32 main
// parameters and the optimizer's per-parameter state of the rank's model chunk as flat tensors
// in the layout of Megatron's parameter buffer (docs/views.md, "The distributed optimizer").
// Internal to reshard/megatron*.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "reshard/torch_out.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

// One source distrib_optim.pt, decoded: {'buckets_coalesced': True, 0: {(param dtype, grad
// dtype): {'param': fp32[N], <state key>: fp32[N] ..., 'numel_unpadded': N}}}.
struct DistOptSource {
  uint32_t source = 0;  // Part::source of the file
  const TorchFile* file = nullptr;
  TensorIndex tensors;
  pickle::ValuePtr dtype_key;  // (param dtype, grad dtype), copied into the target
  std::vector<std::pair<std::string, const TorchTensor*>> states;  // 'param' first, file order
  int64_t numel_unpadded = 0;
};
// The states of a distrib_optim.pt: one dict, or (megatron.core's ChainedOptimizer of a dense
// and an experts' optimizer, mixture of experts at EP > 1) a list of one entry per sub-optimizer,
// None where this rank is not rank 0 of that optimizer's data-parallel group. `list` tells which.
struct DistOptStates {
  bool list = false;
  std::vector<std::optional<DistOptSource>> subs;
};
// Errors (kInvalid, naming `where`): another layout (per-bucket lists from before 2024, several
// buffers: several dtypes, fp8), tensors that are not flat fp32 of N elements.
Result<DistOptStates> ReadDistOpt(const TorchFile& f, uint32_t source, const std::string& where);

// A parameter of a model chunk, in registration order (model.parameters()).
struct DistOptParam {
  int64_t numel = 0;
  bool shared_embedding = false;  // tied embeddings with PP > 1: a bucket of its own
};
struct DistOptLayout {
  std::vector<int64_t> offset;  // per parameter: its first element in the flat tensors
  int64_t numel_unpadded = 0;   // the flat tensors' length
  size_t buckets = 0;
};
// Megatron's buffer layout (_compute_per_buffer_param_layout) with the padding to the DP size
// stripped, as distrib_optim.pt holds it: independent of the DP size.
DistOptLayout LayoutDistOpt(const std::vector<DistOptParam>& params,
                            std::optional<int64_t> bucket_size);

// The bucket size of pipeline stage `pp`'s model chunk of `params` (nullopt: one bucket), from
// the args of the run (Megatron's resolve_ddp_bucket_size). Where every parameter is a multiple
// of 64 elements, nullopt without looking: where buckets close then moves no offset (the usual
// case: hidden sizes are multiples of 64). Errors (kInvalid): args without a setting the size
// depends on.
Result<std::optional<int64_t>> DistOptBucketSize(const std::vector<DistOptParam>& params,
                                                 const pickle::ValuePtr& args, uint32_t pp);

// One sub-optimizer's state in a target distrib_optim.pt: shaped like `like` (nullptr: None),
// every state's flat tensor made of each parameter's gathers (gathers[state][param],
// registration order) at `layout`'s offsets, zeros between them.
struct DistOptPlan {
  const DistOptSource* like = nullptr;
  DistOptLayout layout;
  std::vector<int64_t> numels;
  std::vector<std::vector<std::vector<Gather>>> gathers;
};
// The target's distrib_optim.pt: the one state (list false), or the list of them. `prefix` is the
// archive's record prefix.
Result<ViewFile> WriteDistOpt(const std::string& prefix, const std::vector<DistOptPlan>& subs,
                              bool list,
                              const std::vector<std::pair<std::string, std::string>>& extra_records);

}  // namespace ckptfs::reshard
