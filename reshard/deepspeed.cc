#include "reshard/deepspeed.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard {
namespace {

constexpr std::string_view kOptimSuffix = "_optim_states.pt";

struct OptimName {
  std::string prefix;  // "", "bf16_" or "fp16_"
  uint32_t dp = 0, tp = 0;
};

// "[bf16_|fp16_]zero_pp_rank_D_mp_rank_TT_optim_states.pt".
std::optional<OptimName> ParseOptimName(std::string_view name) {
  OptimName o;
  for (std::string_view p : {"bf16_", "fp16_"}) {
    if (name.starts_with(p)) {
      o.prefix = std::string(p);
      name.remove_prefix(p.size());
    }
  }
  if (!name.starts_with("zero_pp_rank_") || !name.ends_with(kOptimSuffix)) return std::nullopt;
  const std::string s(name.substr(0, name.size() - kOptimSuffix.size()));
  unsigned dp = 0, tp = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "zero_pp_rank_%u_mp_rank_%u%c", &dp, &tp, &tail) != 2) {
    return std::nullopt;
  }
  char canon[64];
  std::snprintf(canon, sizeof canon, "zero_pp_rank_%u_mp_rank_%02u", dp, tp);
  if (s != canon) return std::nullopt;
  o.dp = dp;
  o.tp = tp;
  return o;
}

// "mp_rank_TT_model_states.pt" -> TT.
std::optional<uint32_t> ParseModelName(std::string_view name) {
  unsigned tp = 0;
  char tail = 0;
  const std::string s(name);
  if (std::sscanf(s.c_str(), "mp_rank_%u_model_states.p%c", &tp, &tail) != 2 || tail != 't') {
    return std::nullopt;
  }
  char canon[64];
  std::snprintf(canon, sizeof canon, "mp_rank_%02u_model_states.pt", tp);
  if (s != canon) return std::nullopt;
  return tp;
}

// "zero_pp_rank_D_mp_rank_TT_model_states.pt" (ZeRO stage 3: one per dp rank) -> (TT, D).
std::optional<std::pair<uint32_t, uint32_t>> ParseZero3ModelName(std::string_view name) {
  unsigned dp = 0, tp = 0;
  char tail = 0;
  const std::string s(name);
  if (std::sscanf(s.c_str(), "zero_pp_rank_%u_mp_rank_%u_model_states.p%c", &dp, &tp, &tail) != 3 ||
      tail != 't') {
    return std::nullopt;
  }
  char canon[96];
  std::snprintf(canon, sizeof canon, "zero_pp_rank_%u_mp_rank_%02u_model_states.pt", dp, tp);
  if (s != canon) return std::nullopt;
  return std::pair{tp, dp};
}

}  // namespace

namespace ds {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

Result<uint64_t> Numel(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t x : shape) {
    // Below 2^56 elements, so that byte counts of any dtype stay in 64 bits.
    if (x < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(x), &n) || n >= (1ull << 56)) {
      return Invalid(what + " has a negative size or too many elements");
    }
  }
  return n;
}

Result<std::vector<std::vector<Param>>> ParamShapes(const ValuePtr& root,
                                                    const std::string& where) {
  ValuePtr shapes = Get(root, "param_shapes");
  if (!shapes || shapes->kind != Kind::kList) return Invalid(where + " has no param_shapes");
  std::vector<std::vector<Param>> groups;
  for (const ValuePtr& g : shapes->items) {
    if (!IsMapping(g)) return Invalid(where + ": param_shapes holds a non-mapping");
    std::vector<Param> params;
    for (const auto& [k, v] : PairsOf(*g)) {
      Param p;
      p.name = KeyName(k);
      if (!IntsOf(v, &p.shape)) return Invalid(where + ": the shape of " + p.name);
      ASSIGN_OR_RETURN(p.numel, Numel(p.shape, where + ": the shape of " + p.name));
      params.push_back(std::move(p));
    }
    groups.push_back(std::move(params));
  }
  return groups;
}

std::string ModelName(uint32_t tp) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "mp_rank_%02u_model_states.pt", tp);
  return buf;
}
std::string OptimFileName(const std::string& prefix, uint32_t dp, uint32_t tp) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "zero_pp_rank_%u_mp_rank_%02u_optim_states.pt", dp, tp);
  return prefix + buf;
}
std::string ArchivePrefix(std::string_view file_name) {
  const size_t slash = file_name.rfind('/');
  if (slash != std::string_view::npos) file_name.remove_prefix(slash + 1);
  const size_t dot = file_name.rfind('.');
  return std::string(dot == std::string_view::npos ? file_name : file_name.substr(0, dot));
}


Status Checkpoint::Decode() {
  std::map<uint32_t, const DsSourceFile*> models;
  std::map<std::pair<uint32_t, uint32_t>, const DsSourceFile*> optims;  // (tp, dp)
  std::map<std::pair<uint32_t, uint32_t>, const DsSourceFile*> z3_models;  // (tp, dp)
  for (const DsSourceFile& f : src.files) {
    if (auto t = ParseModelName(f.name)) {
      models[*t] = &f;
    } else if (auto z = ParseZero3ModelName(f.name)) {
      z3_models[*z] = &f;
    } else if (auto o = ParseOptimName(f.name)) {
      if (optims.empty()) optim_prefix = o->prefix;
      if (o->prefix != optim_prefix) {
        return Invalid(src.tag + " mixes optimizer files of different precisions (" + f.name +
                       ")");
      }
      optims[{o->tp, o->dp}] = &f;
    }
  }
  bool experts = false;  // native MoE: expert files, or the model-states file's num_experts
  for (const DsLayerFile& f : src.moe_files) experts |= !f.name.starts_with("expp_rank_");
  if (models.empty() && !z3_models.empty() && experts) {
    return Invalid("ZeRO stage 3 checkpoints with DeepSpeed MoE experts have no views yet");
  }
  if (!models.empty() && (experts || Get(models.begin()->second->file->root, "num_experts"))) {
    return DecodeMoe(models, optims);
  }
  if (models.empty() && !z3_models.empty()) {
    std::map<uint32_t, const DsSourceFile*> by_dp, optim_by_dp;
    for (const auto& [key, f] : z3_models) {
      if (key.first != 0) {
        return Invalid("ZeRO stage 3 with tensor parallelism (" + f->name + ") has no views yet");
      }
      by_dp[key.second] = f;
    }
    for (const auto& [key, f] : optims) {
      if (key.first != 0) return Invalid(f->name + " has no model-states file of its TP rank");
      optim_by_dp[key.second] = f;
    }
    return DecodeZero3(by_dp, optim_by_dp);
  }
  if (models.empty()) return Invalid(src.tag + " holds no mp_rank_*_model_states.pt");
  const uint32_t T = static_cast<uint32_t>(models.size());
  if (models.rbegin()->first != T - 1) {
    return Invalid(src.tag + " does not hold mp_rank_00 .. mp_rank_" + std::to_string(T - 1));
  }
  tp.resize(T);
  for (uint32_t t = 0; t < T; ++t) {
    TpRank& tr = tp[t];
    tr.model = models.at(t);
    tr.model_tensors = IndexTensors(*tr.model->file);
    const ValuePtr& root = tr.model->file->root;
    const std::string where = src.tag + "/" + tr.model->name;
    if (!IsMapping(root)) return Invalid(where + " is not a DeepSpeed model-states dict");
    ValuePtr dims = Get(root, "checkpoint_parallel_dimensions");
    ValuePtr pp = Get(dims, "pp_degree");
    if (pp && pp->kind == Kind::kInt && pp->i > 1) {
      return Invalid("pipeline-parallel DeepSpeed checkpoints (pp_degree " +
                     std::to_string(pp->i) + ") have no views yet");
    }
    ValuePtr dpws = Get(root, "dp_world_size");
    if (!dpws || dpws->kind != Kind::kInt || dpws->i < 1) {
      return Invalid(where + " has no dp_world_size");
    }
    if (t == 0) D = static_cast<uint32_t>(dpws->i);
    if (dpws->i != D) return Invalid("the model-states files disagree on dp_world_size");
    ASSIGN_OR_RETURN(tr.groups, ParamShapes(root, where));
    for (std::vector<Param>& params : tr.groups) {
      uint64_t off = 0;
      for (Param& p : params) {
        p.offset = off;
        off += p.numel;
      }
      tr.totals.push_back(off);
    }
    tr.optim.resize(D);
    for (uint32_t d = 0; d < D; ++d) {
      auto it = optims.find({t, d});
      if (it == optims.end()) {
        return Invalid("optimizer file " + OptimFileName(optim_prefix, d, t) + " of " +
                       src.tag + " is missing (dp_world_size " + std::to_string(D) + ")");
      }
      tr.optim[d].file = it->second;
      RETURN_IF_ERROR(DecodeOptim(&tr, d));
    }
    for (uint32_t d = 0; d < D; ++d) RETURN_IF_ERROR(CheckMappings(tr, d));
  }
  for (const auto& [key, f] : optims) {
    if (key.first >= T || key.second >= D) {
      return Invalid(f->name + " lies outside dp_world_size " + std::to_string(D) +
                     " x mp_world_size " + std::to_string(T));
    }
  }
  return Status::Ok();
}

Status Checkpoint::DecodeOptim(TpRank* tr, uint32_t d) {
  Optim& o = tr->optim[d];
  RETURN_IF_ERROR(ParseOptim(&o, tr->groups.size()));
  for (size_t g = 0; g < tr->groups.size(); ++g) {
    RETURN_IF_ERROR(CheckOptimGroup(o, g, Partitioning(tr->totals[g], D), d,
                                    "param_shapes and dp_world_size " + std::to_string(D)));
  }
  return Status::Ok();
}

Status Checkpoint::ParseOptim(Optim* op, size_t G) {
  Optim& o = *op;
  const std::string where = src.tag + "/" + o.file->name;
  o.tensors = IndexTensors(*o.file->file);
  o.root = o.file->file->root;
  o.osd = Get(o.root, "optimizer_state_dict");
  if (!IsMapping(o.osd)) return Invalid(where + " has no optimizer_state_dict");
  // zero_stage: an int, or a ZeroStageEnum member, which Python pickles as the enum called with
  // its value (ZeroStageEnum(3)) or, in Python 3.11, as getattr(ZeroStageEnum, 'weights').
  ValuePtr stage = Get(o.osd, "zero_stage");
  bool stage3 = stage && stage->kind == Kind::kInt && stage->i == 3;
  if (stage && stage->kind == Kind::kObject && stage->args) {
    for (const ValuePtr& a : stage->args->items) {
      stage3 |= (a->kind == Kind::kInt && a->i == 3) || (a->kind == Kind::kStr && a->str == "weights");
    }
  }
  if (stage3) {
    return Invalid(where + " is a ZeRO stage 3 optimizer file, but the tag holds no stage 3 "
                   "model-states files (zero_pp_rank_D_mp_rank_TT_model_states.pt)");
  }
  // BF16_Optimizer.state_dict writes neither zero_stage nor a loss scaler; DeepSpeedZeroOptimizer
  // always writes its loss scaler (and zero_stage since long ago).
  const bool bf16_opt = stage == nullptr && Get(o.osd, "loss_scaler") == nullptr;
  if (!bf16_optimizer) bf16_optimizer = bf16_opt;
  if (*bf16_optimizer != bf16_opt) {
    return Invalid(where + (bf16_opt ? " has no zero_stage (a BF16_Optimizer file)"
                                     : " has a zero_stage (a ZeRO stage 1/2 file)") +
                   ", unlike the tag's first optimizer file");
  }
  o.base = Get(o.osd, "base_optimizer_state");
  if (o.base && o.base->kind == Kind::kList) {
    return Invalid(where + " is an elastic checkpoint (zero_optimization.elastic_checkpoint), "
                   "which has no views yet");
  }
  o.state = Get(o.base, "state");
  ValuePtr fp32 = Get(o.osd, "single_partition_of_fp32_groups");
  ValuePtr maps = Get(o.osd, "param_slice_mappings");
  if (!IsMapping(o.state) || !fp32 || fp32->kind != Kind::kList || !maps ||
      maps->kind != Kind::kList) {
    return Invalid(where + " is not a ZeRO stage 1/2 optimizer state (base_optimizer_state, "
                   "single_partition_of_fp32_groups, param_slice_mappings)");
  }
  if (fp32->items.size() != G || maps->items.size() != G) {
    return Invalid(where + " has " + std::to_string(fp32->items.size()) +
                   " parameter groups; the checkpoint has " + std::to_string(G) +
                   " (param_shapes, or dp rank 0's param_groups)");
  }
  o.group_state.assign(G, nullptr);
  for (const auto& [k, v] : PairsOf(*o.state)) {
    if (!k || k->kind != Kind::kInt || k->i < 0 || static_cast<size_t>(k->i) >= G ||
        !IsMapping(v)) {
      return Invalid(where + ": optimizer state key " + KeyName(k) + " is not a group index");
    }
    o.group_state[static_cast<size_t>(k->i)] = v;
  }
  for (size_t g = 0; g < G; ++g) {
    auto it = o.tensors.find(fp32->items[g].get());
    if (it == o.tensors.end() || it->second->shape.size() != 1 ||
        it->second->dtype.empty() || !IsContiguous(it->second->shape, it->second->stride)) {
      return Invalid(where + ": single_partition_of_fp32_groups[" + std::to_string(g) +
                     "] is not a 1-D tensor");
    }
    o.fp32.push_back(it->second);
    if (!IsMapping(maps->items[g])) return Invalid(where + ": param_slice_mappings");
    o.mappings.push_back(maps->items[g]);
  }
  return Status::Ok();
}

Status Checkpoint::CheckOptimGroup(const Optim& o, size_t g, const Partitioning& part, uint64_t r,
                                   const std::string& by) const {
  const std::string where = src.tag + "/" + o.file->name;
  const bool bf16_opt = bf16_optimizer.value_or(false);
  const uint64_t want = bf16_opt ? part.size : part.Real(r);
  if (static_cast<uint64_t>(o.fp32[g]->shape[0]) != want) {
    return Invalid(where + ": group " + std::to_string(g) + " holds " +
                   std::to_string(o.fp32[g]->shape[0]) + " fp32 elements; " + by + " give " + std::to_string(want) +
                   (bf16_opt ? " (BF16_Optimizer: the partition with its padding)" : ""));
  }
  if (!o.group_state[g]) return Status::Ok();
  for (const auto& [k, v] : PairsOf(*o.group_state[g])) {
    auto t = o.tensors.find(v.get());
    if (t == o.tensors.end() || t->second->shape.empty()) continue;
    if (t->second->shape.size() != 1 || static_cast<uint64_t>(t->second->shape[0]) != part.size ||
        !IsContiguous(t->second->shape, t->second->stride)) {
      return Invalid(where + ": optimizer state '" + KeyName(k) + "' of group " +
                     std::to_string(g) + " is not a partition of " + std::to_string(part.size) +
                     " elements");
    }
  }
  return Status::Ok();
}

std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> Fragments(
    const std::vector<Param>& params, const Partitioning& part, uint64_t d) {
  return FragmentsIn(params, d * part.size, (d + 1) * part.size);
}

std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> FragmentsIn(
    const std::vector<Param>& params, uint64_t lo, uint64_t hi) {
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> out;
  for (const Param& p : params) {
    if (p.offset < hi && p.offset + p.numel > lo) {
      const uint64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      out.push_back({p.name, {b - a, a - lo}});
    }
  }
  return out;
}

std::optional<int64_t> IntField(const ValuePtr& obj, std::string_view key) {
  ValuePtr st = obj ? obj->state : nullptr;
  ValuePtr v = Get(st ? st : obj, key);
  if (v && v->kind == Kind::kInt) return v->i;
  return std::nullopt;
}

Status Checkpoint::CheckMappings(const TpRank& tr, uint32_t d) const {
  // The views place parameters by param_shapes' order; the source's own mappings must agree
  // (they do not under round_robin_gradients).
  const Optim& o = tr.optim[d];
  for (size_t g = 0; g < tr.groups.size(); ++g) {
    const auto want = Fragments(tr.groups[g], Partitioning(tr.totals[g], D), d);
    const auto& have = PairsOf(*o.mappings[g]);
    bool same = want.size() == have.size();
    for (size_t i = 0; same && i < want.size(); ++i) {
      same = KeyName(have[i].first) == want[i].first &&
             IntField(have[i].second, "numel") == static_cast<int64_t>(want[i].second.first) &&
             IntField(have[i].second, "start") == static_cast<int64_t>(want[i].second.second);
    }
    if (!same) {
      return Invalid(src.tag + "/" + o.file->name + ": param_slice_mappings of group " +
                     std::to_string(g) + " do not follow param_shapes (round_robin_gradients?)");
    }
  }
  return Status::Ok();
}

const TorchTensor* Checkpoint::StateTensor(const Optim& o, size_t g, const std::string& key) {
  ValuePtr v = Get(o.group_state[g], key);
  if (!v) return nullptr;
  auto it = o.tensors.find(v.get());
  return it == o.tensors.end() ? nullptr : it->second;
}

Result<std::vector<Part>> Checkpoint::Flat(
    const TpRank& tr, size_t g, uint64_t from, uint64_t to,
    const std::function<const TorchTensor*(const Optim&)>& pick, const std::string& what) const {
  return FlatOf(Partitioning(tr.totals[g], D), [&tr](uint64_t r) -> const Optim& { return tr.optim[r]; },
                from, to, pick, what);
}

Result<std::vector<Part>> FlatOf(const Partitioning& part,
                                 const std::function<const Optim&(uint64_t r)>& optim_of,
                                 uint64_t from, uint64_t to,
                                 const std::function<const TorchTensor*(const Optim&)>& pick,
                                 const std::string& what) {
  std::vector<Part> parts;
  for (uint64_t e = from; e < to;) {
    const uint64_t r = e / part.size;
    const uint64_t end = std::min(to, part.End(r));
    const Optim& o = optim_of(r);
    const TorchTensor* t = pick(o);
    if (!t) return Invalid(o.file->name + " has no " + what);
    const uint64_t item = DtypeSize(t->dtype);
    if (item == 0) return Invalid(what + " has an unknown dtype " + t->dtype);
    const uint64_t at = t->offset + (e - part.Begin(r)) * item, len = (end - e) * item;
    if (!parts.empty() && parts.back().source == o.file->source &&
        parts.back().offset + parts.back().len == at) {
      parts.back().len += len;
    } else {
      parts.push_back(Part{o.file->source, at, len, len});
    }
    e = end;
  }
  return parts;
}

}  // namespace ds

bool IsDeepSpeedSourceName(std::string_view name) {
  return ParseModelName(name).has_value() || ParseOptimName(name).has_value() ||
         ParseZero3ModelName(name).has_value();
}

bool IsDeepSpeedMoeName(std::string_view name) {
  const std::string s(name);
  unsigned a = 0, b = 0, t = 0;
  char tail = 0;
  char canon[128];
  if (std::sscanf(s.c_str(), "layer_%u_expert_%u_mp_rank_%u_model_states.p%c", &a, &b, &t,
                  &tail) == 4) {
    std::snprintf(canon, sizeof canon, "layer_%u_expert_%u_mp_rank_%02u_model_states.pt", a, b, t);
  } else if (std::sscanf(s.c_str(), "expert_%u_mp_rank_%u_model_states.p%c", &b, &t, &tail) == 3) {
    std::snprintf(canon, sizeof canon, "expert_%u_mp_rank_%02u_model_states.pt", b, t);
  } else if (std::sscanf(s.c_str(), "expp_rank_%u_mp_rank_%u_optim_states.p%c", &a, &t, &tail) ==
             3) {
    std::snprintf(canon, sizeof canon, "expp_rank_%u_mp_rank_%02u_optim_states.pt", a, t);
  } else {
    return false;
  }
  return s == canon;
}

bool IsDeepSpeedLayerName(std::string_view name) {
  constexpr std::string_view kPrefix = "layer_", kSuffix = "-model_states.pt";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return false;
  name.remove_prefix(kPrefix.size());
  return name.size() > kSuffix.size() && name[0] >= '0' && name[0] <= '9';
}

bool ParseDsSpec(std::string_view s, DsSpec* spec) {
  if (s == "universal") {
    spec->kind = DsSpec::kUniversal;
    spec->D = 0;
    return true;
  }
  unsigned t = 0, d = 0;
  char tail = 0;
  const std::string str(s);
  if (std::sscanf(str.c_str(), "tp%u-dp%u%c", &t, &d, &tail) == 2) {
    if (t == 0 || d == 0 || t > 4096 || d > 4096) return false;
    if (str != "tp" + std::to_string(t) + "-dp" + std::to_string(d)) return false;
    spec->kind = DsSpec::kTpDp;
    spec->T = t;
    spec->D = d;
    return true;
  }
  if (std::sscanf(str.c_str(), "dp%u%c", &d, &tail) != 1 || d == 0 || d > 4096) return false;
  if (str != "dp" + std::to_string(d)) return false;
  spec->kind = DsSpec::kDp;
  spec->D = d;
  return true;
}

Result<std::vector<std::string>> DeepSpeedSpecs(const DeepSpeedSource& src) {
  ds::Checkpoint c(src);
  RETURN_IF_ERROR(c.Decode());
  if (c.moe) {  // dpD for D a multiple of EP; no universal view
    std::vector<std::string> specs;
    for (uint32_t d : {1u, 2u, 4u, 8u, 16u}) {
      if (d % c.moe->ep == 0) specs.push_back("dp" + std::to_string(d));
    }
    return specs;
  }
  return std::vector<std::string>{"dp1", "dp2", "dp4", "dp8", "universal"};
}

Result<std::vector<ViewEntry>> PlanDeepSpeed(const DeepSpeedSource& src, const DsSpec& spec) {
  ds::Checkpoint c(src);
  RETURN_IF_ERROR(c.Decode());
  std::vector<ViewEntry> out;
  if (c.moe) {
    if (spec.kind == DsSpec::kUniversal) {
      return Invalid("a DeepSpeed MoE checkpoint (expert files, moe param groups) has no "
                     "universal view: DeepSpeed defines none for native MoE experts "
                     "(ds_to_universal skips their files; universal loading finds a "
                     "parameter by its name, and every EP rank names its experts 0..E/EP-1)");
    }
    if (spec.kind == DsSpec::kTpDp) {
      return Invalid("a DeepSpeed MoE checkpoint has no tensor-parallel views yet (tp" +
                     std::to_string(spec.T) + "-dp" + std::to_string(spec.D) + "); its dpD "
                     "views keep the expert-parallel size");
    }
    RETURN_IF_ERROR(ds::PlanDpMoe(c, spec.D, &out));
  } else if (c.z3) {
    if (spec.kind == DsSpec::kUniversal) {
      RETURN_IF_ERROR(ds::PlanUniversalZero3(c, &out));
    } else if (spec.kind == DsSpec::kDp || spec.T == 1) {  // tp1-dpD: the source's own TP size
      RETURN_IF_ERROR(ds::PlanDpZero3(c, spec.D, &out));
    } else {
      return Invalid("a ZeRO stage 3 checkpoint has no tensor-parallel views: tp" +
                     std::to_string(spec.T) + " would split its parameters, which stage 3 "
                     "sources without universal_checkpoint_info do not describe");
    }
  } else if (spec.kind == DsSpec::kUniversal) {
    RETURN_IF_ERROR(ds::PlanUniversal(c, &out));
  } else if (spec.kind == DsSpec::kTpDp && spec.T != c.tp.size()) {
    RETURN_IF_ERROR(ds::PlanTpDp(c, spec.T, spec.D, &out));
  } else if (spec.kind == DsSpec::kTpDp) {
    // The source's own TP size: nothing to split, so universal_checkpoint_info is not needed;
    // without it the view is dpD's.
    ASSIGN_OR_RETURN(const ds::UcInfo uc, ds::UcInfo::Read(c));
    RETURN_IF_ERROR(uc.present ? ds::PlanTpDp(c, spec.T, spec.D, &out) : ds::PlanDp(c, spec.D, &out));
  } else {
    RETURN_IF_ERROR(ds::PlanDp(c, spec.D, &out));
  }
  if (spec.kind != DsSpec::kUniversal) {  // ds_to_universal copies only the tag's model files
    for (const DsRootFile& r : src.root_files) {
      ViewEntry e{r.name, {}};
      e.file.recipe.AddGather(1, {Part{r.source, 0, r.size, r.size}});
      out.push_back(std::move(e));
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const ViewEntry& a, const ViewEntry& b) { return a.path < b.path; });
  }
  return out;
}

}  // namespace ckptfs::reshard
