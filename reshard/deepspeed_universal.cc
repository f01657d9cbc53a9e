// The universal view: the directory DeepSpeed's ds_to_universal writes, planned over the tag
// directory's files. Per parameter, each TP rank's slice is gathered from the dp partitions
// that hold it, and the slices are merged as universal_checkpoint_info's patterns say.

// GCC 12 with -fsanitize (scripts/test.sh) reports a false maybe-uninitialized inside <regex>;
// see reshard/rules.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <map>
#include <regex>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {

struct UcInfo::Patterns {
  std::vector<std::regex> replicated, average, two_sub_params, row_parallel, vocabulary;
  // parameter_with_sub_params: per entry its patterns and the merge they give.
  std::vector<std::pair<std::vector<std::regex>, Merge>> sub_params;
};

using pickle::Kind;
using pickle::ValuePtr;

namespace {

// One entry of parameter_with_sub_params, as DeepSpeed's SubparamShape takes it: patterns, a shape
// whose entries are sizes or tuples of sub-parameter sizes, and the dimension TP partitions.
Result<Merge> SubParams(const ValuePtr& e) {
  const std::string what = "universal_checkpoint_info's parameter_with_sub_params entry";
  if (!IsMapping(e) || PairsOf(*e).size() != 3) {
    return Invalid(what + " is not a dict of patterns, shape and partition_dim");
  }
  ValuePtr shape = Get(e, "shape"), dim = Get(e, "partition_dim");
  if (!Get(e, "patterns") || !shape || !dim || dim->kind != Kind::kInt ||
      (shape->kind != Kind::kList && shape->kind != Kind::kTuple) || dim->i < 0 ||
      static_cast<size_t>(dim->i) >= shape->items.size()) {
    return Invalid(what + " is malformed (patterns, shape, partition_dim)");
  }
  Merge m;
  m.kind = Merge::kSubParams;
  m.sub_spec = e;
  m.partition_dim = static_cast<size_t>(dim->i);
  for (size_t i = 0; i < shape->items.size(); ++i) {
    const ValuePtr& d = shape->items[i];
    std::vector<int64_t> parts;
    if (d && d->kind == Kind::kInt && i == m.partition_dim) {
      // DeepSpeed has read an integer here as one sub-parameter's size and, since universal
      // checkpoint version 0.4, as a count of equal sub-parameters: refused rather than guessed.
      return Invalid(what + " has an integer at partition_dim, which DeepSpeed versions read "
                     "differently; a tuple of sizes is needed");
    } else if (d && d->kind == Kind::kInt) {
      parts.push_back(d->i);
    } else if (d && d->kind == Kind::kTuple) {  // a list is one size to DeepSpeed, and fails
      for (const ValuePtr& x : d->items) {
        if (!x || x->kind != Kind::kInt) return Invalid(what + "'s shape holds a non-integer");
        parts.push_back(x->i);
      }
    } else {
      return Invalid(what + "'s shape holds a non-integer");
    }
    int64_t sum = 0;
    for (int64_t x : parts) {
      if (x <= 0) return Invalid(what + "'s shape holds a size below 1");
      sum += x;
    }
    m.sub_shape.push_back(sum);
    if (i == m.partition_dim) m.subs = parts;
  }
  return m;
}

}  // namespace

Result<UcInfo> UcInfo::Read(const Checkpoint& c) {
  UcInfo info;
  auto pats = std::make_shared<UcInfo::Patterns>();
  info.patterns = pats;
  ValuePtr uc = Get(c.tp[0].model->file->root, "universal_checkpoint_info");
  if (!uc || uc->kind == Kind::kNone) return info;
  if (!IsMapping(uc)) return Invalid("universal_checkpoint_info is not a dict");
  info.present = true;
  auto compile = [&](std::string_view key, const ValuePtr& v,
                     std::vector<std::regex>* out) -> Status {
    if (v->kind != Kind::kList && v->kind != Kind::kTuple) {
      return Invalid("universal_checkpoint_info's " + std::string(key) + " is not a list");
    }
    for (const ValuePtr& p : v->items) {
      if (!p || p->kind != Kind::kStr) {
        return Invalid("universal_checkpoint_info's " + std::string(key) + " holds a non-string");
      }
      try {
        out->emplace_back(p->str, std::regex::ECMAScript);
      } catch (const std::regex_error&) {
        return Invalid("universal_checkpoint_info's " + std::string(key) + " pattern '" + p->str +
                       "' is not a regular expression ckptfs reads");
      }
    }
    return Status::Ok();
  };
  auto patterns = [&](std::string_view key, std::vector<std::regex>* out) -> Status {
    ValuePtr v = Get(uc, key);
    return v ? compile(key, v, out) : Status::Ok();
  };
  info.tp_lists = Get(uc, "tp_replicated_parameter_patterns") ||
                  Get(uc, "parameter_with_row_parallelism_patterns");
  RETURN_IF_ERROR(patterns("tp_replicated_parameter_patterns", &pats->replicated));
  RETURN_IF_ERROR(patterns("parameter_to_average_patterns", &pats->average));
  RETURN_IF_ERROR(patterns("parameter_with_2_sub_params_cat_dim_0", &pats->two_sub_params));
  RETURN_IF_ERROR(patterns("parameter_with_row_parallelism_patterns", &pats->row_parallel));
  RETURN_IF_ERROR(patterns("vocabulary_parameter_patterns", &pats->vocabulary));
  if (ValuePtr sub = Get(uc, "parameter_with_sub_params")) {
    if (sub->kind != Kind::kList && sub->kind != Kind::kTuple) {
      return Invalid("universal_checkpoint_info's parameter_with_sub_params is not a list");
    }
    for (const ValuePtr& e : sub->items) {
      ASSIGN_OR_RETURN(Merge m, SubParams(e));
      std::vector<std::regex> ps;
      RETURN_IF_ERROR(compile("parameter_with_sub_params", Get(e, "patterns"), &ps));
      pats->sub_params.emplace_back(std::move(ps), std::move(m));
    }
  }
  if (ValuePtr w = Get(uc, "sub_param_shard_widths"); w && IsMapping(w) && !PairsOf(*w).empty()) {
    return Invalid("universal_checkpoint_info's sub_param_shard_widths (uneven sub-parameters) "
                   "is not supported");
  }
  ValuePtr ovs = Get(uc, "original_vocab_size");
  if (ovs && ovs->kind == Kind::kInt) info.original_vocab_size = ovs->i;
  return info;
}

namespace {
// Python's re.match: the pattern matches at the start of the name.
bool MatchAny(const std::vector<std::regex>& ps, const std::string& name) {
  for (const std::regex& p : ps) {
    if (std::regex_search(name, p, std::regex_constants::match_continuous)) return true;
  }
  return false;
}
// The first parameter_with_sub_params entry with a pattern matching `name`, as DeepSpeed looks.
const Merge* MatchSubParams(const UcInfo::Patterns& p, const std::string& name) {
  for (const auto& [patterns, merge] : p.sub_params) {
    if (MatchAny(patterns, name)) return &merge;
  }
  return nullptr;
}
}  // namespace

Result<Merge> UcInfo::Classify(const std::string& name) const {
  Merge m;
  const Patterns empty;
  const Patterns& p = patterns ? *patterns : empty;
  if (MatchAny(p.replicated, name)) {
    m.kind = Merge::kReplicated;
  } else if (MatchAny(p.average, name)) {
    m.kind = Merge::kAverage;
  } else if (MatchAny(p.two_sub_params, name)) {
    m.kind = Merge::kTwoSubParams;
  } else if (const Merge* sub = MatchSubParams(p, name)) {
    m = *sub;
  } else {
    m.cat_dim = MatchAny(p.row_parallel, name) ? 1 : 0;
  }
  m.vocab = MatchAny(p.vocabulary, name);
  if (m.vocab && m.kind == Merge::kSubParams && m.partition_dim != 0) {
    return Invalid("vocabulary parameter " + name + " has sub-parameters along dimension " +
                   std::to_string(m.partition_dim) + "; not supported");
  }
  if (m.vocab && original_vocab_size < 0) {
    return Invalid("vocabulary parameter " + name +
                   " but universal_checkpoint_info has no original_vocab_size");
  }
  return m;
}

Result<std::vector<Located>> Locate(const Checkpoint& c, const std::string& name) {
  std::vector<Located> out;
  for (size_t t = 0; t < c.tp.size(); ++t) {
    const TpRank& tr = c.tp[t];
    const Param* found = nullptr;
    size_t group = 0;
    for (size_t g = 0; g < tr.groups.size() && !found; ++g) {
      for (const Param& p : tr.groups[g]) {
        if (p.name == name) {
          found = &p;
          group = g;
          break;
        }
      }
    }
    if (!found) return Invalid("parameter " + name + " is missing from " + tr.model->name);
    out.push_back(Located{&tr, group, found});
  }
  return out;
}

namespace {

// The state tensor `key` ("fp32" or an optimizer state) of o's group g.
const TorchTensor* Pick(const Optim& o, size_t g, const std::string& key) {
  return key == "fp32" ? o.fp32[g] : Checkpoint::StateTensor(o, g, key);
}

}  // namespace

namespace {

// The mean gathers of an averaged parameter: each slice's elements (every slice has the full
// shape) from its flat buffers, in lockstep, cut wherever any slice crosses a dp partition.
Result<std::vector<Gather>> MeanOf(const Checkpoint& c, const std::vector<Located>& slices,
                                   const std::string& key, const std::string& what) {
  std::vector<std::vector<Part>> runs;
  for (const Located& s : slices) {
    if (s.p->shape != slices[0].p->shape) {
      return Invalid(what + ": its TP slices differ in shape, so they cannot be averaged");
    }
    for (const Optim& o : s.tr->optim) {
      const TorchTensor* t = Pick(o, s.g, key);
      if (t && t->dtype != "float32") {
        return Invalid(what + " is averaged over TP ranks (parameter_to_average_patterns) but " +
                       o.file->name + " holds it as " + t->dtype +
                       "; the view averages float32 only");
      }
    }
    ASSIGN_OR_RETURN(std::vector<Part> parts,
                     c.Flat(*s.tr, s.g, s.p->offset, s.p->offset + s.p->numel,
                            [&key, g = s.g](const Optim& o) { return Pick(o, g, key); }, what));
    runs.push_back(std::move(parts));
  }
  auto bytes = [](const std::vector<Part>& r) {
    uint64_t n = 0;
    for (const Part& p : r) n += p.len;
    return n;
  };
  for (const std::vector<Part>& r : runs) {  // float32 everywhere: the same bytes in each
    if (bytes(r) != bytes(runs[0])) return Invalid(what + ": its TP slices differ in size");
  }
  std::vector<Gather> out;
  std::vector<size_t> at(runs.size(), 0);     // the part each slice is in
  std::vector<uint64_t> used(runs.size(), 0);  // bytes of it already taken
  while (!runs.empty() && at[0] < runs[0].size()) {
    uint64_t len = UINT64_MAX;
    for (size_t i = 0; i < runs.size(); ++i) len = std::min(len, runs[i][at[i]].len - used[i]);
    Gather g{1, {}, 0, true};
    for (size_t i = 0; i < runs.size(); ++i) {
      const Part& p = runs[i][at[i]];
      g.parts.push_back(Part{p.source, p.offset + used[i], len, len});
      if ((used[i] += len) == p.len) {
        ++at[i];
        used[i] = 0;
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

// A vocabulary parameter's full tensor cut to its original_rows rows (`item`: bytes per element).
Status CutToVocabulary(const Merge& m, uint64_t item, const std::string& what, FullTensor* full) {
  if (!m.vocab) return Status::Ok();
  if (full->shape.empty()) return Invalid(what + " is a vocabulary parameter without rows");
  if (m.original_rows > full->shape[0]) {
    return Invalid(what + ": original_vocab_size " + std::to_string(m.original_rows) +
                   " exceeds its " + std::to_string(full->shape[0]) + " rows");
  }
  uint64_t bytes = item;
  for (size_t i = 1; i < full->shape.size(); ++i) bytes *= static_cast<uint64_t>(full->shape[i]);
  full->shape[0] = m.original_rows;
  full->gathers = Cut(full->gathers, 0, bytes * static_cast<uint64_t>(m.original_rows));
  return Status::Ok();
}

}  // namespace

Result<FullTensor> Full(const Checkpoint& c, const std::vector<Located>& slices,
                        const Merge& m, const std::string& key) {
  const std::string what = "'" + key + "' of " + slices[0].p->name;
  FullTensor full;
  // The dp rank holding the first slice's first element supplies the tensor's type.
  {
    const Located& s = slices[0];
    const Partitioning part(s.tr->totals[s.g], c.D);
    const Optim& o = s.tr->optim[part.RankOf(s.p->offset)];
    full.like = Pick(o, s.g, key);
    if (!full.like) return Invalid(o.file->name + " has no " + what);
  }
  const uint64_t item = DtypeSize(full.like->dtype);
  if (item == 0) return Invalid(what + " has an unknown dtype " + full.like->dtype);
  if (m.kind == Merge::kAverage) {
    full.shape = slices[0].p->shape;
    ASSIGN_OR_RETURN(full.gathers, MeanOf(c, slices, key, what));
    RETURN_IF_ERROR(CutToVocabulary(m, item, what, &full));
    return full;
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const Located& s : slices) shapes.push_back(s.p->shape);
  ASSIGN_OR_RETURN(MergeLayout l, LayoutOf(m, shapes, what));
  full.shape = l.shape;

  // Runs of rows that lie in one dp partition of every slice become one strided gather; a row
  // that crosses a partition boundary in some slice is gathered piece by piece.
  for (uint64_t r = 0; r < l.rows;) {
    uint64_t k = l.rows - r;
    std::vector<uint64_t> base(l.widths.size());  // the row's first element in its partition
    std::vector<const Optim*> in(l.widths.size());
    for (size_t i = 0; i < l.widths.size(); ++i) {
      const Located& s = slices[i];
      const Partitioning part(s.tr->totals[s.g], c.D);
      const uint64_t e = s.p->offset + r * l.widths[i];
      const uint64_t rank = part.RankOf(e);
      k = std::min(k, l.widths[i] ? (part.End(rank) - std::min(part.End(rank), e)) / l.widths[i] : k);
      base[i] = e - part.Begin(rank);
      in[i] = &s.tr->optim[rank];
    }
    std::vector<Part> parts;
    if (k >= 1) {
      for (const MergeLayout::Piece& pc : l.pieces) {
        const TorchTensor* t = Pick(*in[pc.slice], slices[pc.slice].g, key);
        if (!t) return Invalid(in[pc.slice]->file->name + " has no " + what);
        parts.push_back(Part{in[pc.slice]->file->source, t->offset + (base[pc.slice] + pc.from) * item,
                             pc.len * item, l.widths[pc.slice] * item});
      }
      full.gathers.push_back(Gather{k, std::move(parts)});
      r += k;
      continue;
    }
    for (const MergeLayout::Piece& pc : l.pieces) {
      const Located& s = slices[pc.slice];
      const uint64_t e = s.p->offset + r * l.widths[pc.slice] + pc.from;
      ASSIGN_OR_RETURN(std::vector<Part> more,
                       c.Flat(*s.tr, s.g, e, e + pc.len,
                              [&key, g = s.g](const Optim& o) { return Pick(o, g, key); }, what));
      parts.insert(parts.end(), more.begin(), more.end());
    }
    full.gathers.push_back(Gather{1, std::move(parts)});
    ++r;
  }
  RETURN_IF_ERROR(CutToVocabulary(m, item, what, &full));
  return full;
}

namespace {

ValuePtr Str(std::string s) { return pickle::MakeStr(std::move(s)); }

// DeepSpeed's SubparamShape dataclass of a sub-parameter merge, pickled as Python pickles it:
// the class called with no arguments, then its fields set.
ValuePtr SubparamShape(const Merge& m) {
  auto v = std::make_shared<pickle::Value>();
  v->kind = Kind::kObject;
  v->op = pickle::ObjectOp::kNewObj;
  v->callable = pickle::MakeGlobal("deepspeed.checkpoint.universal_checkpoint", "SubparamShape");
  v->args = pickle::MakeTuple({});
  v->state = pickle::MakeDict({{Str("patterns"), Get(m.sub_spec, "patterns")},
                               {Str("shape"), Get(m.sub_spec, "shape")},
                               {Str("partition_dim"), Get(m.sub_spec, "partition_dim")}});
  return v;
}

// The file of state `key` of a parameter: {[cat_dim, [param_n_sub_params]] or [sub_param_shape],
// [vocab_tensor], param} in ds_to_universal's key order.
Result<ViewEntry> StateFile(const Checkpoint& c, const std::vector<Located>& slices,
                            const Merge& m, const std::string& key, const std::string& path) {
  ASSIGN_OR_RETURN(FullTensor full, Full(c, slices, m, key));
  uint64_t nbytes = DtypeSize(full.like->dtype);
  for (int64_t x : full.shape) nbytes *= static_cast<uint64_t>(x);
  TorchOut out;
  out.set_location("cpu");  // ds_to_universal loads every source with map_location='cpu'
  ValuePtr t = out.NewTensor(*full.like->node, std::move(full.gathers), full.shape,
                             ContiguousStride(full.shape), nbytes);
  std::vector<std::pair<ValuePtr, ValuePtr>> items;
  if (m.kind == Merge::kCat || m.kind == Merge::kTwoSubParams) {
    items.push_back({Str("cat_dim"), pickle::MakeInt(m.cat_dim)});
  }
  if (m.kind == Merge::kTwoSubParams) items.push_back({Str("param_n_sub_params"), pickle::MakeInt(2)});
  if (m.kind == Merge::kSubParams) items.push_back({Str("sub_param_shape"), SubparamShape(m)});
  if (m.vocab) items.push_back({Str("vocab_tensor"), pickle::MakeBool(true)});
  items.push_back({Str("param"), t});
  const Located& s = slices[0];
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(path), pickle::MakeDict(std::move(items)),
                                          s.tr->optim[0].file->extra_records));
  return ViewEntry{path, std::move(f)};
}

// zero/optimizer_state.pt: dp rank 0's optimizer state dict without its partitioned entries,
// group_paddings zeroed, the param groups appended.
Result<ViewEntry> OptimizerState(const Checkpoint& c) {
  const Optim& o0 = c.tp[0].optim[0];
  TorchOut o;
  o.set_location("cpu");
  ValuePtr root = EmptyLike(o0.osd);
  for (const auto& [k, v] : PairsOf(*o0.osd)) {
    const std::string key = KeyName(k);
    if (key == "base_optimizer_state" || key == "param_slice_mappings" ||
        key == "single_partition_of_fp32_groups") {
      continue;
    }
    if (key == "group_paddings" && v && v->kind == Kind::kList) {
      Put(root, k, pickle::MakeList(std::vector<ValuePtr>(v->items.size(), pickle::MakeInt(0))));
      continue;
    }
    ASSIGN_OR_RETURN(ValuePtr nv, o.Copy(o0.tensors, o0.file->source, v));
    Put(root, k, nv);
  }
  ASSIGN_OR_RETURN(ValuePtr groups,
                   o.Copy(o0.tensors, o0.file->source, Get(o0.base, "param_groups")));
  Put(root, Str("param_groups"), groups);
  const std::string path = c.src.tag + "/zero/optimizer_state.pt";
  ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), root, o0.file->extra_records));
  return ViewEntry{path, std::move(f)};
}

// The tensor state keys of group g, in the order the optimizer made them ('step' apart).
Result<std::vector<std::string>> StateKeys(const TpRank& tr, size_t g) {
  std::vector<std::pair<ValuePtr, const TensorIndex*>> states;
  for (const Optim& o : tr.optim) states.push_back({o.group_state[g], &o.tensors});
  return TensorStateKeys(states);
}

}  // namespace

Result<std::vector<std::string>> TensorStateKeys(
    const std::vector<std::pair<ValuePtr, const TensorIndex*>>& states) {
  std::vector<std::string> keys;
  for (const auto& [state, tensors] : states) {
    if (!state) continue;
    for (const auto& [k, v] : PairsOf(*state)) {
      const std::string key = KeyName(k);
      if (key == "step") continue;
      auto t = tensors->find(v.get());
      if (t == tensors->end() || t->second->shape.empty()) {
        return Invalid("optimizer state '" + key +
                       "' is not a tensor; the universal view cannot split it per parameter");
      }
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  return keys;
}

Status PlanUniversal(const Checkpoint& c, std::vector<ViewEntry>* out) {
  ASSIGN_OR_RETURN(UcInfo uc, UcInfo::Read(c));
  out->push_back(ViewEntry{"latest_universal", {}});
  out->back().file.recipe.AddLiteral(c.src.tag);
  for (const TpRank& tr : c.tp) {
    const DsSourceFile& m = *tr.model;
    ViewEntry e{c.src.tag + "/" + m.name, {}};
    e.file.recipe.AddGather(1, {Part{m.source, 0, m.size, m.size}});
    out->push_back(std::move(e));
  }
  ASSIGN_OR_RETURN(ViewEntry opt, OptimizerState(c));
  out->push_back(std::move(opt));

  const TpRank& tr = c.tp[0];
  for (size_t g = 0; g < tr.groups.size(); ++g) {
    ASSIGN_OR_RETURN(std::vector<std::string> keys, StateKeys(tr, g));
    for (const Param& p : tr.groups[g]) {
      if (p.name.empty() || p.name.find('/') != std::string::npos || p.name == "." ||
          p.name == "..") {
        return Invalid("parameter name '" + p.name + "' cannot name a directory");
      }
      ASSIGN_OR_RETURN(Merge m, uc.Classify(p.name));
      m.original_rows = uc.original_vocab_size;
      ASSIGN_OR_RETURN(std::vector<Located> slices, Locate(c, p.name));
      const std::string dir = c.src.tag + "/zero/" + p.name + "/";
      keys.insert(keys.begin(), "fp32");
      for (const std::string& key : keys) {
        ASSIGN_OR_RETURN(ViewEntry e, StateFile(c, slices, m, key, dir + key + ".pt"));
        out->push_back(std::move(e));
      }
      keys.erase(keys.begin());
      // step.pt: the raw step of the first dp rank holding a piece of the parameter.
      const Partitioning part(tr.totals[g], c.D);
      const Optim& o = tr.optim[part.RankOf(p.offset)];
      if (ValuePtr step = Get(o.group_state[g], "step")) {
        TorchOut so;
        so.set_location("cpu");
        ASSIGN_OR_RETURN(ValuePtr v, so.Copy(o.tensors, o.file->source, step));
        const std::string path = dir + "step.pt";
        ASSIGN_OR_RETURN(ViewFile f, so.Finish(ArchivePrefix(path), v, o.file->extra_records));
        out->push_back(ViewEntry{path, std::move(f)});
      }
    }
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard::ds
