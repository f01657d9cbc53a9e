// Which transformers architecture the hf view serves a Megatron model as, and its config.json.
// The rules are docs/views.md's "Which architecture"; the routing facts are megatron.core's
// moe_utils.py topk_softmax_with_capacity and transformers' Mixtral, Qwen2-MoE and Qwen3-MoE
// sparse blocks (softmax over the experts, top k, renormalised when norm_topk_prob).
#include "reshard/megatron_hf_arch.h"

#include "formats/json.h"

namespace ckptfs::reshard {
namespace {

struct ArchName {
  const char* cls;
  const char* type;
};
constexpr ArchName kArchNames[] = {{"LlamaForCausalLM", "llama"},
                                   {"MistralForCausalLM", "mistral"},
                                   {"Qwen2ForCausalLM", "qwen2"},
                                   {"Qwen3ForCausalLM", "qwen3"},
                                   {"MixtralForCausalLM", "mixtral"},
                                   {"Qwen2MoeForCausalLM", "qwen2_moe"},
                                   {"Qwen3MoeForCausalLM", "qwen3_moe"}};
const ArchName& NameOf(HfArch a) { return kArchNames[static_cast<int>(a)]; }

Status No(const std::string& why) {
  return Invalid("no Hugging Face architecture the hf view serves (LlamaForCausalLM, "
                 "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
                 "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM) expresses this model: " + why);
}

// A model with experts: the router first, then what tells the three MoE architectures apart.
Result<HfArch> PickMoeArch(const MegatronModel& m, bool windowed) {
  if (!m.router_refusal.empty()) return No(m.router_refusal);
  // Rank files only: torch_dist stores GroupedMLP's experts as SequentialMLP's. Older rank
  // files without the flag are refused when planned.
  if (m.moe_legacy_grouped && !m.torch_dist) {
    return No("args.moe_use_legacy_grouped_gemm: the legacy GroupedMLP stores every expert's "
              "weights transposed in one tensor, which this view does not transpose");
  }
  if (m.shared_expert_size > 0) {  // Qwen2-MoE: one shared expert behind a sigmoid gate
    if (!m.shared_expert_gate) {
      return No("shared experts without args.moe_shared_expert_gate (Qwen2MoeForCausalLM's "
                "shared expert has a sigmoid gate)");
    }
    if (m.qk_layernorm) return No("shared experts with per-head q/k norms");
    if (!m.add_qkv_bias) {
      return No("shared experts without QKV biases (Qwen2MoeForCausalLM's q, k and v have "
                "biases)");
    }
    if (windowed) return No("a sliding window with shared experts");
    if (m.kv_channels > 0 && m.kv_channels * m.heads != m.hidden_size) {
      return No("kv_channels " + std::to_string(m.kv_channels) +
                " != hidden_size / heads (Qwen2MoeForCausalLM's head size is hidden_size / "
                "heads)");
    }
    return HfArch::kQwen2Moe;
  }
  if (m.qk_layernorm) {
    if (m.add_qkv_bias) return No("experts with QKV biases and per-head q/k norms");
    if (windowed) return No("a sliding window with per-head q/k norms");
    return HfArch::kQwen3Moe;
  }
  if (m.add_qkv_bias) {
    return No("experts with QKV biases but no gated shared expert (Qwen2MoeForCausalLM has one)");
  }
  if (m.moe_pre_softmax) {
    return No("args.moe_router_pre_softmax leaves the top-k weights unnormalised, and "
              "MixtralForCausalLM renormalises them (Qwen3MoeForCausalLM can leave them, with "
              "per-head q/k norms)");
  }
  if (!m.moe_every_layer) {
    return No("args.moe_layer_freq leaves layers without experts, and MixtralForCausalLM has "
              "experts in every layer");
  }
  return HfArch::kMixtral;
}

}  // namespace

bool HfArchHasExperts(HfArch a) {
  return a == HfArch::kMixtral || a == HfArch::kQwen2Moe || a == HfArch::kQwen3Moe;
}

const char* HfArchName(HfArch a) { return NameOf(a).cls; }
const char* HfArchType(HfArch a) { return NameOf(a).type; }

Result<HfArch> PickHfArch(const MegatronModel& m) {
  if (m.normalization != "RMSNorm") return No("args.normalization is " + m.normalization);
  if (m.position_embedding_type != "rope") {
    return No("positions are " + m.position_embedding_type + ", not rope");
  }
  if (!m.swiglu) return No("args.swiglu is not set");
  if (m.add_bias_linear) return No("args.add_bias_linear is set: every linear layer has a bias");
  if (m.rotary_percent != 1.0) return No("args.rotary_percent is not 1");
  if (m.rotary_interleaved) return No("args.rotary_interleaved is set");
  if (m.rope_scaling) return Invalid("args.use_rope_scaling is set: its scaling is not mapped");
  if (m.rope_interpolation) {
    return Invalid("args.rotary_seq_len_interpolation_factor is set: its scaling is not mapped");
  }
  if (m.no_rope_layers) return No("args.no_rope_freq leaves layers without rotary embeddings");
  if (m.norm_1p) {
    return No("args.apply_layernorm_1p or layernorm_zero_centered_gamma stores norm weights "
              "as gamma - 1");
  }
  if (m.qk_l2_norm) return No("args.qk_l2_norm is set (an L2 norm of queries and keys)");
  if (!m.rotary_base) return Invalid("args.rotary_base is missing");
  if (!m.norm_epsilon) return Invalid("args.norm_epsilon is missing");
  if (m.max_position_embeddings <= 0) return Invalid("args.max_position_embeddings is missing");
  // Sliding windows: a query attends to window_left keys before it and itself (Transformer
  // Engine's (left, right)); Mistral's sliding_window counts the query's own key too.
  const bool windowed = m.window_left >= 0;
  if (windowed && m.window_right > 0) return No("args.window_size looks ahead (right > 0)");
  if (windowed && m.window_skip) {
    return No("args.window_attn_skip_freq mixes full and sliding-window layers");
  }
  if (m.num_experts > 0) return PickMoeArch(m, windowed);
  if (m.qk_layernorm) {
    if (m.add_qkv_bias) {
      return No("QKV biases with per-head q/k norms (Qwen3's attention_bias would put a bias on "
                "o_proj as well)");
    }
    if (windowed) return No("a sliding window with per-head q/k norms");
    return HfArch::kQwen3;
  }
  if (m.add_qkv_bias) {
    if (windowed) return No("a sliding window with QKV biases");
    if (m.kv_channels > 0 && m.kv_channels * m.heads != m.hidden_size) {
      return No("QKV biases with kv_channels " + std::to_string(m.kv_channels) +
                " != hidden_size / heads (Qwen2's head size is hidden_size / heads)");
    }
    return HfArch::kQwen2;
  }
  return windowed ? HfArch::kMistral : HfArch::kLlama;
}

Status CheckMegatronHf(const MegatronModel& m) { return PickHfArch(m).status(); }

Result<std::string> HfConfigJson(const MegatronModel& m, const HfShape& s, HfArch arch) {
  using json::Value;
  json::Object o;
  auto put = [&](const char* k, Value v) { o.push_back({k, std::move(v)}); };
  const bool moe = HfArchHasExperts(arch);
  put("architectures", Value::MakeArray({Value::String(NameOf(arch).cls)}));
  put("model_type", Value::String(NameOf(arch).type));
  put("hidden_size", Value::Int(s.hidden));
  // Mixtral's intermediate_size is each expert's; the Qwen MoE models' is their dense layers'.
  put("intermediate_size", Value::Int(arch == HfArch::kMixtral ? s.moe_ffn : s.ffn));
  put("num_hidden_layers", Value::Int(s.layers));
  put("num_attention_heads", Value::Int(s.heads));
  put("num_key_value_heads", Value::Int(s.groups));
  // Qwen2 and Qwen2-MoE: hidden / heads.
  if (arch != HfArch::kQwen2 && arch != HfArch::kQwen2Moe) put("head_dim", Value::Int(s.head_dim));
  put("hidden_act", Value::String("silu"));
  put("max_position_embeddings", Value::Int(m.max_position_embeddings));
  put("rms_norm_eps", Value::Double(*m.norm_epsilon));
  put("rope_theta", Value::Double(*m.rotary_base));
  put("rope_scaling", Value::Null());
  put("vocab_size", Value::Int(s.vocab));
  put("tie_word_embeddings", Value::Bool(m.tied));
  switch (arch) {
    case HfArch::kLlama:
      put("attention_bias", Value::Bool(false));
      put("mlp_bias", Value::Bool(false));
      break;
    case HfArch::kMistral:
      put("sliding_window", Value::Int(m.window_left + 1));
      break;
    case HfArch::kMixtral:
      put("sliding_window", m.window_left >= 0 ? Value::Int(m.window_left + 1) : Value::Null());
      put("num_local_experts", Value::Int(s.experts));
      break;
    case HfArch::kQwen3:
    case HfArch::kQwen3Moe:
      put("attention_bias", Value::Bool(false));
      [[fallthrough]];
    case HfArch::kQwen2:  // its q, k and v biases are not an option: always there
    case HfArch::kQwen2Moe:
      put("use_sliding_window", Value::Bool(false));
      put("sliding_window", Value::Null());
      put("max_window_layers", Value::Int(s.layers));
      break;
  }
  if (moe) {
    put("num_experts_per_tok", Value::Int(m.moe_topk));
    put("output_router_logits", Value::Bool(false));
    put("router_aux_loss_coef", Value::Double(m.moe_aux_loss_coeff));
  }
  if (arch == HfArch::kMixtral) put("router_jitter_noise", Value::Double(0.0));
  if (arch == HfArch::kQwen2Moe || arch == HfArch::kQwen3Moe) {
    put("num_experts", Value::Int(s.experts));
    put("moe_intermediate_size", Value::Int(s.moe_ffn));
    // Megatron's pre_softmax false takes the softmax over the top k logits: renormalised.
    put("norm_topk_prob", Value::Bool(!m.moe_pre_softmax));
    put("decoder_sparse_step", Value::Int(1));
    json::Array dense;
    for (int64_t l : s.dense_layers) dense.push_back(Value::Int(l));
    put("mlp_only_layers", Value::MakeArray(std::move(dense)));
  }
  if (arch == HfArch::kQwen2Moe) {
    put("shared_expert_intermediate_size", Value::Int(s.shared_ffn));
    put("qkv_bias", Value::Bool(true));
  }
  put("torch_dtype", Value::String(m.dtype));
  put("initializer_range", Value::Double(0.02));
  put("use_cache", Value::Bool(true));
  return json::Write(Value::MakeObject(std::move(o)));
}

}  // namespace ckptfs::reshard
