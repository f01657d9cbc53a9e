#include "reshard/megatron_hf.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "formats/describe.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"

namespace ckptfs::reshard {
namespace {

// One tensor of the HF model: its name, dtype, shape and the gathers that make its bytes.
struct HfTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<Gather> gathers;
};

// What a Megatron tensor is in a decoder layer or around the layers. The layer roles run from
// kInNorm to kKNorm; the first six are in every architecture's layers.
enum class Role {
  kEmbed, kInNorm, kQkv, kProj, kMlpNorm, kFc1, kFc2, kQkvBias, kQNorm, kKNorm, kFinalNorm,
  kOutput, kSkip,
};
constexpr int kNumLayerRoles = 9;
constexpr const char* kLayerRoles[kNumLayerRoles] = {
    "input norm", "fused QKV", "attention output", "MLP norm", "fc1 (gate and up)", "fc2",
    "fused QKV bias", "query norm", "key norm"};

struct ArchName {
  const char* cls;
  const char* type;
};
constexpr ArchName kArchNames[] = {{"LlamaForCausalLM", "llama"},
                                   {"MistralForCausalLM", "mistral"},
                                   {"Qwen2ForCausalLM", "qwen2"},
                                   {"Qwen3ForCausalLM", "qwen3"}};
const ArchName& NameOf(HfArch a) { return kArchNames[static_cast<int>(a)]; }

// Whether layers of architecture `a` hold a tensor of layer role k (0 = kInNorm).
bool ArchHas(HfArch a, int k) {
  switch (static_cast<Role>(k + static_cast<int>(Role::kInNorm))) {
    case Role::kQkvBias: return a == HfArch::kQwen2;
    case Role::kQNorm:
    case Role::kKNorm: return a == HfArch::kQwen3;
    default: return true;
  }
}

bool EndsWith(std::string_view s, std::string_view x) {
  return s.size() >= x.size() && s.substr(s.size() - x.size()) == x;
}

// The role of `name` (a layer's tensor when layer >= 0), both naming eras and both layer specs
// (Transformer Engine's fused norms, megatron.core's local modules), in a model served as `arch`.
// Errors name the tensor.
Result<Role> RoleOf(const std::string& name, int64_t layer, bool tied, HfArch arch) {
  const bool qkv_bias = EndsWith(name, ".self_attention.linear_qkv.bias") ||
                        EndsWith(name, ".self_attention.query_key_value.bias");
  if ((EndsWith(name, ".bias") || EndsWith(name, ".layer_norm_bias")) &&
      !(qkv_bias && arch == HfArch::kQwen2 && layer >= 0)) {
    return Invalid("'" + name + "' is a bias, which " + NameOf(arch).cls + " does not have there");
  }
  // Transformer Engine's extra state (an empty uint8 tensor without fp8): not a weight.
  if (EndsWith(name, "._extra_state")) return Role::kSkip;
  if (layer < 0) {
    if (EndsWith(name, "word_embeddings_for_head.weight")) return Role::kSkip;  // tied copy
    if (EndsWith(name, "word_embeddings.weight")) return Role::kEmbed;
    if (EndsWith(name, "final_layernorm.weight") || EndsWith(name, "final_norm.weight")) {
      return Role::kFinalNorm;
    }
    if (EndsWith(name, "output_layer.weight")) return tied ? Role::kSkip : Role::kOutput;
    if (EndsWith(name, "rotary_pos_emb.inv_freq")) return Role::kSkip;
    return Invalid("no Hugging Face name for '" + name + "'");
  }
  const std::string key = "layers." + std::to_string(layer) + ".";
  const size_t at = name.find(key);
  if (at == std::string::npos) return Invalid("'" + name + "': no layer number in the name");
  const std::string_view rest = std::string_view(name).substr(at + key.size());
  static const std::pair<std::string_view, Role> kNames[] = {
      {"input_layernorm.weight", Role::kInNorm},
      {"input_norm.weight", Role::kInNorm},
      {"self_attention.linear_qkv.layer_norm_weight", Role::kInNorm},
      {"self_attention.linear_qkv.weight", Role::kQkv},
      {"self_attention.query_key_value.weight", Role::kQkv},
      {"self_attention.linear_proj.weight", Role::kProj},
      {"self_attention.dense.weight", Role::kProj},
      {"pre_mlp_layernorm.weight", Role::kMlpNorm},
      {"post_attention_layernorm.weight", Role::kMlpNorm},
      {"post_attention_norm.weight", Role::kMlpNorm},
      {"mlp.linear_fc1.layer_norm_weight", Role::kMlpNorm},
      {"mlp.linear_fc1.weight", Role::kFc1},
      {"mlp.dense_h_to_4h.weight", Role::kFc1},
      {"mlp.linear_fc2.weight", Role::kFc2},
      {"mlp.dense_4h_to_h.weight", Role::kFc2},
      {"self_attention.linear_qkv.bias", Role::kQkvBias},
      {"self_attention.query_key_value.bias", Role::kQkvBias},
      {"self_attention.q_layernorm.weight", Role::kQNorm},
      {"self_attention.k_layernorm.weight", Role::kKNorm},
  };
  for (const auto& [suffix, role] : kNames) {
    if (rest != suffix) continue;
    const int k = static_cast<int>(role) - static_cast<int>(Role::kInNorm);
    if (!ArchHas(arch, k)) {
      return Invalid("'" + name + "' is a " + kLayerRoles[k] + ", which " + NameOf(arch).cls +
                     " does not have");
    }
    return role;
  }
  return Invalid("no Hugging Face name for '" + name + "'");
}

// The model's config checks and config.json.
struct Shape {
  int64_t layers = 0, hidden = 0, heads = 0, groups = 0, head_dim = 0, ffn = 0;
  int64_t vocab = 0;  // rows the view keeps
};

}  // namespace

Result<HfArch> PickHfArch(const MegatronModel& m) {
  auto no = [](const std::string& why) {
    return Invalid("no Hugging Face architecture the hf view serves (LlamaForCausalLM, "
                   "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM) expresses this "
                   "model: " + why);
  };
  if (m.num_experts > 0) return no("it has experts (args.num_experts)");
  if (m.normalization != "RMSNorm") return no("args.normalization is " + m.normalization);
  if (m.position_embedding_type != "rope") {
    return no("positions are " + m.position_embedding_type + ", not rope");
  }
  if (!m.swiglu) return no("args.swiglu is not set");
  if (m.add_bias_linear) return no("args.add_bias_linear is set: every linear layer has a bias");
  if (m.rotary_percent != 1.0) return no("args.rotary_percent is not 1");
  if (m.rotary_interleaved) return no("args.rotary_interleaved is set");
  if (m.rope_scaling) return Invalid("args.use_rope_scaling is set: its scaling is not mapped");
  if (m.rope_interpolation) {
    return Invalid("args.rotary_seq_len_interpolation_factor is set: its scaling is not mapped");
  }
  if (m.no_rope_layers) return no("args.no_rope_freq leaves layers without rotary embeddings");
  if (m.norm_1p) {
    return no("args.apply_layernorm_1p or layernorm_zero_centered_gamma stores norm weights "
              "as gamma - 1");
  }
  if (m.qk_l2_norm) return no("args.qk_l2_norm is set (an L2 norm of queries and keys)");
  if (!m.rotary_base) return Invalid("args.rotary_base is missing");
  if (!m.norm_epsilon) return Invalid("args.norm_epsilon is missing");
  if (m.max_position_embeddings <= 0) return Invalid("args.max_position_embeddings is missing");
  // Sliding windows: a query attends to window_left keys before it and itself (Transformer
  // Engine's (left, right)); Mistral's sliding_window counts the query's own key too.
  const bool windowed = m.window_left >= 0;
  if (windowed && m.window_right > 0) return no("args.window_size looks ahead (right > 0)");
  if (windowed && m.window_skip) {
    return no("args.window_attn_skip_freq mixes full and sliding-window layers");
  }
  if (m.qk_layernorm) {
    if (m.add_qkv_bias) {
      return no("QKV biases with per-head q/k norms (Qwen3's attention_bias would put a bias on "
                "o_proj as well)");
    }
    if (windowed) return no("a sliding window with per-head q/k norms");
    return HfArch::kQwen3;
  }
  if (m.add_qkv_bias) {
    if (windowed) return no("a sliding window with QKV biases");
    if (m.kv_channels > 0 && m.kv_channels * m.heads != m.hidden_size) {
      return no("QKV biases with kv_channels " + std::to_string(m.kv_channels) +
                " != hidden_size / heads (Qwen2's head size is hidden_size / heads)");
    }
    return HfArch::kQwen2;
  }
  return windowed ? HfArch::kMistral : HfArch::kLlama;
}

Status CheckMegatronHf(const MegatronModel& m) { return PickHfArch(m).status(); }

const char* HfArchName(HfArch a) { return NameOf(a).cls; }

namespace {

Result<std::string> ConfigJson(const MegatronModel& m, const Shape& s, HfArch arch) {
  using json::Value;
  json::Object o;
  auto put = [&](const char* k, Value v) { o.push_back({k, std::move(v)}); };
  put("architectures", Value::MakeArray({Value::String(NameOf(arch).cls)}));
  put("model_type", Value::String(NameOf(arch).type));
  put("hidden_size", Value::Int(s.hidden));
  put("intermediate_size", Value::Int(s.ffn));
  put("num_hidden_layers", Value::Int(s.layers));
  put("num_attention_heads", Value::Int(s.heads));
  put("num_key_value_heads", Value::Int(s.groups));
  if (arch != HfArch::kQwen2) put("head_dim", Value::Int(s.head_dim));  // Qwen2: hidden / heads
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
    case HfArch::kQwen3:
      put("attention_bias", Value::Bool(false));
      [[fallthrough]];
    case HfArch::kQwen2:  // its q, k and v biases are not an option: always there
      put("use_sliding_window", Value::Bool(false));
      put("sliding_window", Value::Null());
      put("max_window_layers", Value::Int(s.layers));
      break;
  }
  put("torch_dtype", Value::String(m.dtype));
  put("initializer_range", Value::Double(0.02));
  put("use_cache", Value::Bool(true));
  return json::Write(Value::MakeObject(std::move(o)));
}

uint64_t RowBytes(const Shard& s, uint32_t itemsize) {
  uint64_t n = itemsize;
  for (size_t i = 1; i < s.shape.size(); ++i) n *= static_cast<uint64_t>(s.shape[i]);
  return n;
}

// Rows [first, first + count) of every block of `block` rows of each shard, shard after shard:
// one gather per shard, one part per row of it.
std::vector<Gather> EveryBlock(const std::vector<Shard>& shards, uint32_t itemsize,
                               int64_t block, int64_t first, int64_t count) {
  std::vector<Gather> out;
  for (const Shard& s : shards) {
    const uint64_t row = RowBytes(s, itemsize);
    const uint64_t blocks = static_cast<uint64_t>(s.shape[0] / block);
    out.push_back(Gather{blocks, {Part{s.source, s.offset + static_cast<uint64_t>(first) * row,
                                       static_cast<uint64_t>(count) * row,
                                       static_cast<uint64_t>(block) * row}}});
  }
  return out;
}

class HfPlanner {
 public:
  HfPlanner(MegatronTensors src, const HfOptions& options)
      : src_(std::move(src)), options_(options) {}

  Result<std::vector<ViewEntry>> Run();

 private:
  Status Add(const MegatronTensor& t, Role role);
  Status AddWhole(const MegatronTensor& t, const std::string& name, const VocabSizes& vocab = {});
  Status AddQkv(const MegatronTensor& t, const std::string& prefix, const char* part);
  Status AddFc1(const MegatronTensor& t, const std::string& prefix);
  Result<uint32_t> Itemsize(const MegatronTensor& t) {
    const uint32_t n = DtypeSize(t.dtype);
    if (n == 0) return Invalid("'" + t.name + "' has an unknown dtype " + t.dtype);
    return n;
  }

  MegatronTensors src_;
  const HfOptions options_;
  HfArch arch_ = HfArch::kLlama;
  Shape shape_;
  std::vector<HfTensor> out_;
};

Status HfPlanner::AddWhole(const MegatronTensor& t, const std::string& name,
                           const VocabSizes& vocab) {
  ASSIGN_OR_RETURN(uint32_t itemsize, Itemsize(t));
  HfTensor h{name, t.dtype, {}, {}};
  RETURN_IF_ERROR(PlanShard(t.name, t.rule, t.shards, itemsize, 0, 1, vocab, &h.gathers, &h.shape));
  out_.push_back(std::move(h));
  return Status::Ok();
}

// Rows [first, first + count) of the dim-0 concatenation of `shards`, as gathers that cross
// shard boundaries where the range does.
void RowRange(const std::vector<Shard>& shards, uint32_t itemsize, int64_t first, int64_t count,
              std::vector<Gather>* out) {
  for (const Shard& s : shards) {
    const int64_t rows = s.shape[0];
    if (count > 0 && first < rows) {
      const int64_t n = std::min(count, rows - first);
      const uint64_t row = RowBytes(s, itemsize);
      const uint64_t len = static_cast<uint64_t>(n) * row;
      out->push_back(Gather{1, {Part{s.source, s.offset + static_cast<uint64_t>(first) * row, len,
                                     len}}});
      first = 0;
      count -= n;
    } else {
      first -= rows;
    }
  }
}

// Megatron fuses Q, K and V into one matrix laid out per query group: the group's query heads,
// then its key head, then its value head, each head_dim rows (their biases likewise, one value
// per row). A TP rank holds one of TP equal dim-0 chunks: whole groups when TP divides the
// groups, else (megatron.core, TP a multiple of the groups) a part of one group's rows.
// `part` is "weight" or "bias".
Status HfPlanner::AddQkv(const MegatronTensor& t, const std::string& prefix, const char* part) {
  ASSIGN_OR_RETURN(uint32_t itemsize, Itemsize(t));
  const Shape& s = shape_;
  const int64_t per_group = s.heads / s.groups;
  const int64_t block = (per_group + 2) * s.head_dim;
  const int64_t ts = static_cast<int64_t>(t.shards.size());
  const bool bias = std::string_view(part) == "bias";
  for (const Shard& sh : t.shards) {
    const bool cols_ok = bias ? sh.shape.size() == 1 : sh.shape.size() == 2 && sh.shape[1] == s.hidden;
    if (!cols_ok || sh.shape[0] * ts != s.groups * block) {
      return Invalid("'" + t.name + "' is not the fused QKV " + part + " of " +
                     std::to_string(s.heads) + " heads in " + std::to_string(s.groups) +
                     " groups of head_dim " + std::to_string(s.head_dim) + " over " +
                     std::to_string(ts) + " TP ranks");
    }
  }
  const int64_t d = s.head_dim;
  auto shape = [&](int64_t rows) {
    return bias ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, s.hidden};
  };
  const std::string suffix = std::string("_proj.") + part;
  HfTensor q{prefix + "self_attn.q" + suffix, t.dtype, shape(s.heads * d), {}};
  HfTensor k{prefix + "self_attn.k" + suffix, t.dtype, shape(s.groups * d), {}};
  HfTensor v{prefix + "self_attn.v" + suffix, t.dtype, shape(s.groups * d), {}};
  if (t.shards[0].shape[0] % block == 0) {  // whole groups: one strided gather per shard
    q.gathers = EveryBlock(t.shards, itemsize, block, 0, per_group * d);
    k.gathers = EveryBlock(t.shards, itemsize, block, per_group * d, d);
    v.gathers = EveryBlock(t.shards, itemsize, block, (per_group + 1) * d, d);
  } else {
    for (int64_t g = 0; g < s.groups; ++g) {
      RowRange(t.shards, itemsize, g * block, per_group * d, &q.gathers);
      RowRange(t.shards, itemsize, g * block + per_group * d, d, &k.gathers);
      RowRange(t.shards, itemsize, g * block + (per_group + 1) * d, d, &v.gathers);
    }
  }
  out_.push_back(std::move(q));
  out_.push_back(std::move(k));
  out_.push_back(std::move(v));
  return Status::Ok();
}

// SwiGLU's fc1 holds on each TP rank its slice of the gate projection, then its slice of the up
// projection (megatron's swiglu applies SiLU to the first half).
Status HfPlanner::AddFc1(const MegatronTensor& t, const std::string& prefix) {
  ASSIGN_OR_RETURN(uint32_t itemsize, Itemsize(t));
  const int64_t ts = static_cast<int64_t>(t.shards.size());
  for (const Shard& sh : t.shards) {
    // Per rank [gate; up] halves need ffn / ts whole; torch_dist's whole gate-then-up rows
    // need only the rows to add up.
    if (sh.shape.size() != 2 || sh.shape[1] != shape_.hidden || sh.shape[0] * ts != 2 * shape_.ffn ||
        (!t.gate_up_whole && shape_.ffn % ts != 0)) {
      return Invalid("'" + t.name + "' is not SwiGLU's fc1 of ffn_hidden_size " +
                     std::to_string(shape_.ffn) + " over " + std::to_string(ts) + " TP ranks");
    }
  }
  HfTensor gate{prefix + "mlp.gate_proj.weight", t.dtype, {shape_.ffn, shape_.hidden}, {}};
  HfTensor up{prefix + "mlp.up_proj.weight", t.dtype, {shape_.ffn, shape_.hidden}, {}};
  if (t.gate_up_whole) {
    RowRange(t.shards, itemsize, 0, shape_.ffn, &gate.gathers);
    RowRange(t.shards, itemsize, shape_.ffn, shape_.ffn, &up.gathers);
  } else {
    const int64_t half = shape_.ffn / ts;
    gate.gathers = EveryBlock(t.shards, itemsize, 2 * half, 0, half);
    up.gathers = EveryBlock(t.shards, itemsize, 2 * half, half, half);
  }
  out_.push_back(std::move(gate));
  out_.push_back(std::move(up));
  return Status::Ok();
}

Status HfPlanner::Add(const MegatronTensor& t, Role role) {
  const std::string layer = "model.layers." + std::to_string(t.layer) + ".";
  const VocabSizes vocab{src_.source_vocab_rows, shape_.vocab};
  switch (role) {
    case Role::kEmbed: return AddWhole(t, "model.embed_tokens.weight", vocab);
    case Role::kOutput: return AddWhole(t, "lm_head.weight", vocab);
    case Role::kFinalNorm: return AddWhole(t, "model.norm.weight");
    case Role::kInNorm: return AddWhole(t, layer + "input_layernorm.weight");
    case Role::kMlpNorm: return AddWhole(t, layer + "post_attention_layernorm.weight");
    case Role::kProj: return AddWhole(t, layer + "self_attn.o_proj.weight");
    case Role::kFc2: return AddWhole(t, layer + "mlp.down_proj.weight");
    case Role::kQkv: return AddQkv(t, layer, "weight");
    case Role::kQkvBias: return AddQkv(t, layer, "bias");
    case Role::kQNorm: return AddWhole(t, layer + "self_attn.q_norm.weight");
    case Role::kKNorm: return AddWhole(t, layer + "self_attn.k_norm.weight");
    case Role::kFc1: return AddFc1(t, layer);
    case Role::kSkip: return Status::Ok();
  }
  return Status::Ok();
}

std::string ShardName(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k, n);
  return buf;
}

Result<std::vector<ViewEntry>> HfPlanner::Run() {
  const MegatronModel& m = src_.model;
  ASSIGN_OR_RETURN(arch_, PickHfArch(m));
  Shape& s = shape_;
  s.layers = m.num_layers;
  s.hidden = m.hidden_size;
  s.heads = m.heads;
  s.groups = m.query_groups;
  s.head_dim = m.kv_channels > 0 ? m.kv_channels : m.hidden_size / m.heads;
  s.ffn = m.ffn_hidden_size;
  // args.vocab_size, when the checkpoint has it, is the tokenizer's: the padding goes. Without
  // it (a tokenizer set the size at run time) the padded rows stay, and config.json says so.
  // NullTokenizer's size was args.vocab_size + 1 (its end-of-document id) before 2026 and is
  // args.vocab_size since: the padded rows stay, as without args.vocab_size.
  s.vocab = m.args_vocab_size > 0 && m.tokenizer_type != "NullTokenizer" ? m.args_vocab_size
                                                                          : src_.source_vocab_rows;
  if (s.groups <= 0 || s.heads % s.groups != 0) {
    return Invalid("num_query_groups " + std::to_string(s.groups) + " does not divide the " +
                   std::to_string(s.heads) + " heads");
  }
  if (s.vocab > src_.source_vocab_rows) {
    return Invalid("args.vocab_size " + std::to_string(s.vocab) + " is larger than the " +
                   std::to_string(src_.source_vocab_rows) + " rows of the word embeddings");
  }
  // Every tensor to its HF tensors, and each layer's roles counted.
  using Seen = std::array<int, kNumLayerRoles>;
  std::vector<Seen> seen(static_cast<size_t>(s.layers), Seen{});
  int embed = 0, norm = 0, output = 0;
  for (const MegatronTensor& t : src_.tensors) {
    if (t.layer >= s.layers) return Invalid("'" + t.name + "' is past the model's layers");
    ASSIGN_OR_RETURN(Role role, RoleOf(t.name, t.layer, m.tied, arch_));
    if (role == Role::kSkip) continue;
    if (t.layer >= 0) {
      const int k = static_cast<int>(role) - static_cast<int>(Role::kInNorm);
      if (k < 0 || k >= kNumLayerRoles) {
        return Invalid("'" + t.name + "' has no place in a decoder layer");
      }
      if (++seen[static_cast<size_t>(t.layer)][static_cast<size_t>(k)] > 1) {
        return Invalid("layer " + std::to_string(t.layer) + " has two " + kLayerRoles[k] +
                       " tensors ('" + t.name + "')");
      }
    }
    embed += role == Role::kEmbed;
    norm += role == Role::kFinalNorm;
    output += role == Role::kOutput;
    RETURN_IF_ERROR(Add(t, role));
  }
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int k = 0; k < kNumLayerRoles; ++k) {
      if (ArchHas(arch_, k) && !seen[static_cast<size_t>(l)][static_cast<size_t>(k)]) {
        return Invalid("layer " + std::to_string(l) + " has no " + kLayerRoles[k] + " tensor");
      }
    }
  }
  if (embed != 1) return Invalid("the checkpoint has no single word_embeddings.weight");
  if (norm != 1) return Invalid("the checkpoint has no single final norm");
  if (!m.tied && output != 1) return Invalid("untied embeddings but no single output_layer.weight");
  ASSIGN_OR_RETURN(std::string config, ConfigJson(m, s, arch_));

  // Shards in order, each up to max_shard_bytes (a larger tensor alone).
  std::vector<std::vector<size_t>> shards;
  uint64_t in_shard = 0, total = 0;
  std::vector<uint64_t> bytes(out_.size());
  for (size_t i = 0; i < out_.size(); ++i) {
    for (const Gather& g : out_[i].gathers) bytes[i] += GatherBytes(g);
    total += bytes[i];
    if (shards.empty() || (in_shard > 0 && in_shard + bytes[i] > options_.max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes[i];
  }
  std::vector<ViewEntry> entries;
  entries.push_back({"config.json", {}});
  entries.back().file.recipe.AddLiteral(config + "\n");
  std::vector<std::pair<std::string, std::string>> weight_map;  // (tensor, file)
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string file = ShardName(k + 1, shards.size());
    std::vector<safetensors::TensorSpec> specs;
    for (size_t i : shards[k]) {
      const HfTensor& h = out_[i];
      auto dtype = SafetensorsDtypeOf(h.dtype);
      if (!dtype) return Invalid("'" + h.name + "' is " + h.dtype + ", which safetensors cannot hold");
      specs.push_back({h.name, *dtype, std::vector<uint64_t>(h.shape.begin(), h.shape.end())});
      weight_map.emplace_back(h.name, file);
    }
    ASSIGN_OR_RETURN(auto header, safetensors::BuildHeader(specs, safetensors::Metadata{{"format", "pt"}}));
    ViewEntry e{file, {}};
    e.file.recipe.AddLiteral(std::move(header.bytes));
    for (size_t i : shards[k]) {
      for (const Gather& g : out_[i].gathers) e.file.recipe.AddGather(g.rows, g.parts);
    }
    if (e.file.recipe.size() != header.file_size) {
      return Internal("hf view: " + file + " is not the size its header says");
    }
    entries.push_back(std::move(e));
  }
  std::sort(weight_map.begin(), weight_map.end());
  json::Object map;
  for (auto& [tensor, file] : weight_map) map.push_back({tensor, json::Value::String(file)});
  json::Object index;
  index.push_back({"metadata", json::Value::MakeObject(
                                   {{"total_size", json::Value::Int(static_cast<int64_t>(total))}})});
  index.push_back({"weight_map", json::Value::MakeObject(std::move(map))});
  ASSIGN_OR_RETURN(std::string index_json, json::Write(json::Value::MakeObject(std::move(index))));
  entries.push_back({"model.safetensors.index.json", {}});
  entries.back().file.recipe.AddLiteral(index_json + "\n");
  return entries;
}

}  // namespace

Result<std::vector<ViewEntry>> PlanMegatronHf(const MegatronSource& src, const Rules& rules,
                                              const HfOptions& options) {
  ASSIGN_OR_RETURN(MegatronTensors tensors, ListMegatronTensors(src, rules));
  return PlanMegatronHf(std::move(tensors), options);
}

Result<std::vector<ViewEntry>> PlanMegatronHf(MegatronTensors tensors, const HfOptions& options) {
  return HfPlanner(std::move(tensors), options).Run();
}

}  // namespace ckptfs::reshard
