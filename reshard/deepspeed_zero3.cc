// ZeRO stage 3 sources: the tag directory decoded, and its universal view, the directory
// ds_to_universal writes for stage 3 (without tensor parallelism): per parameter one flat tensor
// per state, each gathered from the parameter's partition in every dp rank's flat buffers.

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
        std::vector<Part> parts;
        const TorchTensor* like = nullptr;
        for (uint32_t d = 0; d < c.D; ++d) {
          const Zero3Rank& o = z.ranks[d];
          const TorchTensor* t = o.fp32[g];
          if (key != "fp32") {
            ValuePtr v = Get(o.group_state[g], key);
            auto it = v ? o.tensors.find(v.get()) : o.tensors.end();
            t = it == o.tensors.end() ? nullptr : it->second;
          }
          if (!t) return Invalid(o.optim->name + " has no '" + key + "' of " + p.name);
          if (!like) like = t;
          if (t->dtype != like->dtype) {
            return Invalid("'" + key + "' of " + p.name + " has different dtypes across ranks");
          }
          const uint64_t item = DtypeSize(t->dtype);
          if (item == 0) return Invalid("'" + key + "' of " + p.name + " has dtype " + t->dtype);
          const uint64_t real = p.Real(d);
          if (real > 0) {
            parts.push_back(Part{o.optim->source, t->offset + p.offset * item, real * item,
                                 real * item});
          }
        }
        const uint64_t nbytes = p.numel * DtypeSize(like->dtype);
        std::vector<Gather> gathers;
        if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
        const std::vector<int64_t> shape{static_cast<int64_t>(p.numel)};
        TorchOut o;
        o.set_location("cpu");
        ValuePtr t = o.NewTensor(*like->node, std::move(gathers), shape, ContiguousStride(shape),
                                 nbytes);
        const std::string path = c.src.tag + "/zero/" + p.name + "/" + key + ".pt";
        ASSIGN_OR_RETURN(ViewFile f, o.Finish(ArchivePrefix(path), t,
                                              z.ranks[0].optim->extra_records));
        out->push_back(ViewEntry{path, std::move(f)});
      }
    }
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard::ds
