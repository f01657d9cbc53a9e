// The Megatron view planner: one target rank's model_optim_rng.pt (and distrib_optim.pt).
#include <map>
#include <string>
#include <vector>

#include "reshard/megatron_planner.h"

namespace ckptfs::reshard::megatron_planner {

Result<ViewFile> Planner::PlanFile(uint32_t t, uint32_t p, ViewFile* distrib) {
  const uint32_t ptp = static_cast<uint32_t>(uint64_t{t} * src_.tp / T_);
  const uint32_t ppp = static_cast<uint32_t>(uint64_t{p} * src_.pp / P_);
  const Decoded& primary = File(ptp, ppp);
  const int64_t per_stage = model_.num_layers / P_;
  Out out;

  // The model entries of this stage, in global order.
  std::vector<const Global*> mine;
  for (const Global& g : globals_) {
    bool in = false;
    switch (g.place) {
      case Global::kPre: in = p == 0; break;
      case Global::kPost: in = p == P_ - 1; break;
      case Global::kHead: in = p == P_ - 1 && P_ > 1; break;
      case Global::kLayer: in = g.layer->number / per_stage == p; break;
    }
    if (in) mine.push_back(&g);
  }

  // The model tree, containers shaped like the source's.
  ValuePtr model = EmptyLike(primary.model);
  std::map<std::string, ValuePtr> made{{"", model}};
  std::vector<std::pair<const Global*, ValuePtr>> params;  // (entry, target tensor) in order
  std::vector<const Global*> dist_params;  // the parameters, in order (distributed optimizer)
  for (const Global* g : mine) {
    std::vector<std::string> path = g->path;
    if (g->layer) path = WithLayer(path, *g->layer, g->layer->number - p * per_stage);
    ValuePtr parent = model;
    std::string prefix;
    for (size_t i = 0; i + 1 < path.size(); ++i) {
      prefix += (prefix.empty() ? "" : ".") + path[i];
      auto it = made.find(prefix);
      if (it == made.end()) {
        const Decoded& from = files_[g->stage * src_.tp];
        auto tmpl = from.containers.find(prefix);
        ValuePtr c = tmpl != from.containers.end() ? EmptyLike(tmpl->second)
                                                   : pickle::MakeDict({});
        if (g->from_embedding && tmpl == from.containers.end()) {
          c = std::make_shared<Value>();
          c->kind = Kind::kObject;
          c->callable = pickle::MakeGlobal("collections", "OrderedDict");
          c->args = pickle::MakeTuple({});
        }
        Put(parent, pickle::MakeStr(path[i]), c);
        it = made.emplace(prefix, c).first;
      }
      parent = it->second;
    }
    const std::string name = "model." + Join(path);
    ValuePtr leaf;
    const size_t src_tp = std::min<uint32_t>(ptp, src_.tp - 1);
    const Decoded& holder = files_[g->stage * src_.tp + src_tp];
    const ModelEntry& e = holder.entries[g->entry[src_tp]];
    if (g->rule == Rule::kExtraState || !e.tensor) {
      ASSIGN_OR_RETURN(leaf, Copy(&out, holder, e.leaf));
    } else {
      ASSIGN_OR_RETURN(leaf, ReshardTensor(&out, *g, t,
                                           [](const Decoded& d, size_t i) -> Result<const TorchTensor*> {
                                             return d.entries[i].tensor;
                                           },
                                           name));
      params.emplace_back(g, leaf);
      if (g->rule != Rule::kExtraState) dist_params.push_back(g);
    }
    Put(parent, pickle::MakeStr(path.back()), leaf);
  }

  // The optimizer.
  ValuePtr optimizer;
  if (primary.optim_inner) {
    // Target groups: by class, ordered by first appearance (megatron.core) or as the source.
    // megatron.core's order (groups carry wd_mult): the order in which each class first appears
    // among the stage's parameters, or since 2026 sorted with the weight-decay group first. A
    // source stage >= 1 whose first parameter has no weight decay shows which; without one,
    // first appearance.
    bool by_appearance = false;
    for (const ValuePtr& g : primary.groups) by_appearance |= Get(g, "wd_mult") != nullptr;
    bool sorted_groups = false;
    for (const Decoded& d : files_) {
      if (!by_appearance || d.rank->pp == 0 || d.groups.size() < 2) continue;
      size_t first = 0;
      while (first < d.entries.size() && d.opt_group[first] < 0) ++first;
      if (first < d.entries.size() && NoWeightDecay(d.entries[first])) {
        sorted_groups = d.group_class[0] == 0;
        break;
      }
    }
    // A group template per class, from the primary file (or any file that has one).
    ValuePtr tmpl[2] = {nullptr, nullptr};
    std::vector<int> order;
    for (const Decoded& d : files_) {
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (d.opt_group[i] < 0) continue;
        const int c = NoWeightDecay(d.entries[i]) ? 1 : 0;
        if (!tmpl[c] || (&d == &primary && tmpl[c] != d.groups[d.opt_group[i]])) {
          if (!tmpl[c] || &d == &primary) tmpl[c] = d.groups[d.opt_group[i]];
        }
      }
    }
    std::vector<std::vector<size_t>> members(2);  // class -> indices into params
    for (size_t i = 0; i < params.size(); ++i) {
      const Global& g = *params[i].first;
      const Decoded& d0 = files_[g.stage * src_.tp];
      const ModelEntry& e = d0.entries[g.entry[0]];
      const int c = NoWeightDecay(e) ? 1 : 0;
      if (d0.opt_index[g.entry[0]] < 0) {
        return Invalid("parameter 'model." + Join(g.path) + "' has no optimizer state");
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
      for (const ValuePtr& g : primary.groups) {
        const int c = g == tmpl[1] ? 1 : 0;
        if (!members[c].empty()) order.push_back(c);
      }
      for (int c = 0; c < 2; ++c) {
        if (!members[c].empty() && std::find(order.begin(), order.end(), c) == order.end())
          order.push_back(c);
      }
    }
    std::vector<ValuePtr> groups, fp32_groups;
    ValuePtr state = pickle::MakeDict({});
    int64_t next = 0;
    for (int c : order) {
      std::vector<ValuePtr> ids, fp32s;
      for (size_t i : members[c]) {
        const Global& g = *params[i].first;
        const std::string name = "model." + Join(g.path);
        const int64_t idx = next++;
        ids.push_back(pickle::MakeInt(idx));
        // The per-parameter state of each source shard.
        auto state_of = [&](const Decoded& d, size_t entry) -> ValuePtr {
          ValuePtr st = Get(d.optim_inner, "state");
          if (!IsMapping(st)) return nullptr;
          for (const auto& [k, v] : PairsOf(*st)) {
            if (k && k->kind == Kind::kInt && k->i == d.opt_index[entry]) return v;
          }
          return nullptr;
        };
        const Decoded& d0 = files_[g.stage * src_.tp];
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
              ASSIGN_OR_RETURN(
                  ValuePtr nt,
                  ReshardTensor(&out, g,
                                t,
                                [&](const Decoded& d, size_t entry) -> Result<const TorchTensor*> {
                                  ValuePtr sd = state_of(d, entry);
                                  ValuePtr x = Get(sd, key);
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
              const Decoded& df = files_[g.stage * src_.tp + first];
              ValuePtr x = Get(state_of(df, g.entry[first]), key);
              ASSIGN_OR_RETURN(ValuePtr nx, Copy(&out, df, x ? x : v));
              Put(ns, k, nx);
            }
          }
          Put(state, pickle::MakeInt(idx), ns);
        }
        if (primary.fp32) {
          ASSIGN_OR_RETURN(
              ValuePtr m,
              ReshardTensor(&out, g, t,
                            [&](const Decoded& d, size_t entry) -> Result<const TorchTensor*> {
                              const ValuePtr& f = d.fp32;
                              const int64_t gi = d.opt_group[entry], pos = d.opt_pos[entry];
                              if (!f || f->kind != Kind::kList ||
                                  gi >= static_cast<int64_t>(f->items.size()) ||
                                  f->items[gi]->kind != Kind::kList ||
                                  pos >= static_cast<int64_t>(f->items[gi]->items.size())) {
                                return Invalid("fp32_from_fp16_params does not match the model's "
                                               "parameters at '" + name + "'");
                              }
                              auto x = d.tensors.find(f->items[gi]->items[pos].get());
                              if (x == d.tensors.end() ||
                                  x->second->shape != d.entries[entry].tensor->shape) {
                                return Invalid("fp32 master of '" + name +
                                               "' does not have the parameter's shape");
                              }
                              return x->second;
                            },
                            name + " fp32 master"));
          fp32s.push_back(m);
        }
      }
      ASSIGN_OR_RETURN(ValuePtr group, Rebuild(&out, primary, tmpl[c],
                                               {{"params", pickle::MakeList(std::move(ids))}}));
      groups.push_back(group);
      fp32_groups.push_back(pickle::MakeList(std::move(fp32s)));
    }
    ASSIGN_OR_RETURN(ValuePtr inner,
                     Rebuild(&out, primary, primary.optim_inner,
                             {{"state", state}, {"param_groups", pickle::MakeList(groups)}}));
    if (primary.optim_wrapper) {
      ASSIGN_OR_RETURN(optimizer, Rebuild(&out, primary, primary.optim_wrapper,
                                          {{"optimizer", inner},
                                           {"fp32_from_fp16_params", pickle::MakeList(fp32_groups)}}));
    } else {
      optimizer = inner;
    }
  }

  // The root, in the primary's key order.
  ValuePtr root = EmptyLike(primary.root);
  for (const auto& [k, v] : PairsOf(*primary.root)) {
    const std::string key = KeyName(k);
    if (key == "model") {
      Put(root, k, model);
    } else if (key == "optimizer" && optimizer) {
      Put(root, k, optimizer);
    } else if (key == "args") {
      auto args = std::make_shared<Value>(*v);
      ValuePtr dict = ArgsDict(v);
      ValuePtr nd = EmptyLike(dict);
      for (const auto& [ak, av] : PairsOf(*dict)) {
        ASSIGN_OR_RETURN(ValuePtr nv, Copy(&out, primary, av));
        Put(nd, ak, nv);
      }
      SetArg(nd, "tensor_model_parallel_size", pickle::MakeInt(T_));
      SetArg(nd, "pipeline_model_parallel_size", pickle::MakeInt(P_));
      SetArg(nd, "transformer_pipeline_model_parallel_size", pickle::MakeInt(P_));
      SetArg(nd, "padded_vocab_size", pickle::MakeInt(vocab_.target_rows));
      if (auto dp = IntArg(nd, "data_parallel_size"); dp && IntArg(nd, "world_size")) {
        SetArg(nd, "world_size", pickle::MakeInt(int64_t{T_} * P_ * *dp));
      }
      if (args->kind == Kind::kObject) {
        args->state = nd;
      } else {
        args = nd;
      }
      Put(root, k, args);
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, Copy(&out, primary, v));
      Put(root, k, nv);
    }
  }

  if (distrib && primary.dist) {
    ASSIGN_OR_RETURN(*distrib, PlanDistOpt(t, p, primary, dist_params));
  }
  return out.Finish(primary.rank->file->prefix, root, primary.rank->extra_records);
}

}  // namespace ckptfs::reshard::megatron_planner
