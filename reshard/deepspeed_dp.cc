#include <algorithm>
#include <memory>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

}  // namespace

Result<ViewEntry> PlanOptimFile(const Checkpoint& c, const Target& target, uint32_t tp, uint32_t d,
                                uint32_t D) {
  const TpRank& tr = *target.primary;
  const Optim& o0 = tr.optim[0];
  const size_t G = target.groups.size();
  std::vector<GroupCut> cuts;
  for (size_t g = 0; g < G; ++g) {
    if (target.cut) {
      ASSIGN_OR_RETURN(GroupCut cut, target.cut(g, d));
      cuts.push_back(std::move(cut));
      continue;
    }
    GroupCut cut;
    cut.part = Partitioning(target.totals[g], D);
    cut.r = d;
    cut.fragments = Fragments(target.groups[g], cut.part, d);
    cut.count = D;
    cut.range = [&target, g](const std::string& key, uint64_t from, uint64_t to) {
      return target.range(g, key, from, to);
    };
    cuts.push_back(std::move(cut));
  }
  TorchOut out;
  auto copy = [&](const ValuePtr& v) { return out.Copy(o0.tensors, o0.file->source, v); };
  auto copy_with = [&](const ValuePtr& m, const Entries& with) {
    return out.CopyWith(o0.tensors, o0.file->source, m, with);
  };

  // base_optimizer_state: rank 0's, with every partition-sized state tensor re-cut.
  ValuePtr state = EmptyLike(o0.state);
  for (const auto& [gk, gs] : PairsOf(*o0.state)) {
    const size_t g = static_cast<size_t>(gk->i);
    const Partitioning& part = cuts[g].part;
    const uint64_t r = cuts[g].r;
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
      ASSIGN_OR_RETURN(std::vector<Gather> gathers, cuts[g].range(key, part.Begin(r), part.End(r)));
      if (part.Padding(r)) gathers.push_back(Gather{1, {}, part.Padding(r) * item});
      const int64_t n = static_cast<int64_t>(part.size);
      Put(ns, k, out.NewTensor(*t->second->node, std::move(gathers), {n}, {1}, part.size * item));
    }
    Put(state, gk, ns);
  }
  ASSIGN_OR_RETURN(ValuePtr base, copy_with(o0.base, {{"state", state}}));

  // The fp32 partitions (padding stripped), the paddings and the slice mappings.
  std::vector<ValuePtr> fp32, paddings, counts, mappings;
  ValuePtr fragment_class;  // a source fragment_address, the template for new ones
  for (const Optim& o : tr.optim) {
    for (const ValuePtr& m : o.mappings) {
      if (!fragment_class && !PairsOf(*m).empty()) fragment_class = PairsOf(*m)[0].second;
    }
  }
  const bool bf16_opt = c.bf16_optimizer.value_or(false);
  for (size_t g = 0; g < G; ++g) {
    const Partitioning& part = cuts[g].part;
    const uint64_t r = cuts[g].r;
    const TorchTensor& like = *o0.fp32[g];
    ASSIGN_OR_RETURN(std::vector<Gather> gathers, cuts[g].range("fp32", part.Begin(r), part.End(r)));
    // ZeRO 1/2 saves its fp32 partition without the padding; BF16_Optimizer with it (zeros, as
    // its flat buffer is padded), and the whole padding as the last rank's group_paddings.
    const uint64_t n = bf16_opt ? part.size : part.Real(r), item = DtypeSize(like.dtype);
    if (n > part.Real(r)) gathers.push_back(Gather{1, {}, (n - part.Real(r)) * item});
    fp32.push_back(out.NewTensor(*like.node, std::move(gathers), {static_cast<int64_t>(n)}, {1},
                                 n * item));
    const uint64_t padding =
        !bf16_opt ? part.Padding(r) : r + 1 == part.dp ? part.size * part.dp - part.total : 0;
    paddings.push_back(pickle::MakeInt(static_cast<int64_t>(padding)));
    ValuePtr m = EmptyLike(o0.mappings[g]);
    for (const auto& [name, frag] : cuts[g].fragments) {
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
      Put(m, pickle::MakeStr(name), fa);
    }
    mappings.push_back(m);
  }
  ValuePtr pc = Get(o0.osd, "partition_count");
  if (pc && pc->kind == Kind::kList) {
    for (size_t i = 0; i < pc->items.size(); ++i) {
      counts.push_back(pickle::MakeInt(i < G ? cuts[i].count : D));
    }
  }

  Entries with = {{"base_optimizer_state", base},
               {"single_partition_of_fp32_groups", pickle::MakeList(fp32)},
               {"group_paddings", pickle::MakeList(paddings)},
               {"param_slice_mappings", pickle::MakeList(mappings)}};
  if (pc && pc->kind == Kind::kList) with.push_back({"partition_count", pickle::MakeList(counts)});
  ASSIGN_OR_RETURN(ValuePtr osd, copy_with(o0.osd, with));
  ASSIGN_OR_RETURN(ValuePtr root, copy_with(o0.root, {{"optimizer_state_dict", osd}}));
  const std::string name = OptimFileName(c.optim_prefix, d, tp);
  ASSIGN_OR_RETURN(ViewFile f, out.Finish(ArchivePrefix(name), root, o0.file->extra_records));
  return ViewEntry{c.src.tag + "/" + name, std::move(f)};
}

// A model-states file with dp_world_size set to D. Its storages are the source's records,
// whole and under their own keys (so the module's tensors keep sharing their flat buffers).
Result<ViewEntry> PlanModelStates(const Checkpoint& c, const TpRank& tr, uint32_t tp, uint32_t D) {
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
  return ViewEntry{c.src.tag + "/" + ModelName(tp), zip.Finish()};
}

void PlanLatestAndCopies(const Checkpoint& c, const std::vector<DsLayerFile>& files,
                         std::vector<ViewEntry>* out) {
  out->push_back(ViewEntry{"latest", {}});
  out->back().file.recipe.AddLiteral(c.src.tag);
  for (const DsLayerFile& l : files) {
    ViewEntry e{c.src.tag + "/" + l.name, {}};
    e.file.recipe.AddGather(1, {Part{l.source, 0, l.size, l.size}});
    out->push_back(std::move(e));
  }
}

Status PlanDp(const Checkpoint& c, uint32_t D, std::vector<ViewEntry>* out) {
  // A pipeline module's layer files do not depend on the data-parallel size (DeepSpeed names
  // them without it, and dp rank 0 writes them): as they are.
  PlanLatestAndCopies(c, c.src.layers, out);
  for (uint32_t t = 0; t < c.tp.size(); ++t) {
    ASSIGN_OR_RETURN(ViewEntry m, PlanModelStates(c, c.tp[t], t, D));
    out->push_back(std::move(m));
    const TpRank& tr = c.tp[t];
    Target target;
    target.primary = &tr;
    target.groups = tr.groups;
    target.totals = tr.totals;
    target.range = [&c, &tr](size_t g, const std::string& key, uint64_t from,
                             uint64_t to) -> Result<std::vector<Gather>> {
      auto pick = [&](const Optim& o) {
        return key == "fp32" ? o.fp32[g] : Checkpoint::StateTensor(o, g, key);
      };
      ASSIGN_OR_RETURN(std::vector<Part> parts,
                       c.Flat(tr, g, from, to, pick,
                              "'" + key + "' of group " + std::to_string(g)));
      std::vector<Gather> gathers;
      if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
      return gathers;
    };
    for (uint32_t d = 0; d < D; ++d) {
      ASSIGN_OR_RETURN(ViewEntry e, PlanOptimFile(c, target, t, d, D));
      out->push_back(std::move(e));
    }
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard::ds
