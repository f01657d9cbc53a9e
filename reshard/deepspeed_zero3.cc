// ZeRO stage 3 sources: the tag directory decoded; its universal view, the directory
// ds_to_universal writes for stage 3 (without tensor parallelism): per parameter one flat tensor
// per state, each gathered from the parameter's partition in every dp rank's flat buffers; and
// its dpD view: every parameter re-cut into D partitions and regrouped into the sub-groups
// DeepSpeed forms at D.

#include <algorithm>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

// Checks that tensor v of file `o` is a contiguous 1-D tensor of `numel` elements; returns it.
Result<const TorchTensor*> FlatTensor(const Zero3Rank& o, const ValuePtr& v, uint64_t numel,
                                      const std::string& what) {
  auto it = v ? o.tensors.find(v.get()) : o.tensors.end();
  if (it == o.tensors.end() || it->second->shape.size() != 1 || it->second->dtype.empty() ||
      !IsContiguous(it->second->shape, it->second->stride)) {
    return Invalid(o.optim->name + ": " + what + " is not a 1-D tensor");
  }
  if (static_cast<uint64_t>(it->second->shape[0]) != numel) {
    return Invalid(o.optim->name + ": " + what + " holds " +
                   std::to_string(it->second->shape[0]) + " elements; param_shapes and the " +
                   "dp world size give " + std::to_string(numel));
  }
  return it->second;
}

}  // namespace

Status Checkpoint::DecodeZero3(const std::map<uint32_t, const DsSourceFile*>& models,
                               const std::map<uint32_t, const DsSourceFile*>& optims) {
  z3 = std::make_unique<Zero3>();
  D = static_cast<uint32_t>(models.size());
  if (models.rbegin()->first != D - 1) {
    return Invalid(src.tag + " does not hold the stage 3 model-states files of dp ranks 0 .. " +
                   std::to_string(D - 1));
  }
  const std::string where0 = src.tag + "/" + models.at(0)->name;
  ASSIGN_OR_RETURN(std::vector<std::vector<Param>> shapes,
                   ParamShapes(models.at(0)->file->root, where0));
  for (const auto& [d, f] : models) {
    const std::string where = src.tag + "/" + f->name;
    if (!IsMapping(f->file->root)) return Invalid(where + " is not a DeepSpeed model-states dict");
    if (d > 0) {  // every rank's param_shapes must be rank 0's: the view reads rank 0's
      auto mine = ParamShapes(f->file->root, where);
      if (!mine.ok() || *mine != shapes) {
        return Invalid(where + ": param_shapes differ from dp rank 0's");
      }
    }
    ValuePtr dpws = Get(f->file->root, "dp_world_size");
    if (!dpws || dpws->kind != Kind::kInt || dpws->i != static_cast<int64_t>(D)) {
      return Invalid(where + ": dp_world_size is not " + std::to_string(D) +
                     ", the number of stage 3 model-states files");
    }
  }
  std::vector<uint64_t> totals;  // per sub-group: elements of every rank's flat buffer
  for (std::vector<Param>& group : shapes) {
    std::vector<Zero3Param> params;
    uint64_t off = 0;
    for (Param& q : group) {
      q.offset = off;
      const uint64_t part = (q.numel + D - 1) / D;
      off += part;
      params.push_back(Zero3Param{std::move(q), part});
    }
    z3->groups.push_back(std::move(params));
    totals.push_back(off);
  }
  const size_t G = z3->groups.size();
  z3->ranks.resize(D);
  for (uint32_t d = 0; d < D; ++d) {
    Zero3Rank& o = z3->ranks[d];
    o.model = models.at(d);
    auto it = optims.find(d);
    if (it == optims.end()) {
      return Invalid("optimizer file " + OptimFileName(optim_prefix, d, 0) + " of " + src.tag +
                     " is missing (" + std::to_string(D) + " stage 3 model-states files)");
    }
    o.optim = it->second;
    o.model_tensors = IndexTensors(*o.model->file);
    const std::string where = src.tag + "/" + o.optim->name;
    o.tensors = IndexTensors(*o.optim->file);
    o.osd = Get(o.optim->file->root, "optimizer_state_dict");
    ValuePtr flats = Get(o.osd, "fp32_flat_groups");
    ValuePtr inner = Get(o.osd, "optimizer_state_dict");
    ValuePtr state = Get(inner, "state");
    if (!IsMapping(o.osd) || !flats || flats->kind != Kind::kList || !IsMapping(state)) {
      return Invalid(where + " is not a ZeRO stage 3 optimizer state (optimizer_state_dict with "
                     "fp32_flat_groups and the optimizer's state)");
    }
    ValuePtr count = Get(o.osd, "partition_count");
    if (count && count->kind == Kind::kInt && count->i != static_cast<int64_t>(D)) {
      return Invalid(where + ": partition_count " + std::to_string(count->i) + " is not the " +
                     std::to_string(D) + " ranks the model-states files give");
    }
    if (flats->items.size() != G) {
      return Invalid(where + " has " + std::to_string(flats->items.size()) +
                     " sub-groups; param_shapes has " + std::to_string(G));
    }
    o.group_state.assign(G, nullptr);
    for (const auto& [k, v] : PairsOf(*state)) {
      if (!k || k->kind != Kind::kInt || k->i < 0 || static_cast<size_t>(k->i) >= G ||
          !IsMapping(v)) {
        return Invalid(where + ": optimizer state key " + KeyName(k) + " is not a sub-group index");
      }
      o.group_state[static_cast<size_t>(k->i)] = v;
    }
    for (size_t g = 0; g < G; ++g) {
      ASSIGN_OR_RETURN(const TorchTensor* t,
                       FlatTensor(o, flats->items[g], totals[g],
                                  "fp32_flat_groups[" + std::to_string(g) + "]"));
      o.fp32.push_back(t);
      if (!o.group_state[g]) continue;
      for (const auto& [k, v] : PairsOf(*o.group_state[g])) {
        auto s = o.tensors.find(v.get());
        if (s == o.tensors.end() || s->second->shape.empty()) continue;  // 'step' and the like
        RETURN_IF_ERROR(FlatTensor(o, v, totals[g],
                                   "optimizer state '" + KeyName(k) + "' of sub-group " +
                                       std::to_string(g))
                            .status());
      }
    }
  }
  for (const auto& [d, f] : optims) {
    if (d >= D) {
      return Invalid(f->name + " lies outside the " + std::to_string(D) +
                     " dp ranks of the stage 3 model-states files");
    }
  }
  return Status::Ok();
}


namespace {

// The source tensor of `key` ("fp32" or an optimizer state key) of sub-group g in rank o's
// optimizer file; nullptr when absent.
const TorchTensor* FlatOf(const Zero3Rank& o, size_t g, const std::string& key) {
  if (key == "fp32") return o.fp32[g];
  ValuePtr v = Get(o.group_state[g], key);
  auto it = v ? o.tensors.find(v.get()) : o.tensors.end();
  return it == o.tensors.end() ? nullptr : it->second;
}

// The pieces of the source optimizer files holding elements [a, b) of parameter p (of source
// sub-group g) in the `key` buffers, rank after rank; *like: rank 0's tensor (its dtype is
// every rank's). Errors: a rank lacking the tensor, dtypes that differ.
Result<std::vector<Part>> Elements(const Zero3& z, size_t g, const Zero3Param& p,
                                   const std::string& key, uint64_t a, uint64_t b,
                                   const TorchTensor** like) {
  *like = FlatOf(z.ranks[0], g, key);
  if (!*like) return Invalid(z.ranks[0].optim->name + " has no '" + key + "' of " + p.name);
  const uint64_t item = DtypeSize((*like)->dtype);
  if (item == 0) return Invalid("'" + key + "' of " + p.name + " has dtype " + (*like)->dtype);
  std::vector<Part> parts;
  b = std::min(b, p.numel);
  for (uint64_t e = a; e < b;) {
    const uint64_t r = e / p.part, end = std::min(b, (r + 1) * p.part);
    const Zero3Rank& o = z.ranks[r];
    const TorchTensor* t = FlatOf(o, g, key);
    if (!t) return Invalid(o.optim->name + " has no '" + key + "' of " + p.name);
    if (t->shape.size() != 1) {  // a scalar state: not sized by DecodeZero3
      return Invalid(o.optim->name + ": '" + key + "' of sub-group " + std::to_string(g) +
                     " is not a flat tensor");
    }
    if (t->dtype != (*like)->dtype) {
      return Invalid("'" + key + "' of " + p.name + " has different dtypes across ranks");
    }
    const uint64_t at = p.offset + (e - r * p.part), len = (end - e) * item;
    parts.push_back(Part{o.optim->source, t->offset + at * item, len, len});
    e = end;
  }
  return parts;
}

// `parts` in one row, then `zeros` zero bytes; no gather for either when empty.
std::vector<Gather> GatherOf(std::vector<Part> parts, uint64_t zeros = 0) {
  std::vector<Gather> out;
  if (!parts.empty()) out.push_back(Gather{1, std::move(parts)});
  if (zeros) out.push_back(Gather{1, {}, zeros});
  return out;
}

}  // namespace

Status PlanUniversalZero3(const Checkpoint& c, std::vector<ViewEntry>* out) {
  const Zero3& z = *c.z3;
  out->push_back(ViewEntry{"latest_universal", {}});
  out->back().file.recipe.AddLiteral(c.src.tag);
  // Every model-states file, as it is.
  std::vector<const DsSourceFile*> models;
  for (const Zero3Rank& o : z.ranks) models.push_back(o.model);
  std::sort(models.begin(), models.end(),
            [](const DsSourceFile* a, const DsSourceFile* b) { return a->name < b->name; });
  for (const DsSourceFile* m : models) {
    ViewEntry e{c.src.tag + "/" + m->name, {}};
    e.file.recipe.AddGather(1, {Part{m->source, 0, m->size, m->size}});
    out->push_back(std::move(e));
  }
  // zero/optimizer_state.pt: dp rank 0's optimizer_state_dict whole, its optimizer's
  // param_groups also at the top.
  {
    const Zero3Rank& o0 = z.ranks[0];
    TorchOut o;
    o.set_location("cpu");
    ASSIGN_OR_RETURN(ValuePtr root, o.Copy(o0.tensors, o0.optim->source, o0.osd));
    ValuePtr groups = Get(Get(root, "optimizer_state_dict"), "param_groups");
    if (!groups) return Invalid(o0.optim->name + ": the optimizer state has no param_groups");
    Put(root, pickle::MakeStr("param_groups"), groups);
    const std::string path = c.src.tag + "/zero/optimizer_state.pt";
    ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), root, o0.optim->extra_records));
    out->push_back(ViewEntry{path, std::move(f)});
  }
  for (size_t g = 0; g < z.groups.size(); ++g) {
    std::vector<std::pair<ValuePtr, const TensorIndex*>> states;
    for (const Zero3Rank& o : z.ranks) states.push_back({o.group_state[g], &o.tensors});
    ASSIGN_OR_RETURN(std::vector<std::string> keys, TensorStateKeys(states));
    keys.insert(keys.begin(), "fp32");
    for (const Zero3Param& p : z.groups[g]) {
      if (p.name.empty() || p.name.find('/') != std::string::npos || p.name == "." ||
          p.name == "..") {
        return Invalid("parameter name '" + p.name + "' cannot name a directory");
      }
      for (const std::string& key : keys) {
        // The parameter's elements: its partition in rank 0, 1, ..., padding dropped.
        const TorchTensor* like = nullptr;
        ASSIGN_OR_RETURN(std::vector<Part> parts, Elements(z, g, p, key, 0, p.numel, &like));
        const std::vector<int64_t> shape{static_cast<int64_t>(p.numel)};
        TorchOut o;
        o.set_location("cpu");
        ValuePtr t = o.NewTensor(*like->node, GatherOf(std::move(parts)), shape,
                                 ContiguousStride(shape), p.numel * DtypeSize(like->dtype));
        const std::string path = c.src.tag + "/zero/" + p.name + "/" + key + ".pt";
        ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), t,
                                              z.ranks[0].optim->extra_records));
        out->push_back(ViewEntry{path, std::move(f)});
      }
    }
  }
  return Status::Ok();
}

namespace {

// DeepSpeed's default zero_optimization.sub_group_size.
constexpr uint64_t kDefaultSubGroupSize = 1'000'000'000;

// A source parameter in a target sub-group: its partition size at the target dp size and the
// partition's offset in the sub-group's flat buffer.
struct Slot {
  const Zero3Param* p = nullptr;
  size_t g = 0;  // its source sub-group
  uint64_t part = 0, offset = 0;
};
struct SubGroup {
  size_t group = 0;  // the optimizer's param group
  std::vector<Slot> slots;
  uint64_t total = 0;  // elements of each rank's flat buffer
};

// DeepSpeed's _create_fp16_sub_groups: one param group's parameters (partition sizes `parts`)
// in sub-groups, as index ranges [begin, end). The group is one sub-group when its partitions
// fit in `size`; otherwise a sub-group closes once its partitions reach `size`, and at the end.
std::vector<std::pair<size_t, size_t>> CutSubGroups(const std::vector<uint64_t>& parts,
                                                    uint64_t size) {
  uint64_t sum = 0;
  for (uint64_t n : parts) sum += n;
  if (size >= sum) return {{0, parts.size()}};
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  uint64_t run = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    run += parts[i];
    if (run >= size || i + 1 == parts.size()) {
      out.push_back({begin, i + 1});
      begin = i + 1;
      run = 0;
    }
  }
  return out;
}

// ds_config's zero_optimization.sub_group_size, DeepSpeed's default when not given.
Result<uint64_t> SubGroupSize(const ValuePtr& model_root, const std::string& where) {
  ValuePtr v = Get(Get(Get(model_root, "ds_config"), "zero_optimization"), "sub_group_size");
  if (!v) return kDefaultSubGroupSize;
  if (v->kind == Kind::kInt && v->i >= 0) return static_cast<uint64_t>(v->i);
  if (v->kind == Kind::kFloat && v->f >= 0 && v->f < 1.8e19 &&
      v->f == static_cast<double>(static_cast<uint64_t>(v->f))) {
    return static_cast<uint64_t>(v->f);
  }
  return Invalid(where + ": ds_config's zero_optimization.sub_group_size is not a count");
}

// The sub-groups DeepSpeed forms at dp size D2 from the source's parameters. Errors: optimizer
// param_groups that do not list the sub-groups in order, or source sub-groups that do not
// follow sub_group_size at the source's own dp size (then D2's cannot be known).
Result<std::vector<SubGroup>> Regroup(const Checkpoint& c, uint32_t D2) {
  const Zero3& z = *c.z3;
  const Zero3Rank& o0 = z.ranks[0];
  const std::string where = c.src.tag + "/" + o0.optim->name;
  ValuePtr groups = Get(Get(o0.osd, "optimizer_state_dict"), "param_groups");
  if (!groups || groups->kind != Kind::kList) {
    return Invalid(where + ": the optimizer state has no param_groups");
  }
  // Each param group's sub-groups, which DeepSpeed numbers in order.
  std::vector<std::vector<size_t>> subs_of;
  size_t next = 0;
  for (const ValuePtr& pg : groups->items) {
    ValuePtr params = Get(pg, "params");
    if (!params || params->kind != Kind::kList) {
      return Invalid(where + ": a param group without a params list");
    }
    subs_of.emplace_back();
    for (const ValuePtr& i : params->items) {
      if (!i || i->kind != Kind::kInt || i->i != static_cast<int64_t>(next)) {
        return Invalid(where + ": param_groups do not list the sub-groups 0 .. " +
                       std::to_string(z.groups.size() - 1) + " in order");
      }
      subs_of.back().push_back(next++);
    }
  }
  if (next != z.groups.size()) {
    return Invalid(where + ": param_groups list " + std::to_string(next) + " sub-groups; " +
                   "param_shapes has " + std::to_string(z.groups.size()));
  }
  const std::string model_where = c.src.tag + "/" + o0.model->name;
  ASSIGN_OR_RETURN(const uint64_t size, SubGroupSize(o0.model->file->root, model_where));

  std::vector<SubGroup> out;
  for (size_t pg = 0; pg < subs_of.size(); ++pg) {
    std::vector<Slot> slots;
    std::vector<uint64_t> parts_at_src, parts;
    std::vector<std::pair<size_t, size_t>> src_cut;
    for (size_t g : subs_of[pg]) {
      src_cut.push_back({slots.size(), slots.size() + z.groups[g].size()});
      for (const Zero3Param& p : z.groups[g]) {
        slots.push_back(Slot{&p, g, (p.numel + D2 - 1) / D2, 0});
        parts_at_src.push_back(p.part);
        parts.push_back(slots.back().part);
      }
    }
    if (CutSubGroups(parts_at_src, size) != src_cut) {
      return Invalid(model_where + ": param_shapes' sub-groups are not those sub_group_size " +
                     std::to_string(size) + " gives at dp " + std::to_string(c.D) +
                     ", so the sub-groups at another dp size cannot be known");
    }
    for (const auto& [begin, end] : CutSubGroups(parts, size)) {
      SubGroup s{pg, {}, 0};
      for (size_t i = begin; i < end; ++i) {
        slots[i].offset = s.total;
        s.total += slots[i].part;
        s.slots.push_back(slots[i]);
      }
      out.push_back(std::move(s));
    }
  }
  return out;
}

// Rank d's flat buffer of `key` for sub-group s at dp size D2: its partition of each parameter,
// padded with zeros to the partition size.
Result<std::vector<Gather>> FlatAt(const Zero3& z, const SubGroup& s, const std::string& key,
                                   uint32_t d, const TorchTensor** like) {
  std::vector<Gather> out;
  const TorchTensor* first = nullptr;
  for (const Slot& sl : s.slots) {
    const uint64_t a = std::min(sl.p->numel, d * sl.part);
    const uint64_t b = std::min(sl.p->numel, a + sl.part);
    ASSIGN_OR_RETURN(std::vector<Part> parts, Elements(z, sl.g, *sl.p, key, a, b, like));
    if (!first) first = *like;
    if ((*like)->dtype != first->dtype) {
      return Invalid("'" + key + "' differs in dtype between source sub-groups that are one "
                     "sub-group at the new dp size");
    }
    const uint64_t zeros = (sl.part - (b - a)) * DtypeSize((*like)->dtype);
    for (Gather& g : GatherOf(std::move(parts), zeros)) out.push_back(std::move(g));
  }
  return out;
}

// The optimizer file of rank d at dp size D2: rank 0's, with partition_count D2, the flat fp32
// buffers and the optimizer's state re-cut, and its param_groups listing the new sub-groups.
Result<ViewEntry> PlanZero3Optim(const Checkpoint& c, const std::vector<SubGroup>& subs,
                                 uint32_t d, uint32_t D2) {
  const Zero3& z = *c.z3;
  const Zero3Rank& o0 = z.ranks[0];
  TorchOut out;
  auto copy_with = [&](const ValuePtr& m, const Entries& with) {
    return out.CopyWith(o0.tensors, o0.optim->source, m, with);
  };
  ValuePtr inner = Get(o0.osd, "optimizer_state_dict");
  ValuePtr src_state = Get(inner, "state");
  const bool stepped = !o0.group_state.empty() && o0.group_state[0] != nullptr;
  for (const ValuePtr& st : o0.group_state) {
    if ((st != nullptr) != stepped) {
      return Invalid(o0.optim->name + ": the optimizer holds state for some sub-groups only");
    }
  }

  std::vector<ValuePtr> flats;
  ValuePtr state = EmptyLike(src_state);
  std::vector<std::vector<ValuePtr>> params_of;  // by param group: new sub-group indices
  for (size_t i = 0; i < subs.size(); ++i) {
    const SubGroup& s = subs[i];
    const TorchTensor* like = nullptr;
    ASSIGN_OR_RETURN(std::vector<Gather> fp32, FlatAt(z, s, "fp32", d, &like));
    const int64_t n = static_cast<int64_t>(s.total);
    if (s.slots.empty()) like = o0.fp32[0];  // an empty param group: an empty buffer
    flats.push_back(out.NewTensor(*like->node, std::move(fp32), {n}, {1},
                                  s.total * DtypeSize(like->dtype)));
    if (params_of.size() <= s.group) params_of.resize(s.group + 1);
    params_of[s.group].push_back(pickle::MakeInt(static_cast<int64_t>(i)));
    if (!stepped) continue;
    // The state of the source sub-group holding the first parameter gives the entries that
    // are not partitions ('step': every sub-group steps together). Each target sub-group gets
    // objects of its own: several may be cut from one source sub-group, and torch steps each
    // sub-group's 'step' tensor in place.
    const ValuePtr& first = o0.group_state[s.slots.empty() ? 0 : s.slots[0].g];
    Entries parts;
    for (const auto& [k, v] : PairsOf(*first)) {
      auto t = o0.tensors.find(v.get());
      if (t == o0.tensors.end() || t->second->shape.empty()) continue;
      if (k->kind != Kind::kStr) {
        return Invalid(o0.optim->name + ": optimizer state key " + KeyName(k) + " is not a name");
      }
      const std::string& key = k->str;
      const TorchTensor* sl = t->second;
      ASSIGN_OR_RETURN(std::vector<Gather> g, FlatAt(z, s, key, d, &sl));
      parts.push_back({key, out.NewTensor(*t->second->node, std::move(g), {n}, {1},
                                          s.total * DtypeSize(t->second->dtype))});
    }
    ASSIGN_OR_RETURN(ValuePtr ns,
                     out.CopyWithUnshared(o0.tensors, o0.optim->source, first, parts));
    Put(state, pickle::MakeInt(static_cast<int64_t>(i)), ns);
  }

  std::vector<ValuePtr> groups;
  const ValuePtr src_groups = Get(inner, "param_groups");
  for (size_t pg = 0; pg < src_groups->items.size(); ++pg) {
    ValuePtr params = pickle::MakeList(pg < params_of.size() ? params_of[pg]
                                                             : std::vector<ValuePtr>{});
    ASSIGN_OR_RETURN(ValuePtr ng, copy_with(src_groups->items[pg], {{"params", params}}));
    groups.push_back(ng);
  }
  ASSIGN_OR_RETURN(ValuePtr ninner, copy_with(inner, {{"state", state},
                                                      {"param_groups", pickle::MakeList(groups)}}));
  ASSIGN_OR_RETURN(ValuePtr osd,
                   copy_with(o0.osd, {{"optimizer_state_dict", ninner},
                                      {"fp32_flat_groups", pickle::MakeList(flats)},
                                      {"partition_count", pickle::MakeInt(D2)}}));
  ASSIGN_OR_RETURN(ValuePtr root,
                   copy_with(o0.optim->file->root, {{"optimizer_state_dict", osd}}));
  const std::string name = OptimFileName(c.optim_prefix, d, 0);
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(name), root, o0.optim->extra_records));
  return ViewEntry{c.src.tag + "/" + name, std::move(f)};
}

// Rank d's partition of frozen parameter `name` (numel elements) at dp size D2, from the source
// ranks' frozen_param_fragments (each a padded partition of ceil(numel / D) elements).
Result<ValuePtr> FrozenFragment(const Checkpoint& c, TorchOut* out, const std::string& name,
                                uint64_t numel, uint32_t d, uint32_t D2) {
  const Zero3& z = *c.z3;
  const uint64_t part = (numel + c.D - 1) / c.D, part2 = (numel + D2 - 1) / D2;
  const uint64_t a = std::min(numel, d * part2), b = std::min(numel, a + part2);
  const TorchTensor* like = nullptr;
  std::vector<Part> parts;
  for (uint32_t r = 0; r < c.D; ++r) {
    const Zero3Rank& o = z.ranks[r];
    ValuePtr v = Get(Get(o.model->file->root, "frozen_param_fragments"), name);
    auto it = v ? o.model_tensors.find(v.get()) : o.model_tensors.end();
    const TorchTensor* t = it == o.model_tensors.end() ? nullptr : it->second;
    if (!t || t->shape.size() != 1 || static_cast<uint64_t>(t->shape[0]) != part ||
        DtypeSize(t->dtype) == 0 || !IsContiguous(t->shape, t->stride) ||
        (like && t->dtype != like->dtype)) {
      return Invalid(o.model->name + ": frozen_param_fragments['" + name + "'] is not a 1-D " +
                     "partition of " + std::to_string(part) + " elements like rank 0's");
    }
    if (!like) like = t;
    const uint64_t from = std::max(a, r * part), to = std::min(b, (r + 1) * part);
    if (from >= to) continue;
    const uint64_t item = DtypeSize(t->dtype), len = (to - from) * item;
    parts.push_back(Part{o.model->source, t->offset + (from - r * part) * item, len, len});
  }
  const uint64_t item = DtypeSize(like->dtype);
  const int64_t n = static_cast<int64_t>(part2);
  return out->NewTensor(*like->node, GatherOf(std::move(parts), (part2 - (b - a)) * item), {n},
                        {1}, part2 * item);
}

// The model-states file of rank d at dp size D2: rank 0's, with dp_world_size D2, param_shapes
// in the new sub-groups, frozen_param_fragments re-cut, and shared_params as DeepSpeed keeps
// them (filled on rank 0 only).
Result<ViewEntry> PlanZero3Model(const Checkpoint& c, const std::vector<SubGroup>& subs,
                                 uint32_t d, uint32_t D2) {
  const Zero3& z = *c.z3;
  const Zero3Rank& o0 = z.ranks[0];
  const ValuePtr& src_root = o0.model->file->root;
  TorchOut out;
  Entries with = {
      {"dp_world_size", pickle::MakeInt(D2)}};
  // param_shapes: each new sub-group's mapping made like the source's first, name -> shape.
  std::map<std::string, std::pair<ValuePtr, ValuePtr>> entries;
  const ValuePtr src_shapes = Get(src_root, "param_shapes");  // a list (Decode checked it)
  for (const ValuePtr& m : src_shapes->items) {
    for (const auto& [name, shape] : PairsOf(*m)) entries[KeyName(name)] = {name, shape};
  }
  std::vector<ValuePtr> shapes;
  for (const SubGroup& s : subs) {
    ValuePtr m = EmptyLike(src_shapes->items[0]);
    for (const Slot& sl : s.slots) {
      const auto& [name, shape] = entries.at(sl.p->name);
      ASSIGN_OR_RETURN(ValuePtr ns, out.Copy(o0.model_tensors, o0.model->source, shape));
      Put(m, name, ns);
    }
    shapes.push_back(m);
  }
  with.push_back({"param_shapes", pickle::MakeList(shapes)});
  if (ValuePtr frozen = Get(src_root, "frozen_param_fragments"); IsMapping(frozen)) {
    const ValuePtr frozen_shapes = Get(src_root, "frozen_param_shapes");
    ValuePtr m = EmptyLike(frozen);
    for (const auto& [name, _] : PairsOf(*frozen)) {
      std::vector<int64_t> shape;
      if (!IntsOf(Get(frozen_shapes, KeyName(name)), &shape)) {
        return Invalid(o0.model->name + ": frozen parameter " + KeyName(name) +
                       " has no shape in frozen_param_shapes");
      }
      ASSIGN_OR_RETURN(const uint64_t numel,
                       Numel(shape, o0.model->name + ": frozen parameter " + KeyName(name)));
      ASSIGN_OR_RETURN(ValuePtr t, FrozenFragment(c, &out, KeyName(name), numel, d, D2));
      Put(m, name, t);
    }
    with.push_back({"frozen_param_fragments", m});
  }
  // DeepSpeed fills shared_params on global rank 0 only; the other ranks' (rank 1's) are empty.
  if (ValuePtr shared = Get(src_root, "shared_params"); shared && d > 0) {
    const ValuePtr rank1 = c.D > 1 ? Get(z.ranks[1].model->file->root, "shared_params") : nullptr;
    if (rank1) {
      ASSIGN_OR_RETURN(shared, out.Copy(z.ranks[1].model_tensors, z.ranks[1].model->source, rank1));
    } else if (IsMapping(shared)) {
      shared = EmptyLike(shared);
    }
    with.push_back({"shared_params", shared});
  }
  ASSIGN_OR_RETURN(ValuePtr root, out.CopyWith(o0.model_tensors, o0.model->source, src_root, with));
  char name[96];
  std::snprintf(name, sizeof name, "zero_pp_rank_%u_mp_rank_00_model_states.pt", d);
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(name), root, o0.model->extra_records));
  return ViewEntry{c.src.tag + "/" + name, std::move(f)};
}

}  // namespace

Status PlanDpZero3(const Checkpoint& c, uint32_t D2, std::vector<ViewEntry>* out) {
  ASSIGN_OR_RETURN(std::vector<SubGroup> subs, Regroup(c, D2));
  out->push_back(ViewEntry{"latest", {}});
  out->back().file.recipe.AddLiteral(c.src.tag);
  for (uint32_t d = 0; d < D2; ++d) {
    ASSIGN_OR_RETURN(ViewEntry m, PlanZero3Model(c, subs, d, D2));
    out->push_back(std::move(m));
    ASSIGN_OR_RETURN(ViewEntry o, PlanZero3Optim(c, subs, d, D2));
    out->push_back(std::move(o));
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard::ds
