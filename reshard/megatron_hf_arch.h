// The hf view's choice of a transformers architecture and its config.json (megatron_hf_arch.cc).
// Internal to reshard/megatron_hf*.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "reshard/megatron.h"
#include "reshard/megatron_hf.h"

namespace ckptfs::reshard {

// What the served model's tensors and config.json have in common: its sizes.
struct HfShape {
  int64_t layers = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  int64_t vocab = 0;  // rows the view keeps
  // Mixture of experts: experts per MoE layer, each expert's FFN size, the shared expert's (0:
  // none), and the layers without experts (mlp_only_layers).
  int64_t experts = 0, moe_ffn = 0, shared_ffn = 0;
  std::vector<int64_t> dense_layers;
};

bool HfArchHasExperts(HfArch a);
// The architecture's class and model_type ("MixtralForCausalLM", "mixtral").
const char* HfArchType(HfArch a);

Result<std::string> HfConfigJson(const MegatronModel& m, const HfShape& s, HfArch arch);

}  // namespace ckptfs::reshard
