// The model's description in a Megatron-LM rank file's `args`, and what it allows.
#include <cstdio>

#include "reshard/megatron.h"
#include "reshard/megatron_args.h"
#include "reshard/torch_out.h"

namespace ckptfs::reshard {

using pickle::Kind;
using pickle::ValuePtr;

ValuePtr ArgsDict(const ValuePtr& args) {
  if (!args) return nullptr;
  if (args->kind == Kind::kObject && args->state && args->state->kind == Kind::kDict) {
    return args->state;
  }
  if (args->kind == Kind::kDict) return args;
  return nullptr;
}

std::optional<int64_t> IntArg(const ValuePtr& d, std::string_view key) {
  ValuePtr v = Get(d, key);
  if (v && v->kind == Kind::kInt) return v->i;
  return std::nullopt;
}

std::optional<double> NumberArg(const ValuePtr& d, std::string_view key) {
  ValuePtr v = Get(d, key);
  if (v && v->kind == Kind::kFloat) return v->f;
  if (v && v->kind == Kind::kInt) return static_cast<double>(v->i);
  return std::nullopt;
}

std::optional<std::string> StrArg(const ValuePtr& d, std::string_view key) {
  ValuePtr v = Get(d, key);
  if (v && v->kind == Kind::kStr) return v->str;
  return std::nullopt;
}

bool BoolArg(const ValuePtr& d, std::string_view key) {
  ValuePtr v = Get(d, key);
  return v && ((v->kind == Kind::kBool && v->b) || (v->kind == Kind::kInt && v->i != 0));
}

bool SetArg(const ValuePtr& d, std::string_view key, ValuePtr value) {
  for (auto& [k, v] : PairsOf(*d)) {
    if (k && k->kind == Kind::kStr && k->str == key) {
      v = std::move(value);
      return true;
    }
  }
  return false;
}

namespace {

// The router's and the layers' MoE fields the hf view needs (transformer_config.py; the routing
// itself in moe_utils.py topk_softmax_with_capacity): softmax scores over the top k logits
// (pre_softmax false) or the top k of a softmax over all experts (true), and what else changes
// the function a Hugging Face MoE block computes.
void ReadRouterArgs(const ValuePtr& d, MegatronModel* m) {
  m->moe_topk = IntArg(d, "moe_router_topk").value_or(2);
  m->moe_pre_softmax = BoolArg(d, "moe_router_pre_softmax");
  m->shared_expert_gate = BoolArg(d, "moe_shared_expert_gate");
  m->moe_legacy_grouped =
      BoolArg(d, "moe_grouped_gemm") && BoolArg(d, "moe_use_legacy_grouped_gemm");
  m->moe_aux_loss_coeff = NumberArg(d, "moe_aux_loss_coeff").value_or(0.0);
  if (ValuePtr f = Get(d, "moe_layer_freq"); f && f->kind == Kind::kInt) {
    m->moe_every_layer = f->i == 1;
  } else if (f && (f->kind == Kind::kList || f->kind == Kind::kTuple)) {
    for (const ValuePtr& x : f->items) {
      if (!x || x->kind != Kind::kInt || x->i != 1) m->moe_every_layer = false;
    }
  }
  std::string& why = m->router_refusal;
  const std::string score = StrArg(d, "moe_router_score_function").value_or("softmax");
  if (score != "softmax") {
    why = "args.moe_router_score_function is " + score + " (the architectures score with softmax)";
  } else if (BoolArg(d, "moe_router_enable_expert_bias")) {
    why = "args.moe_router_enable_expert_bias: an expert bias takes part in the selection";
  } else if (IntArg(d, "moe_router_num_groups").value_or(0) > 0 ||
             IntArg(d, "moe_router_group_topk").value_or(0) > 0 ||
             IntArg(d, "moe_router_topk_limited_devices").value_or(0) > 0) {
    why = "args.moe_router_num_groups: group-limited top-k routing";
  } else if (auto s = NumberArg(d, "moe_router_topk_scaling_factor"); s && *s != 1.0) {
    why = "args.moe_router_topk_scaling_factor scales the routing weights";
  } else if (NumberArg(d, "moe_expert_capacity_factor")) {
    why = "args.moe_expert_capacity_factor drops tokens over an expert's capacity";
  } else if (StrArg(d, "moe_router_load_balancing_type").value_or("") == "sinkhorn") {
    why = "args.moe_router_load_balancing_type is sinkhorn (its router leaves the top-k weights "
          "unnormalised, or takes a sigmoid for top-1)";
  } else if (BoolArg(d, "moe_router_force_load_balancing")) {
    why = "args.moe_router_force_load_balancing routes tokens at random";
  } else if (BoolArg(d, "moe_apply_probs_on_input")) {
    why = "args.moe_apply_probs_on_input weighs the experts' inputs, not their outputs";
  } else if (m->moe_topk <= 0 || m->moe_topk > m->num_experts) {
    why = "args.moe_router_topk " + std::to_string(m->moe_topk) + " is not between 1 and " +
          std::to_string(m->num_experts);
  }
}

// The mixture-of-experts fields of args (megatron.core's transformer_config.py), and the layouts
// a view refuses because it cannot reproduce them bitwise.
Status ReadMoeArgs(const ValuePtr& d, MegatronModel* m) {
  m->num_experts = IntArg(d, "num_experts").value_or(0);
  if (m->num_experts <= 0) {
    m->num_experts = 0;
    return Status::Ok();
  }
  m->moe_ffn_hidden_size = IntArg(d, "moe_ffn_hidden_size").value_or(m->ffn_hidden_size);
  m->shared_expert_size = IntArg(d, "moe_shared_expert_intermediate_size").value_or(0);
  const int64_t tp = IntArg(d, "tensor_model_parallel_size").value_or(1);
  const int64_t ep = IntArg(d, "expert_model_parallel_size").value_or(1);
  if (ep <= 0 || m->num_experts % ep != 0) {
    return Invalid("args.expert_model_parallel_size " + std::to_string(ep) +
                   " does not divide num_experts " + std::to_string(m->num_experts));
  }
  m->source_ep = static_cast<uint32_t>(ep);
  ReadRouterArgs(d, m);
  // Expert tensor parallelism other than TP: the rank files are then not a TP x PP x EP grid
  // (Megatron's torch format has no handling for it). torch_dist holds every expert at its
  // global shape whatever the expert TP was: it only cuts the chunks.
  if (auto etp = IntArg(d, "expert_tensor_parallel_size"); etp && *etp != tp && !m->torch_dist) {
    return Invalid("expert_tensor_parallel_size " + std::to_string(*etp) +
                   " differs from tensor_model_parallel_size " + std::to_string(tp) +
                   ": such rank files are not a TP x PP x EP grid, and are not resharded");
  }
  for (const char* key : {"moe_mlp_glu_interleave_size", "moe_shared_expert_glu_interleave_size"}) {
    if (ValuePtr v = Get(d, key);
        v && v->kind != Kind::kNone && !(v->kind == Kind::kInt && v->i == 0)) {
      return Invalid(std::string("args.") + key +
                     " is set: fc1's gate and up rows are interleaved in blocks, a layout the "
                     "views do not reshard");
    }
  }
  // torch_dist splits a single grouped weight per expert when it saves (TEGroupedLinear's
  // sharded state dict), so its experts are stored as any others.
  if ((BoolArg(d, "moe_single_grouped_weight") || BoolArg(d, "moe_single_grouped_bias")) &&
      !m->torch_dist) {
    return Invalid(
        "args.moe_single_grouped_weight: experts stored as one stacked tensor are not "
        "resharded");
  }
  if (ValuePtr v = Get(d, "moe_latent_size"); v && v->kind == Kind::kInt && v->i > 0) {
    return Invalid("args.moe_latent_size: MoE latent projections are not resharded");
  }
  if (!m->mcore)
    return Invalid("mixture-of-experts legacy models (language_model.*) are not supported");
  return Status::Ok();
}

}  // namespace

Result<MegatronModel> ReadMegatronModel(const TorchFile& f, bool torch_dist) {
  ValuePtr d = ArgsDict(Get(f.root, "args"));
  if (!d) return Invalid("the checkpoint has no 'args' (an argparse.Namespace)");
  MegatronModel m;
  m.torch_dist = torch_dist;
  auto need = [&](std::string_view key, int64_t* out) -> Status {
    auto v = IntArg(d, key);
    if (!v || *v <= 0) return Invalid("args." + std::string(key) + " is missing");
    *out = *v;
    return Status::Ok();
  };
  RETURN_IF_ERROR(need("num_layers", &m.num_layers));
  RETURN_IF_ERROR(need("hidden_size", &m.hidden_size));
  RETURN_IF_ERROR(need("num_attention_heads", &m.heads));
  m.gqa = BoolArg(d, "group_query_attention");
  m.query_groups = m.heads;
  if (m.gqa) RETURN_IF_ERROR(need("num_query_groups", &m.query_groups));
  m.ffn_hidden_size = IntArg(d, "ffn_hidden_size").value_or(4 * m.hidden_size);
  m.swiglu = BoolArg(d, "swiglu");
  m.tied = !BoolArg(d, "untie_embeddings_and_output_weights");
  m.vocab_size = IntArg(d, "vocab_size").value_or(0);
  m.divisible_by = IntArg(d, "make_vocab_size_divisible_by").value_or(128);
  if (m.divisible_by <= 0) return Invalid("args.make_vocab_size_divisible_by is not positive");
  m.padded_vocab_size = IntArg(d, "padded_vocab_size").value_or(0);
  m.args_vocab_size = m.vocab_size;
  if (m.vocab_size == 0) m.vocab_size = m.padded_vocab_size;
  // What a Hugging Face config needs (the hf view checks them; other views do not).
  m.kv_channels = IntArg(d, "kv_channels").value_or(0);
  m.max_position_embeddings = IntArg(d, "max_position_embeddings").value_or(0);
  m.normalization = StrArg(d, "normalization").value_or("LayerNorm");
  m.position_embedding_type = StrArg(d, "position_embedding_type").value_or("");
  if (m.position_embedding_type.empty()) {
    m.position_embedding_type =
        BoolArg(d, "use_rotary_position_embeddings") ? "rope" : "learned_absolute";
  }
  m.rotary_base = NumberArg(d, "rotary_base");
  m.rotary_percent = NumberArg(d, "rotary_percent").value_or(1.0);
  m.rotary_interleaved = BoolArg(d, "rotary_interleaved");
  m.norm_epsilon = NumberArg(d, "norm_epsilon");
  if (!m.norm_epsilon) m.norm_epsilon = NumberArg(d, "layernorm_epsilon");
  m.add_bias_linear = BoolArg(d, "add_bias_linear");
  m.add_qkv_bias = BoolArg(d, "add_qkv_bias");
  m.dtype = BoolArg(d, "bf16") ? "bfloat16" : BoolArg(d, "fp16") ? "float16" : "float32";
  m.rope_scaling = BoolArg(d, "use_rope_scaling");
  m.norm_1p = BoolArg(d, "apply_layernorm_1p") || BoolArg(d, "layernorm_zero_centered_gamma");
  m.rope_interpolation = NumberArg(d, "rotary_seq_len_interpolation_factor").has_value();
  if (ValuePtr v = Get(d, "no_rope_freq"); v && v->kind != Kind::kNone) m.no_rope_layers = true;
  m.tokenizer_type = StrArg(d, "tokenizer_type").value_or("");
  m.qk_layernorm = BoolArg(d, "qk_layernorm");
  m.qk_l2_norm = BoolArg(d, "qk_l2_norm");
  if (ValuePtr w = Get(d, "window_size"); w && w->kind != Kind::kNone) {
    if ((w->kind != Kind::kTuple && w->kind != Kind::kList) || w->items.size() != 2 ||
        w->items[0]->kind != Kind::kInt || w->items[1]->kind != Kind::kInt) {
      return Invalid("args.window_size is not a (left, right) pair of integers");
    }
    m.window_left = w->items[0]->i;
    m.window_right = w->items[1]->i;
  }
  if (ValuePtr v = Get(d, "window_attn_skip_freq"); v && v->kind != Kind::kNone) m.window_skip = true;
  m.distributed_optimizer = BoolArg(d, "use_distributed_optimizer");
  // The naming era, from the model's own keys: legacy models nest everything under
  // 'language_model'. (args cannot tell: Megatron dropped use_legacy_models in 2026, and older
  // legacy runs predate use_mcore_models.) A file without 'model' (torch_dist's common.pt) is
  // megatron.core's.
  if (ValuePtr model = Get(f.root, "model"); model && IsMapping(model)) {
    m.mcore = !Get(model, "language_model");
  }
  for (const char* uneven : {"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                             "num_layers_per_virtual_pipeline_stage"}) {
    if (IntArg(d, uneven)) return Invalid(std::string("args.") + uneven + " is not supported");
  }
  if (BoolArg(d, "account_for_embedding_in_pipeline_split") ||
      BoolArg(d, "account_for_loss_in_pipeline_split")) {
    return Invalid("uneven pipeline splits are not supported");
  }
  RETURN_IF_ERROR(ReadMoeArgs(d, &m));
  return m;
}

Status CheckMegatronTarget(const MegatronModel& m, uint32_t T, uint32_t P, uint32_t E) {
  if (T == 0 || P == 0) return Invalid("TP and PP must be at least 1");
  if (E > 0 && m.num_experts == 0) {
    return Invalid("EP " + std::to_string(E) + ": the model has no experts (args.num_experts)");
  }
  if (m.num_experts > 0) {
    const uint32_t e = E ? E : m.source_ep;
    if (m.num_experts % e) {
      return Invalid("EP " + std::to_string(e) + " does not divide num_experts " +
                     std::to_string(m.num_experts));
    }
    if (m.moe_ffn_hidden_size % T) {
      return Invalid("TP " + std::to_string(T) +
                     " (the experts' tensor parallelism) does not "
                     "divide moe_ffn_hidden_size " +
                     std::to_string(m.moe_ffn_hidden_size));
    }
    if (m.shared_expert_size % T) {
      return Invalid("TP " + std::to_string(T) +
                     " does not divide "
                     "moe_shared_expert_intermediate_size " +
                     std::to_string(m.shared_expert_size));
    }
  }
  if (m.distributed_optimizer && !m.mcore) {
    return Invalid("the distributed optimizer's state (distrib_optim.pt) of a legacy model "
                   "(language_model.*) is not resharded");
  }
  auto why = [&](const std::string& what, int64_t n, const char* axis, uint32_t x) {
    return Invalid(std::string(axis) + " " + std::to_string(x) + " does not divide " + what + " " +
                   std::to_string(n));
  };
  if (m.heads % T) return why("num_attention_heads", m.heads, "TP", T);
  if (m.query_groups % T != 0) {
    // megatron.core (transformer_config.py) also takes TP a multiple of the query groups: each
    // rank then holds a plain dim-0 chunk of the fused QKV, part of one group's rows.
    const int64_t head_dim = m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.heads;
    const int64_t qkv_rows = (m.heads + 2 * m.query_groups) * head_dim;
    if (!m.mcore || T % m.query_groups != 0) {
      return Invalid("TP " + std::to_string(T) + " does not divide " +
                     (m.gqa ? "num_query_groups " : "the heads ") +
                     std::to_string(m.query_groups) +
                     (m.mcore ? " and is not a multiple of it" : " (legacy models need that)"));
    }
    if (qkv_rows % T != 0) return why("the fused QKV's rows", qkv_rows, "TP", T);
  }
  if (m.ffn_hidden_size % T) return why("ffn_hidden_size", m.ffn_hidden_size, "TP", T);
  if (m.num_layers % P) return why("num_layers", m.num_layers, "PP", P);
  return Status::Ok();
}

int64_t PaddedVocab(const MegatronModel& m, uint32_t T) {
  const int64_t v = m.vocab_size ? m.vocab_size : m.padded_vocab_size;
  const int64_t mult = m.divisible_by * T;
  return (v + mult - 1) / mult * mult;
}

std::string MegatronRankDir(uint32_t t, uint32_t p, uint32_t P, uint32_t e, uint32_t E) {
  char buf[48];
  if (P == 1) {
    std::snprintf(buf, sizeof buf, "mp_rank_%02u", t);
  } else {
    std::snprintf(buf, sizeof buf, "mp_rank_%02u_%03u", t, p);
  }
  std::string s = buf;
  if (E > 1) {
    std::snprintf(buf, sizeof buf, "_%03u", e);
    s += buf;
  }
  return s;
}

}  // namespace ckptfs::reshard
