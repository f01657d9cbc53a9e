// The tpT-dpD view: a Megatron-DeepSpeed checkpoint as DeepSpeed holds it after loading its
// universal form at TP=T, DP=D (deepspeed/checkpoint/universal_checkpoint.py): every parameter's
// full tensor (merged by universal_checkpoint_info's patterns) cut again for T, the vocabulary
// zero-padded to its padded size for T, then laid out in ZeRO partitions for D.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Whether every target rank holds the parameter whole (replicated, or averaged over the source's
// ranks).
bool Whole(const Merge& m) { return m.kind == Merge::kReplicated || m.kind == Merge::kAverage; }

ValuePtr ArgsDict(const ValuePtr& args) {
  if (args && args->kind == Kind::kObject && args->state && IsMapping(args->state)) {
    return args->state;
  }
  return IsMapping(args) ? args : nullptr;
}
void Set(const ValuePtr& m, std::string_view key, ValuePtr v) {
  if (!IsMapping(m)) return;
  for (auto& [k, x] : PairsOf(*m)) {
    if (KeyName(k) == key) x = v;
  }
}
ValuePtr SizeLike(const std::vector<int64_t>& shape) {
  std::vector<ValuePtr> xs;
  for (int64_t x : shape) xs.push_back(pickle::MakeInt(x));
  return pickle::MakeCall(pickle::MakeGlobal("torch", "Size"),
                          pickle::MakeTuple({pickle::MakeTuple(std::move(xs))}));
}

// One parameter of the target: how it merges, the full tensor's shape, its shape for T.
struct TargetParam {
  std::string name;
  Merge merge;
  std::vector<Located> slices;
  std::vector<int64_t> full_shape, shape;
};

class TpPlanner {
 public:
  TpPlanner(const Checkpoint& c, uint32_t T, uint32_t D) : c_(c), T_(T), D_(D) {}
  Status Run(std::vector<ViewEntry>* out);

 private:
  // Target rank t's slice of a full tensor (shape as full_shape, bytes per element `item`).
  std::vector<Gather> SliceOf(const TargetParam& p, const std::vector<Gather>& full,
                              uint64_t item, uint32_t t) const;
  Result<ViewEntry> ModelStates(uint32_t t);
  // The module tensor at key path `name` of TP rank tr's module; nullptr when absent.
  const TorchTensor* ModuleTensor(const TpRank& tr, const std::string& name) const;
  // A parameter's 16-bit (module) tensor on source TP rank i, and the source holding it.
  using TensorAt = std::function<std::pair<const TorchTensor*, uint32_t>(size_t i)>;
  // The full module tensor of p, merged from its source TP ranks' tensors `at` gives.
  Result<std::vector<Gather>> ModuleFull(const TargetParam& p, const TensorAt& at, uint64_t* item,
                                         const TorchTensor** like) const;
  // A module tensor of rank t: p's full module tensor (from `at`) cut for t.
  Result<ValuePtr> ModuleSlice(TorchOut* out, const TargetParam& p, const TensorAt& at,
                               uint32_t t) const;
  // The pipeline layer files of target rank t (Megatron-DeepSpeed's GPTModelPipe).
  Status LayerFiles(uint32_t t, std::vector<ViewEntry>* out) const;
  // Fills layers_ from the source's layer files. Errors: names without a TP rank, a layer
  // missing on some TP rank, a file that is not a state_dict.
  Status ReadLayers();

  const Checkpoint& c_;
  const uint32_t T_, D_;
  UcInfo uc_;
  int64_t padded_ = -1;  // vocabulary rows for T
  const std::vector<std::vector<TargetParam>>* groups_ = nullptr;  // by group, TP rank 0's order
  std::unordered_map<std::string, const TargetParam*> by_name_;
  // Tied modules' parameters by their key in a layer file ("tied_modules.<tied>.<key>" ->
  // <key>); nullptr for a key in several tied modules.
  std::unordered_map<std::string, const TargetParam*> tied_;
  // The layer files by layer index, each by source TP rank, with their tensors.
  struct Layer {
    std::vector<const DsLayerFile*> by_tp;
    std::vector<TensorIndex> tensors;
  };
  std::map<uint32_t, Layer> layers_;
};

// Rank t's share of `full`, a tensor of `shape` with `item`-byte elements, when each of `subs`
// (sizes along dimension `dim`, one after another) is cut in T: the shares one after another.
// One sub-parameter is a plain row- or column-parallel cut, two are SwiGLU's halves.
std::vector<Gather> Shares(const std::vector<Gather>& full, const std::vector<int64_t>& shape,
                           uint64_t item, size_t dim, const std::vector<int64_t>& subs, uint32_t T,
                           uint32_t t) {
  uint64_t inner = item;  // bytes per index of `dim`, within one row of the dimensions before it
  for (size_t i = dim + 1; i < shape.size(); ++i) inner *= static_cast<uint64_t>(shape[i]);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  uint64_t at = 0;
  for (int64_t sub : subs) {
    const uint64_t share = static_cast<uint64_t>(sub) / T * inner;
    ranges.push_back({at + t * share, at + (t + 1) * share});
    at += static_cast<uint64_t>(sub) * inner;
  }
  if (dim > 0) return Columns(full, ranges);
  std::vector<Gather> out;
  for (const auto& [from, to] : ranges) {
    std::vector<Gather> more = Cut(full, from, to);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

std::vector<Gather> TpPlanner::SliceOf(const TargetParam& p, const std::vector<Gather>& full,
                                       uint64_t item, uint32_t t) const {
  const Merge& m = p.merge;
  if (Whole(m) && !m.vocab) return full;
  if (m.vocab) {
    // Zero rows up to padded_, then (unless replicated) rank t's rows.
    std::vector<int64_t> shape = p.full_shape;
    uint64_t row = item;
    for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<uint64_t>(shape[i]);
    std::vector<Gather> padded = full;
    const uint64_t extra = static_cast<uint64_t>(padded_ - shape[0]) * row;
    if (extra) padded.push_back(Gather{1, {}, extra});
    if (Whole(m)) return padded;
    shape[0] = padded_;
    return Shares(padded, shape, item, 0, {padded_}, T_, t);
  }
  if (m.kind == Merge::kSubParams) {
    return Shares(full, p.full_shape, item, m.partition_dim, m.subs, T_, t);
  }
  const size_t dim = m.kind == Merge::kTwoSubParams ? 0 : static_cast<size_t>(m.cat_dim);
  const int64_t n = p.full_shape[dim];
  return Shares(full, p.full_shape, item, dim,
                m.kind == Merge::kTwoSubParams ? std::vector<int64_t>{n / 2, n / 2}
                                               : std::vector<int64_t>{n},
                T_, t);
}

const TorchTensor* TpPlanner::ModuleTensor(const TpRank& tr, const std::string& name) const {
  // The module's nested dicts joined with '.' give the parameter's name.
  std::vector<std::pair<ValuePtr, std::string>> todo = {{Get(tr.model->file->root, "module"), ""}};
  while (!todo.empty()) {
    auto [m, prefix] = todo.back();
    todo.pop_back();
    if (!IsMapping(m)) continue;
    for (const auto& [k, v] : PairsOf(*m)) {
      const std::string path = prefix + KeyName(k);
      if (path == name) {
        auto it = tr.model_tensors.find(v.get());
        return it == tr.model_tensors.end() ? nullptr : it->second;
      }
      if (name.starts_with(path + ".")) todo.push_back({v, path + "."});
    }
  }
  return nullptr;
}

Result<std::vector<Gather>> TpPlanner::ModuleFull(const TargetParam& p, const TensorAt& at,
                                                  uint64_t* item, const TorchTensor** like) const {
  if (p.merge.kind == Merge::kAverage) {
    // What DeepSpeed's universal loading leaves in the 16-bit weight: the fp32 mean, rounded.
    const TorchTensor* t = at(0).first;
    if (!t || t->shape != p.slices[0].p->shape) {
      return Invalid("module tensor " + p.name + " of TP rank 0 is missing or differs from "
                     "param_shapes");
    }
    MeanOut out;
    if (t->dtype == "bfloat16") {
      out = MeanOut::kBFloat16;
    } else if (t->dtype == "float16") {
      out = MeanOut::kFloat16;
    } else if (t->dtype == "float32") {
      out = MeanOut::kFloat32;
    } else {
      return Invalid("module tensor " + p.name + " is " + t->dtype + "; an averaged parameter's "
                     "weight is made as bfloat16, float16 or float32 only");
    }
    ASSIGN_OR_RETURN(FullTensor full, Full(c_, p.slices, p.merge, "fp32"));
    for (Gather& g : full.gathers) g.mean_out = out;
    *like = t;
    *item = DtypeSize(t->dtype);
    return full.gathers;
  }
  std::vector<const TorchTensor*> ts;
  std::vector<uint32_t> sources;
  for (size_t i = 0; i < p.slices.size(); ++i) {
    const auto [t, source] = at(i);
    if (!t || !IsContiguous(t->shape, t->stride) || t->shape != p.slices[i].p->shape ||
        (!ts.empty() && t->dtype != ts[0]->dtype)) {
      return Invalid("module tensor " + p.name + " of TP rank " + std::to_string(i) +
                     " is missing or differs from param_shapes or from TP rank 0's dtype");
    }
    ts.push_back(t);
    sources.push_back(source);
    if (p.merge.kind == Merge::kReplicated) break;
  }
  *like = ts[0];
  *item = DtypeSize(ts[0]->dtype);
  std::vector<std::vector<int64_t>> shapes;
  for (const Located& s : p.slices) shapes.push_back(s.p->shape);
  ASSIGN_OR_RETURN(MergeLayout l, LayoutOf(p.merge, shapes, "module tensor " + p.name));
  // The module tensors are contiguous: the full tensor is one gather of the layout's rows.
  std::vector<Part> parts;
  for (const MergeLayout::Piece& pc : l.pieces) {
    parts.push_back(Part{sources[pc.slice], ts[pc.slice]->offset + pc.from * *item,
                         pc.len * *item, l.widths[pc.slice] * *item});
  }
  std::vector<Gather> full{Gather{l.rows, std::move(parts)}};
  if (p.merge.vocab) {
    uint64_t keep = *item;
    for (int64_t x : p.full_shape) keep *= static_cast<uint64_t>(x);
    full = Cut(full, 0, keep);
  }
  return full;
}

Result<ValuePtr> TpPlanner::ModuleSlice(TorchOut* out, const TargetParam& p, const TensorAt& at,
                                        uint32_t t) const {
  uint64_t item = 0;
  const TorchTensor* like = nullptr;
  ASSIGN_OR_RETURN(std::vector<Gather> full, ModuleFull(p, at, &item, &like));
  uint64_t nbytes = item;
  for (int64_t x : p.shape) nbytes *= static_cast<uint64_t>(x);
  return out->NewTensor(*like->node, SliceOf(p, full, item, t), p.shape, ContiguousStride(p.shape),
                        nbytes);
}

Result<ViewEntry> TpPlanner::ModelStates(uint32_t t) {
  const TpRank& primary = c_.tp[static_cast<size_t>(uint64_t{t} * c_.tp.size() / T_)];
  const TorchFile& f = *primary.model->file;
  TorchOut out;
  // The module: every parameter cut for rank t, everything else from the primary rank.
  std::function<Result<ValuePtr>(const ValuePtr&, const std::string&)> module =
      [&](const ValuePtr& m, const std::string& prefix) -> Result<ValuePtr> {
    ValuePtr n = EmptyLike(m);
    for (const auto& [k, v] : PairsOf(*m)) {
      const std::string path = prefix + KeyName(k);
      auto p = by_name_.find(path);
      if (p != by_name_.end()) {
        auto at = [&](size_t i) {
          const TpRank& tr = *p->second->slices[i].tr;
          return std::pair{ModuleTensor(tr, path), tr.model->source};
        };
        ASSIGN_OR_RETURN(ValuePtr nt, ModuleSlice(&out, *p->second, at, t));
        Put(n, k, nt);
      } else if (IsMapping(v)) {
        ASSIGN_OR_RETURN(ValuePtr nv, module(v, path + "."));
        Put(n, k, nv);
      } else {
        ASSIGN_OR_RETURN(ValuePtr nv, out.Copy(primary.model_tensors, primary.model->source, v));
        Put(n, k, nv);
      }
    }
    return n;
  };
  ValuePtr root = EmptyLike(f.root);
  ValuePtr src_shapes = Get(f.root, "param_shapes");
  for (const auto& [k, v] : PairsOf(*f.root)) {
    const std::string key = KeyName(k);
    if (key == "module" && IsMapping(v)) {
      ASSIGN_OR_RETURN(ValuePtr m, module(v, ""));
      Put(root, k, m);
    } else if (key == "param_shapes") {
      std::vector<ValuePtr> gs;
      for (size_t g = 0; g < groups_->size(); ++g) {
        ValuePtr m = EmptyLike(src_shapes->items[g]);
        for (const TargetParam& p : (*groups_)[g]) {
          Put(m, pickle::MakeStr(p.name), SizeLike(p.shape));
        }
        gs.push_back(m);
      }
      Put(root, k, pickle::MakeList(std::move(gs)));
    } else if (key == "dp_world_size") {
      Put(root, k, pickle::MakeInt(D_));
    } else if (key == "mp_world_size") {
      Put(root, k, pickle::MakeInt(T_));
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, out.Copy(primary.model_tensors, primary.model->source, v));
      if (key == "checkpoint_parallel_dimensions") Set(nv, "tp_degree", pickle::MakeInt(T_));
      if (key == "universal_checkpoint_info") Set(nv, "padded_vocab_size", pickle::MakeInt(padded_));
      if (key == "args") {
        ValuePtr a = ArgsDict(nv);
        Set(a, "tensor_model_parallel_size", pickle::MakeInt(T_));
        Set(a, "padded_vocab_size", pickle::MakeInt(padded_));
      }
      Put(root, k, nv);
    }
  }
  ASSIGN_OR_RETURN(ViewFile vf, out.Finish(f.prefix, root, primary.model->extra_records));
  return ViewEntry{c_.src.tag + "/" + ModelName(t), std::move(vf)};
}

Status TpPlanner::ReadLayers() {
  const size_t Ts = c_.tp.size();
  for (const DsLayerFile& l : c_.src.layers) {
    unsigned idx = 0, tp = 0;
    char tail = 0;
    char canon[96];
    if (std::sscanf(l.name.c_str(), "layer_%u-model_%u-model_states.p%c", &idx, &tp, &tail) != 3 ||
        tail != 't' ||
        (std::snprintf(canon, sizeof canon, "layer_%02u-model_%02u-model_states.pt", idx, tp),
         l.name != canon)) {
      return Invalid("layer file " + l.name + " does not name its TP rank "
                     "(layer_XX-model_TT-model_states.pt), so tpT-dpD cannot reshard it");
    }
    if (tp >= Ts) return Invalid(l.name + " lies outside the " + std::to_string(Ts) + " TP ranks");
    if (!l.file || !IsMapping(l.file->root)) {
      return Invalid(l.name + " is not a layer's state_dict");
    }
    Layer& layer = layers_[idx];
    layer.by_tp.resize(Ts, nullptr);
    layer.tensors.resize(Ts);
    layer.by_tp[tp] = &l;
    layer.tensors[tp] = IndexTensors(*l.file);
  }
  for (const auto& [idx, layer] : layers_) {
    for (size_t i = 0; i < Ts; ++i) {
      if (!layer.by_tp[i]) {
        char name[96];
        std::snprintf(name, sizeof name, "layer_%02u-model_%02zu-model_states.pt", idx, i);
        return Invalid("layer file " + std::string(name) + " of " + c_.src.tag + " is missing");
      }
    }
  }
  return Status::Ok();
}

Status TpPlanner::LayerFiles(uint32_t t, std::vector<ViewEntry>* out) const {
  const size_t Ts = c_.tp.size(), primary = static_cast<size_t>(uint64_t{t} * Ts / T_);
  for (const auto& [idx, layer] : layers_) {
    const DsLayerFile& f = *layer.by_tp[primary];
    const TensorIndex& tensors = layer.tensors[primary];
    TorchOut o;
    ValuePtr root = EmptyLike(f.file->root);
    for (const auto& [k, v] : PairsOf(*f.file->root)) {
      // The parameter's name: "<index>.<key>", or a tied module's "tied_modules.<tied>.<key>".
      const std::string key = KeyName(k);
      const TargetParam* p = nullptr;
      if (auto it = by_name_.find(std::to_string(idx) + "." + key); it != by_name_.end()) {
        p = it->second;
      } else if (auto tied = tied_.find(key); tied != tied_.end()) {
        p = tied->second;
        if (!p) return Invalid(f.name + ": key " + key + " is in several tied modules");
      }
      if (!p || !tensors.count(v.get())) {  // buffers, frozen parameters: the primary's
        ASSIGN_OR_RETURN(ValuePtr nv, o.Copy(tensors, f.source, v));
        Put(root, k, nv);
        continue;
      }
      // layer and v named again: clang before 16 cannot capture a structured binding.
      auto at = [&, v = v, &lay = layer](size_t i) -> std::pair<const TorchTensor*, uint32_t> {
        const DsLayerFile& li = *lay.by_tp[i];
        ValuePtr x = Get(li.file->root, key);
        auto it = x ? lay.tensors[i].find(x.get()) : lay.tensors[i].end();
        return {it == lay.tensors[i].end() ? nullptr : it->second, li.source};
      };
      ASSIGN_OR_RETURN(ValuePtr nt, ModuleSlice(&o, *p, at, t));
      Put(root, k, nt);
    }
    char name[96];
    std::snprintf(name, sizeof name, "layer_%02u-model_%02u-model_states.pt", idx, t);
    ASSIGN_OR_RETURN(ViewFile vf, o.Finish(ArchivePrefix(name), root, f.extra_records));
    out->push_back(ViewEntry{c_.src.tag + "/" + name, std::move(vf)});
  }
  return Status::Ok();
}

Status TpPlanner::Run(std::vector<ViewEntry>* out) {
  ASSIGN_OR_RETURN(uc_, UcInfo::Read(c_));
  if (!uc_.present) {
    return Invalid("a new TP size needs the checkpoint's universal_checkpoint_info (which "
                   "Megatron-DeepSpeed writes) to know how each parameter is split");
  }
  if (c_.tp.size() == 1 && T_ > 1 && !uc_.tp_lists) {
    return Invalid("this checkpoint was saved at TP 1 and its universal_checkpoint_info lists "
                   "neither tp_replicated_parameter_patterns nor "
                   "parameter_with_row_parallelism_patterns (Megatron-DeepSpeed writes them only "
                   "when TP > 1), so which parameters TP " + std::to_string(T_) +
                   " replicates or cuts by column is unknown");
  }
  const TpRank& tr0 = c_.tp[0];
  for (const auto& [k, v] : PairsOf(*tr0.model->file->root)) {
    if (KeyName(k) == "frozen_param_shapes" && v && !PairsOf(*v).empty()) {
      return Invalid("frozen parameters (frozen_param_shapes) are not resharded yet");
    }
  }
  // The target's vocabulary rows: Megatron's padding of original_vocab_size for T.
  if (uc_.original_vocab_size > 0) {
    ValuePtr args = ArgsDict(Get(tr0.model->file->root, "args"));
    ValuePtr div = Get(args, "make_vocab_size_divisible_by");
    const int64_t d = div && div->kind == Kind::kInt ? div->i : 128;
    padded_ = RoundUp(uc_.original_vocab_size, d * T_);
  }
  std::vector<std::vector<TargetParam>> groups(tr0.groups.size());
  for (size_t g = 0; g < tr0.groups.size(); ++g) {
    for (const Param& sp : tr0.groups[g]) {
      TargetParam p;
      p.name = sp.name;
      ASSIGN_OR_RETURN(p.merge, uc_.Classify(p.name));
      p.merge.original_rows = uc_.original_vocab_size;
      ASSIGN_OR_RETURN(p.slices, Locate(c_, p.name));
      ASSIGN_OR_RETURN(FullTensor full, Full(c_, p.slices, p.merge, "fp32"));
      p.full_shape = p.shape = full.shape;
      const Merge& m = p.merge;
      const std::string what = "parameter " + p.name;
      if (m.vocab) {
        if (p.shape.empty()) return Invalid(what + ": a vocabulary parameter without rows");
        if (m.kind == Merge::kCat && m.cat_dim != 0) return Invalid(what + ": a row-parallel vocabulary");
        if (m.kind == Merge::kSubParams) return Invalid(what + ": a vocabulary of sub-parameters");
        p.shape[0] = Whole(m) ? padded_ : padded_ / T_;
      } else if (m.kind == Merge::kSubParams) {
        // The target's slice keeps the source slice's shape but for partition_dim.
        std::vector<int64_t> want = m.sub_shape;
        want[m.partition_dim] /= static_cast<int64_t>(c_.tp.size());
        if (p.slices[0].p->shape != want) {
          return Invalid(what + ": its TP slice's shape is not parameter_with_sub_params' shape "
                         "cut along partition_dim, which a new TP size needs");
        }
        for (int64_t sub : m.subs) {
          if (sub % T_ != 0) {
            return Invalid(what + ": sub-parameter of " + std::to_string(sub) +
                           " does not split in " + std::to_string(T_));
          }
        }
        p.shape[m.partition_dim] /= T_;
      } else if (m.kind == Merge::kTwoSubParams) {
        if (p.shape.empty() || p.shape[0] % (2 * T_) != 0) {
          return Invalid(what + ": its two halves do not split in " + std::to_string(T_));
        }
        p.shape[0] /= T_;
      } else if (m.kind == Merge::kCat) {
        const size_t dim = static_cast<size_t>(m.cat_dim);
        if (dim >= p.shape.size() || p.shape[dim] % T_ != 0) {
          return Invalid(what + " (" + std::to_string(dim >= p.shape.size() ? 0 : p.shape[dim]) +
                         " along dimension " + std::to_string(dim) + ") does not split in " +
                         std::to_string(T_));
        }
        p.shape[dim] /= T_;
      }
      groups[g].push_back(std::move(p));
    }
  }

  groups_ = &groups;
  constexpr std::string_view kTied = "tied_modules.";
  for (const auto& g : groups) {
    for (const TargetParam& p : g) {
      by_name_[p.name] = &p;
      const size_t dot = p.name.find('.', kTied.size());
      if (!p.name.starts_with(kTied) || dot == std::string::npos) continue;
      auto [it, fresh] = tied_.emplace(p.name.substr(dot + 1), &p);
      if (!fresh) it->second = nullptr;
    }
  }
  RETURN_IF_ERROR(ReadLayers());
  out->push_back(ViewEntry{"latest", {}});
  out->back().file.recipe.AddLiteral(c_.src.tag);
  for (uint32_t t = 0; t < T_; ++t) {
    ASSIGN_OR_RETURN(ViewEntry ms, ModelStates(t));
    out->push_back(std::move(ms));
    RETURN_IF_ERROR(LayerFiles(t, out));
    Target target;
    target.primary = &c_.tp[static_cast<size_t>(uint64_t{t} * c_.tp.size() / T_)];
    target.groups.resize(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      uint64_t off = 0;
      for (const TargetParam& p : groups[g]) {
        Param q;
        q.name = p.name;
        q.shape = p.shape;
        q.numel = 1;
        for (int64_t x : p.shape) q.numel *= static_cast<uint64_t>(x);
        q.offset = off;
        off += q.numel;
        target.groups[g].push_back(std::move(q));
      }
      target.totals.push_back(off);
    }
    // Each (group, state) flat buffer, made on first use.
    auto cache = std::make_shared<std::map<std::pair<size_t, std::string>,
                                           std::pair<std::vector<Gather>, uint64_t>>>();
    target.range = [this, &groups, cache, t](size_t g, const std::string& key, uint64_t from,
                                             uint64_t to) -> Result<std::vector<Gather>> {
      auto it = cache->find({g, key});
      if (it == cache->end()) {
        std::vector<Gather> flat;
        uint64_t item = 0;
        for (const TargetParam& p : groups[g]) {
          ASSIGN_OR_RETURN(FullTensor full, Full(c_, p.slices, p.merge, key));
          item = DtypeSize(full.like->dtype);
          std::vector<Gather> s = SliceOf(p, full.gathers, item, t);
          flat.insert(flat.end(), s.begin(), s.end());
        }
        it = cache->emplace(std::pair{g, key}, std::pair{std::move(flat), item}).first;
      }
      const uint64_t item = it->second.second;
      return Cut(it->second.first, from * item, to * item);
    };
    for (uint32_t d = 0; d < D_; ++d) {
      ASSIGN_OR_RETURN(ViewEntry e, PlanOptimFile(c_, target, t, d, D_));
      out->push_back(std::move(e));
    }
  }
  return Status::Ok();
}

}  // namespace

Status PlanTpDp(const Checkpoint& c, uint32_t T, uint32_t D, std::vector<ViewEntry>* out) {
  return TpPlanner(c, T, D).Run(out);
}

}  // namespace ckptfs::reshard::ds
