#include "reshard/deepspeed.h"

#include <cstdio>
#include <map>
#include <optional>
#include <algorithm>
#include <functional>

#include "formats/pickle.h"
#include "reshard/torch_out.h"

namespace ckptfs::reshard {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

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
// torch.save names a file's records after the file: "fp32.pt" -> "fp32/...".
std::string ArchivePrefix(std::string_view file_name) {
  const size_t slash = file_name.rfind('/');
  if (slash != std::string_view::npos) file_name.remove_prefix(slash + 1);
  const size_t dot = file_name.rfind('.');
  return std::string(dot == std::string_view::npos ? file_name : file_name.substr(0, dot));
}

ValuePtr Str(std::string s) { return pickle::MakeStr(std::move(s)); }

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
};

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0, offset = 0;  // in its group's flat buffer, elements
};

// One optimizer file (one dp rank of one TP rank), decoded.
struct Optim {
  const DsSourceFile* file = nullptr;
  TensorIndex tensors;
  ValuePtr root, osd, base, state;
  std::vector<const TorchTensor*> fp32;       // per group, padding stripped
  std::vector<ValuePtr> group_state;          // per group: the state mapping (null: none yet)
  std::vector<ValuePtr> mappings;             // per group: param_slice_mappings
};

// One TP rank: its model-states file and its optimizer files by dp rank.
struct TpRank {
  const DsSourceFile* model = nullptr;
  TensorIndex model_tensors;
  std::vector<std::vector<Param>> groups;  // param_shapes, with offsets
  std::vector<Optim> optim;                // by dp rank
  std::vector<uint64_t> totals;            // per group: real elements
};

class Planner {
 public:
  explicit Planner(const DeepSpeedSource& src) : src_(src) {}
  Result<std::vector<ViewEntry>> Run(const DsSpec& spec);

 private:
  Status Decode();
  Status DecodeOptim(TpRank* tr, uint32_t d);
  Status CheckMappings(const TpRank& tr, uint32_t d) const;
  // The source pieces holding elements [from, to) of group g's flat buffer, of the tensor `pick`
  // selects in each dp rank's file (the fp32 partition, or a state tensor).
  Result<std::vector<Part>> Flat(const TpRank& tr, size_t g, uint64_t from, uint64_t to,
                                 const std::function<const TorchTensor*(const Optim&)>& pick,
                                 const std::string& what) const;
  const TorchTensor* StateTensor(const Optim& o, size_t g, const std::string& key) const;

  Result<ViewEntry> PlanDpOptim(const TpRank& tr, uint32_t tp, uint32_t d, uint32_t D);
  Result<ViewEntry> PlanModelStates(const TpRank& tr, uint32_t tp, uint32_t D);
  Status PlanUniversal(std::vector<ViewEntry>* out);
  Result<ViewEntry> UniversalState(const TpRank& tr, size_t g, const Param& p,
                                   const std::string& key, const std::string& path);

  const DeepSpeedSource& src_;
  std::vector<TpRank> tp_;
  uint32_t D_ = 0;             // the source's dp size
  std::string optim_prefix_;   // "", "bf16_" or "fp16_"
};

Status Planner::Decode() {
  std::map<uint32_t, const DsSourceFile*> models;
  std::map<std::pair<uint32_t, uint32_t>, const DsSourceFile*> optims;  // (tp, dp)
  for (const DsSourceFile& f : src_.files) {
    if (auto tp = ParseModelName(f.name)) {
      models[*tp] = &f;
    } else if (auto o = ParseOptimName(f.name)) {
      if (optims.empty()) optim_prefix_ = o->prefix;
      if (o->prefix != optim_prefix_) {
        return Invalid(src_.tag + " mixes optimizer files of different precisions (" + f.name +
                       ")");
      }
      optims[{o->tp, o->dp}] = &f;
    }
  }
  if (models.empty()) return Invalid(src_.tag + " holds no mp_rank_*_model_states.pt");
  const uint32_t T = static_cast<uint32_t>(models.size());
  if (models.rbegin()->first != T - 1) {
    return Invalid(src_.tag + " does not hold mp_rank_00 .. mp_rank_" + std::to_string(T - 1));
  }
  tp_.resize(T);
  for (uint32_t t = 0; t < T; ++t) {
    TpRank& tr = tp_[t];
    tr.model = models.at(t);
    tr.model_tensors = IndexTensors(*tr.model->file);
    const ValuePtr& root = tr.model->file->root;
    const std::string where = src_.tag + "/" + tr.model->name;
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
    if (t == 0) D_ = static_cast<uint32_t>(dpws->i);
    if (dpws->i != D_) return Invalid("the model-states files disagree on dp_world_size");
    ValuePtr shapes = Get(root, "param_shapes");
    if (!shapes || shapes->kind != Kind::kList) {
      return Invalid(where + " has no param_shapes (not a ZeRO stage 1/2 checkpoint)");
    }
    for (const ValuePtr& g : shapes->items) {
      if (!IsMapping(g)) return Invalid(where + ": param_shapes holds a non-mapping");
      std::vector<Param> params;
      uint64_t off = 0;
      for (const auto& [k, v] : PairsOf(*g)) {
        Param p;
        p.name = KeyName(k);
        if (!IntsOf(v, &p.shape)) return Invalid(where + ": the shape of " + p.name);
        p.numel = 1;
        for (int64_t x : p.shape) p.numel *= static_cast<uint64_t>(std::max<int64_t>(x, 0));
        p.offset = off;
        off += p.numel;
        params.push_back(std::move(p));
      }
      tr.groups.push_back(std::move(params));
      tr.totals.push_back(off);
    }
    tr.optim.resize(D_);
    for (uint32_t d = 0; d < D_; ++d) {
      auto it = optims.find({t, d});
      if (it == optims.end()) {
        return Invalid("optimizer file " + OptimFileName(optim_prefix_, d, t) + " of " +
                       src_.tag + " is missing (dp_world_size " + std::to_string(D_) + ")");
      }
      tr.optim[d].file = it->second;
      RETURN_IF_ERROR(DecodeOptim(&tr, d));
    }
    for (uint32_t d = 0; d < D_; ++d) RETURN_IF_ERROR(CheckMappings(tr, d));
  }
  for (const auto& [key, f] : optims) {
    if (key.first >= T || key.second >= D_) {
      return Invalid(f->name + " lies outside dp_world_size " + std::to_string(D_) +
                     " x mp_world_size " + std::to_string(T));
    }
  }
  return Status::Ok();
}

Status Planner::DecodeOptim(TpRank* tr, uint32_t d) {
  Optim& o = tr->optim[d];
  const std::string where = src_.tag + "/" + o.file->name;
  o.tensors = IndexTensors(*o.file->file);
  o.root = o.file->file->root;
  o.osd = Get(o.root, "optimizer_state_dict");
  if (!IsMapping(o.osd)) return Invalid(where + " has no optimizer_state_dict");
  ValuePtr stage = Get(o.osd, "zero_stage");
  if (stage && stage->kind == Kind::kObject && stage->args && !stage->args->items.empty()) {
    stage = stage->args->items[0];  // a ZeroStageEnum member: the enum called with its value
  }
  if (stage && stage->kind == Kind::kInt && stage->i == 3) {
    return Invalid("ZeRO stage 3 checkpoints have no views yet");
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
  const size_t G = tr->groups.size();
  if (fp32->items.size() != G || maps->items.size() != G) {
    return Invalid(where + " has " + std::to_string(fp32->items.size()) +
                   " parameter groups; param_shapes has " + std::to_string(G));
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
    const Partitioning part(tr->totals[g], D_);
    if (it == o.tensors.end() || it->second->shape.size() != 1 ||
        it->second->dtype.empty() || !IsContiguous(it->second->shape, it->second->stride)) {
      return Invalid(where + ": single_partition_of_fp32_groups[" + std::to_string(g) +
                     "] is not a 1-D tensor");
    }
    if (static_cast<uint64_t>(it->second->shape[0]) != part.Real(d)) {
      return Invalid(where + ": group " + std::to_string(g) + " holds " +
                     std::to_string(it->second->shape[0]) + " fp32 elements; param_shapes and " +
                     "dp_world_size " + std::to_string(D_) + " give " +
                     std::to_string(part.Real(d)));
    }
    o.fp32.push_back(it->second);
    if (!IsMapping(maps->items[g])) return Invalid(where + ": param_slice_mappings");
    o.mappings.push_back(maps->items[g]);
    if (!o.group_state[g]) continue;
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
  }
  return Status::Ok();
}

// The fragment a dp rank's partition holds of each parameter, as DeepSpeed's
// _create_param_mapping computes it: {name: (numel, start in the partition)}.
std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> Fragments(
    const std::vector<Param>& params, const Partitioning& part, uint64_t d) {
  std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> out;
  const uint64_t lo = d * part.size, hi = lo + part.size;
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

Status Planner::CheckMappings(const TpRank& tr, uint32_t d) const {
  // The views place parameters by param_shapes' order; the source's own mappings must agree
  // (they do not under round_robin_gradients).
  const Optim& o = tr.optim[d];
  for (size_t g = 0; g < tr.groups.size(); ++g) {
    const auto want = Fragments(tr.groups[g], Partitioning(tr.totals[g], D_), d);
    const auto& have = PairsOf(*o.mappings[g]);
    bool same = want.size() == have.size();
    for (size_t i = 0; same && i < want.size(); ++i) {
      same = KeyName(have[i].first) == want[i].first &&
             IntField(have[i].second, "numel") == static_cast<int64_t>(want[i].second.first) &&
             IntField(have[i].second, "start") == static_cast<int64_t>(want[i].second.second);
    }
    if (!same) {
      return Invalid(src_.tag + "/" + o.file->name + ": param_slice_mappings of group " +
                     std::to_string(g) + " do not follow param_shapes (round_robin_gradients?)");
    }
  }
  return Status::Ok();
}

const TorchTensor* Planner::StateTensor(const Optim& o, size_t g, const std::string& key) const {
  ValuePtr v = Get(o.group_state[g], key);
  if (!v) return nullptr;
  auto it = o.tensors.find(v.get());
  return it == o.tensors.end() ? nullptr : it->second;
}

Result<std::vector<Part>> Planner::Flat(
    const TpRank& tr, size_t g, uint64_t from, uint64_t to,
    const std::function<const TorchTensor*(const Optim&)>& pick, const std::string& what) const {
  const Partitioning part(tr.totals[g], D_);
  std::vector<Part> parts;
  for (uint64_t e = from; e < to;) {
    const uint64_t r = e / part.size;
    const uint64_t end = std::min(to, part.End(r));
    const TorchTensor* t = pick(tr.optim[r]);
    if (!t) return Invalid(tr.optim[r].file->name + " has no " + what);
    const uint64_t item = DtypeSize(t->dtype);
    if (item == 0) return Invalid(what + " has an unknown dtype " + t->dtype);
    const uint64_t at = t->offset + (e - part.Begin(r)) * item, len = (end - e) * item;
    if (!parts.empty() && parts.back().source == tr.optim[r].file->source &&
        parts.back().offset + parts.back().len == at) {
      parts.back().len += len;
    } else {
      parts.push_back(Part{tr.optim[r].file->source, at, len, len});
    }
    e = end;
  }
  return parts;
}

Result<ViewEntry> Planner::PlanDpOptim(const TpRank& tr, uint32_t tp, uint32_t d, uint32_t D) {
  const Optim& o0 = tr.optim[0];
  const size_t G = tr.groups.size();
  TorchOut out;
  auto copy = [&](const ValuePtr& v) { return out.Copy(o0.tensors, o0.file->source, v); };

  // base_optimizer_state: rank 0's, with every partition-sized state tensor re-cut.
  ValuePtr state = EmptyLike(o0.state);
  for (const auto& [gk, gs] : PairsOf(*o0.state)) {
    const size_t g = static_cast<size_t>(gk->i);
    const Partitioning part(tr.totals[g], D);
    ValuePtr ns = EmptyLike(gs);
    for (const auto& [k, v] : PairsOf(*gs)) {
      auto t = o0.tensors.find(v.get());
      if (t == o0.tensors.end() || t->second->shape.empty()) {
        ASSIGN_OR_RETURN(ValuePtr nv, copy(v));
        Put(ns, k, nv);
        continue;
      }
      const std::string key = KeyName(k);
      const uint64_t item = DtypeSize(t->second->dtype);
      ASSIGN_OR_RETURN(std::vector<Part> parts,
                       Flat(tr, g, part.Begin(d), part.End(d),
                            [&](const Optim& o) { return StateTensor(o, g, key); },
                            "optimizer state '" + key + "' of group " + std::to_string(g)));
      std::vector<Gather> gathers;
      if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
      if (part.Padding(d)) gathers.push_back(Gather{1, {}, part.Padding(d) * item});
      const int64_t n = static_cast<int64_t>(part.size);
      Put(ns, k, out.NewTensor(*t->second->node, std::move(gathers), {n}, {1}, part.size * item));
    }
    Put(state, gk, ns);
  }
  ValuePtr base = EmptyLike(o0.base);
  for (const auto& [k, v] : PairsOf(*o0.base)) {
    if (KeyName(k) == "state") {
      Put(base, k, state);
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, copy(v));
      Put(base, k, nv);
    }
  }

  // The fp32 partitions (padding stripped), the paddings and the slice mappings.
  std::vector<ValuePtr> fp32, paddings, counts, mappings;
  ValuePtr fragment_class;  // a source fragment_address, the template for new ones
  for (const Optim& o : tr.optim) {
    for (const ValuePtr& m : o.mappings) {
      if (!fragment_class && !PairsOf(*m).empty()) fragment_class = PairsOf(*m)[0].second;
    }
  }
  for (size_t g = 0; g < G; ++g) {
    const Partitioning part(tr.totals[g], D);
    const TorchTensor& like = *o0.fp32[g];
    ASSIGN_OR_RETURN(std::vector<Part> parts,
                     Flat(tr, g, part.Begin(d), part.End(d),
                          [&](const Optim& o) { return o.fp32[g]; },
                          "fp32 partition of group " + std::to_string(g)));
    std::vector<Gather> gathers;
    if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
    const int64_t n = static_cast<int64_t>(part.Real(d));
    fp32.push_back(out.NewTensor(*like.node, std::move(gathers), {n}, {1},
                                 part.Real(d) * DtypeSize(like.dtype)));
    paddings.push_back(pickle::MakeInt(static_cast<int64_t>(part.Padding(d))));
    ValuePtr m = EmptyLike(o0.mappings[g]);
    for (const auto& [name, frag] : Fragments(tr.groups[g], part, d)) {
      if (!fragment_class) return Invalid("the source's param_slice_mappings are all empty");
      auto fa = std::make_shared<Value>(*fragment_class);
      ValuePtr st = fragment_class->state ? EmptyLike(fragment_class->state) : nullptr;
      if (!st) return Invalid("a fragment_address without state");
      for (const auto& [fk, fv] : PairsOf(*fragment_class->state)) {
        const std::string f = KeyName(fk);
        const uint64_t x = f == "numel" ? frag.first : f == "start" ? frag.second : 0;
        Put(st, fk, (f == "numel" || f == "start") ? pickle::MakeInt(static_cast<int64_t>(x)) : fv);
      }
      fa->state = st;
      Put(m, Str(name), fa);
    }
    mappings.push_back(m);
  }
  ValuePtr pc = Get(o0.osd, "partition_count");
  if (pc && pc->kind == Kind::kList) {
    for (size_t i = 0; i < pc->items.size(); ++i) counts.push_back(pickle::MakeInt(D));
  }

  ValuePtr osd = EmptyLike(o0.osd);
  for (const auto& [k, v] : PairsOf(*o0.osd)) {
    const std::string key = KeyName(k);
    if (key == "base_optimizer_state") {
      Put(osd, k, base);
    } else if (key == "single_partition_of_fp32_groups") {
      Put(osd, k, pickle::MakeList(fp32));
    } else if (key == "group_paddings") {
      Put(osd, k, pickle::MakeList(paddings));
    } else if (key == "partition_count" && pc && pc->kind == Kind::kList) {
      Put(osd, k, pickle::MakeList(counts));
    } else if (key == "param_slice_mappings") {
      Put(osd, k, pickle::MakeList(mappings));
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, copy(v));
      Put(osd, k, nv);
    }
  }
  ValuePtr root = EmptyLike(o0.root);
  for (const auto& [k, v] : PairsOf(*o0.root)) {
    if (KeyName(k) == "optimizer_state_dict") {
      Put(root, k, osd);
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, copy(v));
      Put(root, k, nv);
    }
  }
  const std::string name = OptimFileName(optim_prefix_, d, tp);
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(name), root, o0.file->extra_records));
  return ViewEntry{src_.tag + "/" + name, std::move(f)};
}

// A model-states file with dp_world_size set to D. Its storages are the source's records,
// whole and under their own keys (so the module's tensors keep sharing their flat buffers).
Result<ViewEntry> Planner::PlanModelStates(const TpRank& tr, uint32_t tp, uint32_t D) {
  const TorchFile& f = *tr.model->file;
  ValuePtr root = EmptyLike(f.root);
  for (const auto& [k, v] : PairsOf(*f.root)) {
    Put(root, k, KeyName(k) == "dp_world_size" ? pickle::MakeInt(D) : v);
  }
  ASSIGN_OR_RETURN(std::string pkl, pickle::Write(root, 2));
  TorchZipWriter zip(f.prefix);
  zip.AddBytes("data.pkl", std::move(pkl));
  for (const auto& [key, s] : f.pickle.storages) {
    std::vector<Gather> g;
    if (s.nbytes()) g.push_back(Gather{1, {Part{tr.model->source, s.data_offset, s.nbytes(), s.nbytes()}}});
    zip.AddGathers("data/" + key, g);
  }
  for (const auto& [name, bytes] : tr.model->extra_records) zip.AddBytes(name, bytes);
  return ViewEntry{src_.tag + "/" + ModelName(tp), zip.Finish()};
}

// The universal view's file for state `key` ("fp32" or an optimizer state) of parameter p of
// TP rank tr's group g: {'cat_dim': 0, 'param': the full tensor}.
Result<ViewEntry> Planner::UniversalState(const TpRank& tr, size_t g, const Param& p,
                                          const std::string& key, const std::string& path) {
  auto pick = [&](const Optim& o) -> const TorchTensor* {
    return key == "fp32" ? o.fp32[g] : StateTensor(o, g, key);
  };
  // The dp rank holding the parameter's first element supplies the tensor's type.
  const Partitioning part(tr.totals[g], D_);
  const Optim& first = tr.optim[std::min<uint64_t>(p.offset / part.size, D_ - 1)];
  const TorchTensor* like = pick(first);
  const std::string what = "'" + key + "' of " + p.name;
  if (!like) return Invalid(first.file->name + " has no " + what);
  ASSIGN_OR_RETURN(std::vector<Part> parts, Flat(tr, g, p.offset, p.offset + p.numel, pick, what));
  std::vector<Gather> gathers;
  if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
  TorchOut out;
  ValuePtr t = out.NewTensor(*like->node, std::move(gathers), p.shape, ContiguousStride(p.shape),
                             p.numel * DtypeSize(like->dtype));
  ValuePtr root = pickle::MakeDict({{Str("cat_dim"), pickle::MakeInt(0)}, {Str("param"), t}});
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(path), root, first.file->extra_records));
  return ViewEntry{path, std::move(f)};
}

Status Planner::PlanUniversal(std::vector<ViewEntry>* out) {
  if (tp_.size() > 1) {
    return Invalid("universal views of tensor-parallel DeepSpeed checkpoints (mp_world_size " +
                   std::to_string(tp_.size()) + ") are not supported yet");
  }
  const TpRank& tr = tp_[0];
  for (const auto& [k, v] : PairsOf(*tr.model->file->root)) {
    if (KeyName(k) == "universal_checkpoint_info" && IsMapping(v)) {
      for (const auto& [pk, pv] : PairsOf(*v)) {
        const std::string name = KeyName(pk);
        if (name.ends_with("_patterns") || name.starts_with("parameter_with")) {
          if (pv && !pv->items.empty()) {
            return Invalid("universal_checkpoint_info's " + name +
                           " is not supported yet (only the default: cat_dim 0)");
          }
        }
      }
    }
  }
  out->push_back(ViewEntry{"latest_universal", {}});
  out->back().file.recipe.AddLiteral(src_.tag);
  for (size_t t = 0; t < tp_.size(); ++t) {
    const DsSourceFile& m = *tp_[t].model;
    ViewEntry e{src_.tag + "/" + m.name, {}};
    e.file.recipe.AddGather(1, {Part{m.source, 0, m.size, m.size}});
    out->push_back(std::move(e));
  }

  // zero/optimizer_state.pt: dp rank 0's state without the partitioned entries.
  const Optim& o0 = tr.optim[0];
  {
    TorchOut o;
    ValuePtr root = EmptyLike(o0.osd);
    for (const auto& [k, v] : PairsOf(*o0.osd)) {
      const std::string key = KeyName(k);
      if (key == "base_optimizer_state" || key == "param_slice_mappings" ||
          key == "single_partition_of_fp32_groups") {
        continue;
      }
      if (key == "group_paddings" && v && v->kind == Kind::kList) {
        std::vector<ValuePtr> zeros(v->items.size(), pickle::MakeInt(0));
        Put(root, k, pickle::MakeList(std::move(zeros)));
        continue;
      }
      ASSIGN_OR_RETURN(ValuePtr nv, o.Copy(o0.tensors, o0.file->source, v));
      Put(root, k, nv);
    }
    ASSIGN_OR_RETURN(ValuePtr groups,
                     o.Copy(o0.tensors, o0.file->source, Get(o0.base, "param_groups")));
    Put(root, Str("param_groups"), groups);
    const std::string path = src_.tag + "/zero/optimizer_state.pt";
    ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), root, o0.file->extra_records));
    out->push_back(ViewEntry{path, std::move(f)});
  }

  for (size_t g = 0; g < tr.groups.size(); ++g) {
    // The state's keys, in the order the optimizer made them.
    std::vector<std::string> keys;
    ValuePtr step;
    const Optim* step_of = nullptr;
    for (const Optim& o : tr.optim) {
      if (!o.group_state[g]) continue;
      for (const auto& [k, v] : PairsOf(*o.group_state[g])) {
        const std::string key = KeyName(k);
        auto t = o.tensors.find(v.get());
        if (key == "step") continue;
        if (t == o.tensors.end() || t->second->shape.empty()) {
          return Invalid("optimizer state '" + key + "' is not a tensor; the universal view "
                         "cannot split it per parameter");
        }
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      }
    }
    for (const Param& p : tr.groups[g]) {
      if (p.name.empty() || p.name.find('/') != std::string::npos || p.name == "." ||
          p.name == "..") {
        return Invalid("parameter name '" + p.name + "' cannot name a directory");
      }
      const std::string dir = src_.tag + "/zero/" + p.name + "/";
      ASSIGN_OR_RETURN(ViewEntry fp32, UniversalState(tr, g, p, "fp32", dir + "fp32.pt"));
      out->push_back(std::move(fp32));
      for (const std::string& key : keys) {
        ASSIGN_OR_RETURN(ViewEntry e, UniversalState(tr, g, p, key, dir + key + ".pt"));
        out->push_back(std::move(e));
      }
      // step.pt: the raw step of the first dp rank holding a piece of the parameter.
      const Partitioning part(tr.totals[g], D_);
      step_of = &tr.optim[std::min<uint64_t>(p.offset / part.size, D_ - 1)];
      step = Get(step_of->group_state[g], "step");
      if (step) {
        TorchOut o;
        ASSIGN_OR_RETURN(ValuePtr v, o.Copy(step_of->tensors, step_of->file->source, step));
        const std::string path = dir + "step.pt";
        ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), v, step_of->file->extra_records));
        out->push_back(ViewEntry{path, std::move(f)});
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<ViewEntry>> Planner::Run(const DsSpec& spec) {
  RETURN_IF_ERROR(Decode());
  std::vector<ViewEntry> out;
  if (spec.kind == DsSpec::kUniversal) {
    RETURN_IF_ERROR(PlanUniversal(&out));
    return out;
  }
  out.push_back(ViewEntry{"latest", {}});
  out.back().file.recipe.AddLiteral(src_.tag);
  for (uint32_t t = 0; t < tp_.size(); ++t) {
    ASSIGN_OR_RETURN(ViewEntry m, PlanModelStates(tp_[t], t, spec.D));
    out.push_back(std::move(m));
    for (uint32_t d = 0; d < spec.D; ++d) {
      ASSIGN_OR_RETURN(ViewEntry e, PlanDpOptim(tp_[t], t, d, spec.D));
      out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace

bool IsDeepSpeedSourceName(std::string_view name) {
  return ParseModelName(name).has_value() || ParseOptimName(name).has_value();
}

bool ParseDsSpec(std::string_view s, DsSpec* spec) {
  if (s == "universal") {
    spec->kind = DsSpec::kUniversal;
    spec->D = 0;
    return true;
  }
  unsigned d = 0;
  char tail = 0;
  const std::string str(s);
  if (std::sscanf(str.c_str(), "dp%u%c", &d, &tail) != 1 || d == 0 || d > 4096) return false;
  if (str != "dp" + std::to_string(d)) return false;
  spec->kind = DsSpec::kDp;
  spec->D = d;
  return true;
}

Result<std::vector<ViewEntry>> PlanDeepSpeed(const DeepSpeedSource& src, const DsSpec& spec) {
  return Planner(src).Run(spec);
}

}  // namespace ckptfs::reshard
