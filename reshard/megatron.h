// Megatron-LM views: one iteration of a legacy per-rank checkpoint (every rank's
// model_optim_rng.pt) resharded for another TP x PP, file by file, as recipes over the source
// files. The rules are in docs/views.md; this is the planner that follows them.
//
// Pure: the caller parses the source files (ReadTorchFile) and hands them in; the result reads
// only the sources' byte ranges it names.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "formats/torch_file.h"
#include "reshard/rules.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {

struct MegatronRankFile {
  uint32_t tp = 0, pp = 0, ep = 0;  // ep: the expert-parallel rank (_EEE), 0 without experts
  uint32_t source = 0;  // the index Part::source uses for this file
  std::shared_ptr<const TorchFile> file;
  // The archive's records other than data.pkl and data/*: (name after the prefix, bytes), in
  // archive order. Copied into the target files.
  std::vector<std::pair<std::string, std::string>> extra_records;
  // distrib_optim.pt beside it (the distributed optimizer's state), when there is one.
  std::shared_ptr<const TorchFile> distrib;
  uint32_t distrib_source = 0;
  std::vector<std::pair<std::string, std::string>> distrib_extra_records;
};

struct MegatronSource {
  uint32_t tp = 0, pp = 0, ep = 1;
  std::vector<MegatronRankFile> ranks;  // every (tp, pp, ep), any order
};

// What a target shape needs from the model's args, checked before any file is planned.
struct MegatronModel {
  int64_t num_layers = 0, hidden_size = 0, heads = 0, query_groups = 0, ffn_hidden_size = 0;
  bool swiglu = false;
  bool tied = true;  // untie_embeddings_and_output_weights false or absent
  int64_t vocab_size = 0;  // args.vocab_size, 0 when absent
  int64_t divisible_by = 128;
  int64_t padded_vocab_size = 0;
  int64_t args_vocab_size = 0;          // args.vocab_size itself, 0 when absent or None
  bool distributed_optimizer = false;    // args.use_distributed_optimizer: distrib_optim.pt
  bool mcore = true;  // megatron.core's names (decoder.*); false: legacy (language_model.*)
  bool gqa = false;
  // Read for the hf view only (absent values stay empty; that view refuses them there).
  int64_t kv_channels = 0, max_position_embeddings = 0;
  std::string normalization, position_embedding_type;  // "RMSNorm", "rope", ...
  std::optional<double> rotary_base, norm_epsilon;
  double rotary_percent = 1.0;
  bool rotary_interleaved = false, add_bias_linear = false, add_qkv_bias = false;
  bool rope_scaling = false;
  bool norm_1p = false;          // apply_layernorm_1p / layernorm_zero_centered_gamma: gamma - 1
  bool rope_interpolation = false;  // rotary_seq_len_interpolation_factor set
  bool no_rope_layers = false;      // no_rope_freq set: layers without rotary embeddings
  bool qk_layernorm = false;        // q_layernorm / k_layernorm per head (args.qk_layernorm)
  bool qk_l2_norm = false;          // Llama-4 style L2 norm of q and k (args.qk_l2_norm)
  // Sliding-window attention (args.window_size, (left, right), -1 = unbounded): each query
  // attends to the `window_left` keys before it and itself. -1: full attention.
  int64_t window_left = -1, window_right = -1;
  bool window_skip = false;         // args.window_attn_skip_freq: some layers attend fully
  std::string tokenizer_type;
  bool torch_dist = false;  // the iteration is in the torch_dist format (ReadMegatronModel's flag)
  std::string dtype;  // of the parameters: bfloat16, float16 or float32 (args.bf16, args.fp16)
  // Mixture of experts (args.num_experts > 0): the experts' FFN size (moe_ffn_hidden_size, else
  // ffn_hidden_size), the shared experts' (0: none), and the source's expert-parallel size.
  int64_t num_experts = 0, moe_ffn_hidden_size = 0, shared_expert_size = 0;
  uint32_t source_ep = 1;
  // Read for the hf view only: the router (moe_router_topk, moe_router_pre_softmax), the shared
  // experts' sigmoid gate, whether every layer has experts (moe_layer_freq 1 or all ones), the
  // load-balancing loss coefficient, and why no Hugging Face architecture expresses the routing
  // (sigmoid scores, an expert bias, group-limited top-k, a scaling factor, token dropping; empty
  // when one does).
  int64_t moe_topk = 2;
  bool moe_pre_softmax = false, shared_expert_gate = false, moe_every_layer = true;
  bool moe_legacy_grouped = false;  // the legacy GroupedMLP (moe_use_legacy_grouped_gemm)
  double moe_aux_loss_coeff = 0.0;
  std::string router_refusal;
};

// Reads the model's description from a rank file's `args` (torch_dist: from a torch_dist
// iteration's common state). Errors (kInvalid): no args, a required field missing, a
// mixture-of-experts layout the views cannot plan bitwise (interleaved GLU halves, latent
// projections; in rank files also expert tensor parallelism other than TP, single grouped
// weights, the distributed optimizer's state, none of which changes torch_dist's global tensors).
Result<MegatronModel> ReadMegatronModel(const TorchFile& f, bool torch_dist = false);
// Whether TP=T, PP=P and EP=E (0: the source's) can hold the model; the error names the reason.
Status CheckMegatronTarget(const MegatronModel& m, uint32_t T, uint32_t P, uint32_t E = 0);
// Padded vocabulary rows for TP=T (Megatron's _vocab_size_with_padding).
int64_t PaddedVocab(const MegatronModel& m, uint32_t T);

// The target rank directory's name: mp_rank_TT, mp_rank_TT_PPP when P > 1, then _EEE (the
// expert-parallel rank e) when E > 1, as Megatron's get_checkpoint_name makes it.
std::string MegatronRankDir(uint32_t t, uint32_t p, uint32_t P, uint32_t e = 0, uint32_t E = 1);

// One model tensor of the source, whole: its shards by source TP rank and how they join.
struct MegatronTensor {
  std::string name;    // dot-joined key path under 'model', layers numbered across the stages
  int64_t layer = -1;  // that global layer number, -1 outside the layers
  Rule rule = Rule::kReplicated;
  std::string dtype;          // torch's name: "bfloat16", ...
  std::vector<Shard> shards;  // by source TP rank
  // SwiGLU's fc1 whose shards, joined, are all gate rows then all up rows (torch_dist); else
  // each shard is its rank's gate rows then its up rows.
  bool gate_up_whole = false;
  int64_t expert = -1;  // an expert's weight: its global expert number
};
struct MegatronTensors {
  MegatronModel model;
  bool legacy = false;            // language_model.* names (else megatron.core's)
  int64_t source_vocab_rows = 0;  // padded vocabulary rows of the source's embeddings
  std::vector<MegatronTensor> tensors;  // in the source's order (stage by stage)
};
// The source's model tensors; entries that are not tensors (extra state, None) are left out.
// Errors: as PlanMegatron's for the source itself.
Result<MegatronTensors> ListMegatronTensors(const MegatronSource& src, const Rules& rules);

// Plans every target file of TP=T, PP=P, EP=E (0: the source's EP): result[(p * E + e) * T + t]
// is rank (t, p, e)'s model_optim_rng.pt, CRCs pending; with the distributed optimizer
// (args.use_distributed_optimizer), (*distrib)[same] its distrib_optim.pt. Errors (kInvalid,
// naming the parameter or the reason): see docs/views.md.
Result<std::vector<ViewFile>> PlanMegatron(const MegatronSource& src, uint32_t T, uint32_t P,
                                           const Rules& rules,
                                           std::vector<ViewFile>* distrib = nullptr,
                                           uint32_t E = 0);

}  // namespace ckptfs::reshard
