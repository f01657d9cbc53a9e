#include "reshard/megatron_hf.h"

#include "reshard/megatron_hf_arch.h"

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
// kInNorm to kExpertFc2; the first four are in every layer of every architecture.
enum class Role {
  kEmbed, kInNorm, kQkv, kProj, kMlpNorm, kFc1, kFc2, kQkvBias, kQNorm, kKNorm, kRouter,
  kSharedGate, kSharedFc1, kSharedFc2, kExpertFc1, kExpertFc2, kFinalNorm, kOutput, kSkip,
};
constexpr int kNumLayerRoles = 15;
constexpr const char* kLayerRoles[kNumLayerRoles] = {
    "input norm", "fused QKV", "attention output", "MLP norm", "fc1 (gate and up)", "fc2",
    "fused QKV bias", "query norm", "key norm", "router", "shared expert gate",
    "shared expert fc1", "shared expert fc2", "expert fc1", "expert fc2"};
int LayerIndex(Role r) { return static_cast<int>(r) - static_cast<int>(Role::kInNorm); }
bool IsExpertRole(int k) { return k >= LayerIndex(Role::kExpertFc1); }

// Whether layers of architecture `a` may hold a tensor of layer role k (0 = kInNorm).
bool ArchHas(HfArch a, int k) {
  switch (static_cast<Role>(k + static_cast<int>(Role::kInNorm))) {
    case Role::kQkvBias: return a == HfArch::kQwen2 || a == HfArch::kQwen2Moe;
    case Role::kQNorm:
    case Role::kKNorm: return a == HfArch::kQwen3 || a == HfArch::kQwen3Moe;
    case Role::kFc1:
    case Role::kFc2: return a != HfArch::kMixtral;
    case Role::kRouter:
    case Role::kExpertFc1:
    case Role::kExpertFc2: return HfArchHasExperts(a);
    case Role::kSharedGate:
    case Role::kSharedFc1:
    case Role::kSharedFc2: return a == HfArch::kQwen2Moe;
    default: return true;
  }
}

bool EndsWith(std::string_view s, std::string_view x) {
  return s.size() >= x.size() && s.substr(s.size() - x.size()) == x;
}

// An expert's weight in a layer, after "mlp.experts.": SequentialMLP's
// local_experts.{e}.linear_fcN.weight or TEGroupedMLP's linear_fcN.weight{e} (the global number
// e in both, as ListMegatronTensors names them). Sets *expert.
std::optional<Role> ExpertRole(std::string_view rest, int64_t* expert) {
  auto number = [&](std::string_view digits) {
    if (digits.empty() || digits.size() > 9) return false;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
    }
    *expert = std::stoll(std::string(digits));
    return true;
  };
  if (rest.starts_with("local_experts.")) {
    rest.remove_prefix(std::string_view("local_experts.").size());
    const size_t dot = rest.find('.');
    if (dot == std::string_view::npos || !number(rest.substr(0, dot))) return std::nullopt;
    rest.remove_prefix(dot + 1);
    if (rest == "linear_fc1.weight") return Role::kExpertFc1;
    if (rest == "linear_fc2.weight") return Role::kExpertFc2;
    return std::nullopt;
  }
  for (auto [prefix, role] : {std::pair{std::string_view("linear_fc1.weight"), Role::kExpertFc1},
                              std::pair{std::string_view("linear_fc2.weight"), Role::kExpertFc2}}) {
    if (rest.starts_with(prefix) && number(rest.substr(prefix.size()))) return role;
  }
  return std::nullopt;
}

// The role of `name` (a layer's tensor when layer >= 0), both naming eras and both layer specs
// (Transformer Engine's fused norms, megatron.core's local modules), in a model served as `arch`;
// an expert's number in *expert. Errors name the tensor.
Result<Role> RoleOf(const std::string& name, int64_t layer, bool tied, HfArch arch,
                    int64_t* expert) {
  const bool qkv_bias = EndsWith(name, ".self_attention.linear_qkv.bias") ||
                        EndsWith(name, ".self_attention.query_key_value.bias");
  if ((EndsWith(name, ".bias") || EndsWith(name, ".layer_norm_bias")) &&
      !(qkv_bias && ArchHas(arch, LayerIndex(Role::kQkvBias)) && layer >= 0)) {
    return Invalid("'" + name + "' is a bias, which " + HfArchName(arch) + " does not have there");
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
      {"mlp.router.weight", Role::kRouter},
      {"mlp.shared_experts.gate_weight", Role::kSharedGate},
      {"mlp.shared_experts.linear_fc1.weight", Role::kSharedFc1},
      {"mlp.shared_experts.linear_fc2.weight", Role::kSharedFc2},
  };
  std::optional<Role> role;
  for (const auto& [suffix, r] : kNames) {
    if (rest == suffix) role = r;
  }
  if (!role && rest.starts_with("mlp.experts.")) {
    role = ExpertRole(rest.substr(std::string_view("mlp.experts.").size()), expert);
  }
  if (!role) {
    if (rest == "mlp.router.expert_bias") {
      return Invalid("'" + name + "' is an expert bias of the router, which " + HfArchName(arch) +
                     " does not have");
    }
    return Invalid("no Hugging Face name for '" + name + "'");
  }
  const int k = LayerIndex(*role);
  if (!ArchHas(arch, k)) {
    return Invalid("'" + name + "' is a " + kLayerRoles[k] + ", which " + HfArchName(arch) +
                   " does not have");
  }
  return *role;
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
  Status Add(const MegatronTensor& t, Role role, int64_t expert);
  Status AddWhole(const MegatronTensor& t, const std::string& name, const VocabSizes& vocab = {});
  Status AddQkv(const MegatronTensor& t, const std::string& prefix, const char* part);
  Status AddFc1(const MegatronTensor& t, const std::string& gate_name, const std::string& up_name,
                int64_t ffn);
  Result<uint32_t> Itemsize(const MegatronTensor& t) {
    const uint32_t n = DtypeSize(t.dtype);
    if (n == 0) return Invalid("'" + t.name + "' has an unknown dtype " + t.dtype);
    return n;
  }

  MegatronTensors src_;
  const HfOptions options_;
  HfArch arch_ = HfArch::kLlama;
  HfShape shape_;
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
  const HfShape& s = shape_;
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

// SwiGLU's fc1 (a layer's, an expert's, the shared expert's) holds on each TP rank its slice of
// the gate projection, then its slice of the up projection (megatron's swiglu applies SiLU to the
// first half); `ffn` is its FFN size.
Status HfPlanner::AddFc1(const MegatronTensor& t, const std::string& gate_name,
                         const std::string& up_name, int64_t ffn) {
  ASSIGN_OR_RETURN(uint32_t itemsize, Itemsize(t));
  const int64_t ts = static_cast<int64_t>(t.shards.size());
  for (const Shard& sh : t.shards) {
    // Per rank [gate; up] halves need ffn / ts whole; torch_dist's whole gate-then-up rows
    // need only the rows to add up.
    if (sh.shape.size() != 2 || sh.shape[1] != shape_.hidden || sh.shape[0] * ts != 2 * ffn ||
        (!t.gate_up_whole && ffn % ts != 0)) {
      return Invalid("'" + t.name + "' is not SwiGLU's fc1 of FFN size " + std::to_string(ffn) +
                     " over " + std::to_string(ts) + " TP ranks");
    }
  }
  HfTensor gate{gate_name, t.dtype, {ffn, shape_.hidden}, {}};
  HfTensor up{up_name, t.dtype, {ffn, shape_.hidden}, {}};
  if (t.gate_up_whole) {
    RowRange(t.shards, itemsize, 0, ffn, &gate.gathers);
    RowRange(t.shards, itemsize, ffn, ffn, &up.gathers);
  } else {
    const int64_t half = ffn / ts;
    gate.gathers = EveryBlock(t.shards, itemsize, 2 * half, 0, half);
    up.gathers = EveryBlock(t.shards, itemsize, 2 * half, half, half);
  }
  out_.push_back(std::move(gate));
  out_.push_back(std::move(up));
  return Status::Ok();
}

Status HfPlanner::Add(const MegatronTensor& t, Role role, int64_t expert) {
  const std::string layer = "model.layers." + std::to_string(t.layer) + ".";
  const VocabSizes vocab{src_.source_vocab_rows, shape_.vocab};
  // Mixtral's Hub names (block_sparse_moe, w1 gate, w3 up, w2 down); the Qwen MoE models'.
  const bool mixtral = arch_ == HfArch::kMixtral;
  const std::string moe = layer + (mixtral ? "block_sparse_moe." : "mlp.");
  const std::string ex = moe + "experts." + std::to_string(expert) + ".";
  const std::string shared = layer + "mlp.shared_expert.";
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
    case Role::kFc1:
      return AddFc1(t, layer + "mlp.gate_proj.weight", layer + "mlp.up_proj.weight", shape_.ffn);
    case Role::kRouter: return AddWhole(t, moe + "gate.weight");
    case Role::kSharedGate: return AddWhole(t, layer + "mlp.shared_expert_gate.weight");
    case Role::kSharedFc1:
      return AddFc1(t, shared + "gate_proj.weight", shared + "up_proj.weight", shape_.shared_ffn);
    case Role::kSharedFc2: return AddWhole(t, shared + "down_proj.weight");
    case Role::kExpertFc1:
      return AddFc1(t, ex + (mixtral ? "w1.weight" : "gate_proj.weight"),
                    ex + (mixtral ? "w3.weight" : "up_proj.weight"), shape_.moe_ffn);
    case Role::kExpertFc2: return AddWhole(t, ex + (mixtral ? "w2.weight" : "down_proj.weight"));
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
  HfShape& s = shape_;
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
  s.experts = m.num_experts;
  s.moe_ffn = m.moe_ffn_hidden_size;
  s.shared_ffn = m.shared_expert_size;
  // Every tensor to its HF tensors, and each layer's roles counted (experts once per expert).
  using Seen = std::array<int64_t, kNumLayerRoles>;
  std::vector<Seen> seen(static_cast<size_t>(s.layers), Seen{});
  int embed = 0, norm = 0, output = 0;
  for (const MegatronTensor& t : src_.tensors) {
    if (t.layer >= s.layers) return Invalid("'" + t.name + "' is past the model's layers");
    int64_t expert = -1;
    ASSIGN_OR_RETURN(Role role, RoleOf(t.name, t.layer, m.tied, arch_, &expert));
    if (role == Role::kSkip) continue;
    if (t.layer >= 0) {
      const int k = LayerIndex(role);
      if (k < 0 || k >= kNumLayerRoles) {
        return Invalid("'" + t.name + "' has no place in a decoder layer");
      }
      if (IsExpertRole(k) && (expert < 0 || expert >= s.experts ||
                              (t.expert >= 0 && t.expert != expert))) {
        return Invalid("'" + t.name + "' is not one of the " + std::to_string(s.experts) +
                       " experts");
      }
      if (++seen[static_cast<size_t>(t.layer)][static_cast<size_t>(k)] > 1 && !IsExpertRole(k)) {
        return Invalid("layer " + std::to_string(t.layer) + " has two " + kLayerRoles[k] +
                       " tensors ('" + t.name + "')");
      }
    }
    embed += role == Role::kEmbed;
    norm += role == Role::kFinalNorm;
    output += role == Role::kOutput;
    RETURN_IF_ERROR(Add(t, role, expert));
  }
  // Each layer whole: a layer with a router has every expert's fc1 and fc2 (each once: the names
  // are checked unique below) and no dense fc1 or fc2; one without is dense.
  for (int64_t l = 0; l < s.layers; ++l) {
    const Seen& have = seen[static_cast<size_t>(l)];
    const bool moe = have[static_cast<size_t>(LayerIndex(Role::kRouter))] > 0;
    if (!moe) s.dense_layers.push_back(l);
    for (int k = 0; k < kNumLayerRoles; ++k) {
      const Role r = static_cast<Role>(k + static_cast<int>(Role::kInNorm));
      const bool expert_part = r == Role::kRouter || r == Role::kSharedGate ||
                               r == Role::kSharedFc1 || r == Role::kSharedFc2 ||
                               IsExpertRole(k);
      const bool dense_part = r == Role::kFc1 || r == Role::kFc2;
      const int64_t n = have[static_cast<size_t>(k)];
      if ((moe && dense_part) || (!moe && expert_part)) continue;  // checked below
      const int64_t want = IsExpertRole(k) ? s.experts : 1;
      if (ArchHas(arch_, k) && n != want) {
        return Invalid("layer " + std::to_string(l) + " has " + std::to_string(n) + " " +
                       kLayerRoles[k] + " tensors, not " + std::to_string(want));
      }
    }
    if (moe && (have[static_cast<size_t>(LayerIndex(Role::kFc1))] ||
                have[static_cast<size_t>(LayerIndex(Role::kFc2))])) {
      return Invalid("layer " + std::to_string(l) + " has a router and a dense MLP");
    }
    if (!moe && !ArchHas(arch_, LayerIndex(Role::kFc1))) {
      return Invalid("layer " + std::to_string(l) + " has no experts, and " + HfArchName(arch_) +
                     " has experts in every layer");
    }
    if (!moe && have[static_cast<size_t>(LayerIndex(Role::kExpertFc1))] +
                        have[static_cast<size_t>(LayerIndex(Role::kExpertFc2))] >
                    0) {
      return Invalid("layer " + std::to_string(l) + " has experts but no router");
    }
  }
  if (HfArchHasExperts(arch_) && s.dense_layers.size() == static_cast<size_t>(s.layers)) {
    return Invalid("args.num_experts is set, but no layer has a router (mlp.router.weight)");
  }
  {
    std::vector<std::string_view> names;
    for (const HfTensor& h : out_) names.push_back(h.name);
    std::sort(names.begin(), names.end());
    if (auto d = std::adjacent_find(names.begin(), names.end()); d != names.end()) {
      return Invalid("two source tensors make '" + std::string(*d) + "'");
    }
  }
  if (embed != 1) return Invalid("the checkpoint has no single word_embeddings.weight");
  if (norm != 1) return Invalid("the checkpoint has no single final norm");
  if (!m.tied && output != 1) return Invalid("untied embeddings but no single output_layer.weight");
  ASSIGN_OR_RETURN(std::string config, HfConfigJson(m, s, arch_));

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
