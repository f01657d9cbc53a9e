// The Hugging Face view of a Megatron-LM GPT checkpoint (ROOT/.views/hf/): the files
// `transformers.AutoModelForCausalLM.from_pretrained` loads as a LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, or with experts a MixtralForCausalLM,
// Qwen3MoeForCausalLM or Qwen2MoeForCausalLM, as recipes over the source's rank files like every
// view. The mapping is in docs/views.md.
//
// Pure: the caller parses the rank files (as for PlanMegatron) and hands them in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "reshard/megatron.h"
#include "reshard/rules.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

struct HfOptions {
  // A shard holds tensors up to this many bytes (one larger tensor gets a shard of its own),
  // as save_pretrained's max_shard_size ("5GB") does.
  uint64_t max_shard_bytes = 5'000'000'000;
};

// The transformers architectures the hf view serves, chosen from the checkpoint's args by the
// rules in docs/views.md ("Which architecture").
enum class HfArch { kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen2Moe, kQwen3Moe };

// The architecture the model (from the checkpoint's args) is served as; the error names why no
// architecture expresses it.
Result<HfArch> PickHfArch(const MegatronModel& m);
Status CheckMegatronHf(const MegatronModel& m);
const char* HfArchName(HfArch a);  // "LlamaForCausalLM", ...

// config.json, model-0000K-of-0000N.safetensors (N >= 1) and model.safetensors.index.json, in
// that order. Errors (kInvalid, naming the reason): a model no served architecture expresses
// (LayerNorm, learned positions, no SwiGLU, biases on every linear layer, a sigmoid router, ...),
// the legacy GroupedMLP's transposed experts, an args field the
// config needs missing, a tensor no HF name maps, one missing.
Result<std::vector<ViewEntry>> PlanMegatronHf(const MegatronSource& src, const Rules& rules,
                                              const HfOptions& options = {});
// The same from the model's tensors however they were read (ListMegatronTensors for per-rank
// files, ListTorchDistTensors for torch_dist).
Result<std::vector<ViewEntry>> PlanMegatronHf(MegatronTensors tensors, const HfOptions& options);

}  // namespace ckptfs::reshard
