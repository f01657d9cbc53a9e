// The Megatron view planner: one target rank's non-distributed optimizer state, resharded like
// the parameters it belongs to (docs/views.md, "Optimizer (non-distributed)").
//
// megatron.core gives expert parameters (allreduce False: experts at expert parallelism > 1) an
// optimizer of their own, and its ChainedOptimizer saves a list [dense, experts] when there are
// two, the single optimizer's state dict when there is one (optimizer/__init__.py
// get_megatron_optimizer, optimizer.py ChainedOptimizer.state_dict). Each numbers its own
// parameters from 0.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "reshard/megatron_planner.h"

namespace ckptfs::reshard::megatron_planner {

Result<ValuePtr> Planner::PlanOptimizer(
    Out* out, uint32_t t, const Decoded& primary,
    const std::vector<std::pair<const Global*, ValuePtr>>& params) {
  // megatron.core's group order (groups carry wd_mult): the order in which each class first
  // appears among the stage's parameters, or since 2026 sorted with the weight-decay group first.
  // A source stage >= 1 whose first (dense) parameter has no weight decay shows which; without
  // one, first appearance.
  bool sorted_groups = false;
  for (const Decoded& d : files_) {
    if (d.subs.empty() || d.rank->pp == 0 || d.subs[0].groups.size() < 2) continue;
    bool by_appearance = false;
    for (const ValuePtr& g : d.subs[0].groups) by_appearance |= Get(g, "wd_mult") != nullptr;
    if (!by_appearance) continue;
    size_t first = 0;
    while (first < d.entries.size() && (d.opt_group[first] < 0 || d.opt_sub[first] != 0)) ++first;
    if (first < d.entries.size() && NoWeightDecay(d.entries[first])) {
      sorted_groups = d.subs[0].group_class[0] == 0;
      break;
    }
  }
  std::vector<const Global*> dense, experts;
  for (const auto& [g, leaf] : params) (ExpertParallel(*g, E_) ? experts : dense).push_back(g);
  ASSIGN_OR_RETURN(ValuePtr first, PlanSubOptimizer(out, t, primary, false, dense, sorted_groups));
  if (experts.empty()) return first;
  ASSIGN_OR_RETURN(ValuePtr second,
                   PlanSubOptimizer(out, t, primary, true, experts, sorted_groups));
  return pickle::MakeList({first, second});
}

Result<ValuePtr> Planner::PlanSubOptimizer(Out* out, uint32_t t, const Decoded& primary,
                                           bool expert, const std::vector<const Global*>& params,
                                           bool sorted_groups) {
  // The template: the primary's sub-optimizer of this kind, or any file's; for an experts'
  // optimizer that no source file has (the source ran without expert parallelism), the dense
  // one's, its groups marked is_expert_parallel.
  auto kind_of = [](const Decoded& d, size_t s) { return d.subs[s].expert; };
  const Decoded* tfile = nullptr;
  size_t tsub = 0;
  auto find_in = [&](const Decoded& d) {
    for (size_t s = 0; s < d.subs.size() && !tfile; ++s) {
      if (kind_of(d, s) == expert) {
        tfile = &d;
        tsub = s;
      }
    }
  };
  find_in(primary);
  for (size_t f = 0; f < files_.size() && !tfile; ++f) find_in(files_[f]);
  bool from_dense = false;
  if (!tfile) {
    tfile = &primary;
    tsub = 0;
    from_dense = true;
  }
  const Decoded::SubOpt& ts = tfile->subs[tsub];

  bool by_appearance = false;
  for (const ValuePtr& g : ts.groups) by_appearance |= Get(g, "wd_mult") != nullptr;
  // A group template per class, from the primary file (or any file that has one), of the
  // template's kind.
  ValuePtr tmpl[2] = {nullptr, nullptr};
  const Decoded* tmpl_file[2] = {nullptr, nullptr};
  const bool want = from_dense ? false : expert;
  for (const Decoded& d : files_) {
    for (size_t i = 0; i < d.entries.size(); ++i) {
      if (d.opt_group[i] < 0 || kind_of(d, static_cast<size_t>(d.opt_sub[i])) != want) continue;
      const int c = NoWeightDecay(d.entries[i]) ? 1 : 0;
      if (!tmpl[c] || &d == &primary) {
        tmpl[c] = d.subs[d.opt_sub[i]].groups[d.opt_group[i]];
        tmpl_file[c] = &d;
      }
    }
  }
  std::vector<int> order;
  std::vector<std::vector<size_t>> members(2);  // class -> indices into params
  for (size_t i = 0; i < params.size(); ++i) {
    const Global& g = *params[i];
    const Decoded& d0 = FileOf(g, 0);
    const int c = NoWeightDecay(d0.entries[g.entry[0]]) ? 1 : 0;
    if (d0.opt_index[g.entry[0]] < 0) {
      return Invalid("parameter 'model." + Join(g.path) + "' has no optimizer state");
    }
    if (!tmpl[c]) {
      return Invalid("no source optimizer group of the class of 'model." + Join(g.path) + "'");
    }
    if (members[c].empty()) order.push_back(c);
    members[c].push_back(i);
  }
  if (sorted_groups) {
    order.clear();
    for (int c = 0; c < 2; ++c) {
      if (!members[c].empty()) order.push_back(c);
    }
  }
  if (!by_appearance) {
    order.clear();
    for (const ValuePtr& g : ts.groups) {
      const int c = g == tmpl[1] ? 1 : 0;
      if (!members[c].empty() && std::find(order.begin(), order.end(), c) == order.end()) {
        order.push_back(c);
      }
    }
    for (int c = 0; c < 2; ++c) {
      if (!members[c].empty() && std::find(order.begin(), order.end(), c) == order.end())
        order.push_back(c);
    }
  }
  // The per-parameter state of a source shard.
  auto state_of = [](const Decoded& d, size_t entry) -> ValuePtr {
    if (d.opt_sub[entry] < 0) return nullptr;
    ValuePtr st = Get(d.subs[d.opt_sub[entry]].inner, "state");
    if (!IsMapping(st)) return nullptr;
    for (const auto& [k, v] : PairsOf(*st)) {
      if (k && k->kind == Kind::kInt && k->i == d.opt_index[entry]) return v;
    }
    return nullptr;
  };
  std::vector<ValuePtr> groups, fp32_groups;
  ValuePtr state = pickle::MakeDict({});
  int64_t next = 0;
  for (int c : order) {
    std::vector<ValuePtr> ids, fp32s;
    for (size_t i : members[c]) {
      const Global& g = *params[i];
      const std::string name = "model." + Join(g.path);
      const int64_t idx = next++;
      ids.push_back(pickle::MakeInt(idx));
      const Decoded& d0 = FileOf(g, 0);
      ValuePtr s0 = state_of(d0, g.entry[0]);
      if (IsMapping(s0)) {
        ValuePtr ns = EmptyLike(s0);
        const uint32_t first = FirstSourceRank(g.rule, src_.tp, t, T_, vocab_);
        for (const auto& [k, v] : PairsOf(*s0)) {
          const std::string key = KeyName(k);
          auto tt = d0.tensors.find(v.get());
          const TorchTensor* param_t = d0.entries[g.entry[0]].tensor;
          if (tt != d0.tensors.end() && tt->second->shape == param_t->shape &&
              tt->second->shape.size() > 0) {
            ASSIGN_OR_RETURN(ValuePtr nt,
                             ReshardParam(
                                 out, g, t,
                                 [&](const Decoded& d, size_t entry) -> Result<const TorchTensor*> {
                                   ValuePtr x = Get(state_of(d, entry), key);
                                   auto f = x ? d.tensors.find(x.get()) : d.tensors.end();
                                   if (f == d.tensors.end())
                                     return Invalid("optimizer state '" + key + "' of '" + name +
                                                    "' is missing on a tensor-parallel rank");
                                   return f->second;
                                 },
                                 name + " optimizer state " + key));
            Put(ns, k, nt);
          } else if (tt != d0.tensors.end() && tt->second->shape.size() > 1) {
            return Invalid("optimizer state '" + key + "' of '" + name +
                           "' has a shape unlike its parameter's");
          } else {
            const Decoded& df = FileOf(g, first);
            ValuePtr x = Get(state_of(df, g.entry[first]), key);
            ASSIGN_OR_RETURN(ValuePtr nx, Copy(out, df, x ? x : v));
            Put(ns, k, nx);
          }
        }
        Put(state, pickle::MakeInt(idx), ns);
      }
      if (ts.fp32) {
        ASSIGN_OR_RETURN(
            ValuePtr m,
            ReshardParam(
                out, g, t,
                [&](const Decoded& d, size_t entry) -> Result<const TorchTensor*> {
                  const int64_t s = d.opt_sub[entry];
                  const ValuePtr f = s < 0 ? nullptr : d.subs[s].fp32;
                  const int64_t gi = d.opt_group[entry], pos = d.opt_pos[entry];
                  if (!f || f->kind != Kind::kList || gi >= static_cast<int64_t>(f->items.size()) ||
                      f->items[gi]->kind != Kind::kList ||
                      pos >= static_cast<int64_t>(f->items[gi]->items.size())) {
                    return Invalid(
                        "fp32_from_fp16_params does not match the model's "
                        "parameters at '" +
                        name + "'");
                  }
                  auto x = d.tensors.find(f->items[gi]->items[pos].get());
                  if (x == d.tensors.end() || x->second->shape != d.entries[entry].tensor->shape) {
                    return Invalid("fp32 master of '" + name +
                                   "' does not have the parameter's shape");
                  }
                  return x->second;
                },
                name + " fp32 master"));
        fp32s.push_back(m);
      }
    }
    std::map<std::string, ValuePtr> replace{{"params", pickle::MakeList(std::move(ids))}};
    if (expert) replace.emplace("is_expert_parallel", pickle::MakeBool(true));
    ASSIGN_OR_RETURN(ValuePtr group, Rebuild(out, *tmpl_file[c], tmpl[c], replace));
    groups.push_back(group);
    fp32_groups.push_back(pickle::MakeList(std::move(fp32s)));
  }
  ASSIGN_OR_RETURN(ValuePtr inner,
                   Rebuild(out, *tfile, ts.inner,
                           {{"state", state}, {"param_groups", pickle::MakeList(groups)}}));
  if (!ts.wrapper) return inner;
  return Rebuild(out, *tfile, ts.wrapper,
                 {{"optimizer", inner}, {"fp32_from_fp16_params", pickle::MakeList(fp32_groups)}});
}

}  // namespace ckptfs::reshard::megatron_planner
