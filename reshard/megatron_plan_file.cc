// The Megatron view planner: one target rank's model_optim_rng.pt (and distrib_optim.pt).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "reshard/megatron_planner.h"

namespace ckptfs::reshard::megatron_planner {

Result<ViewFile> Planner::PlanFile(uint32_t t, uint32_t p, uint32_t e, ViewFile* distrib) {
  const uint32_t ptp = static_cast<uint32_t>(uint64_t{t} * src_.tp / T_);
  const uint32_t ppp = static_cast<uint32_t>(uint64_t{p} * src_.pp / P_);
  const uint32_t pep = static_cast<uint32_t>(uint64_t{e} * src_.ep / E_);
  const Decoded& primary = File(ptp, ppp, pep);
  const int64_t per_stage = model_.num_layers / P_;
  const int64_t le = model_.num_experts > 0 ? model_.num_experts / E_ : 1;
  Out out;

  // The model entries of this stage (and of this EP rank's experts), in global order. A grouped
  // expert tensor is its first target expert's Global.
  std::vector<const Global*> mine;
  for (const Global& g : globals_) {
    bool in = false;
    switch (g.place) {
      case Global::kPre: in = p == 0; break;
      case Global::kPost: in = p == P_ - 1; break;
      case Global::kHead: in = p == P_ - 1 && P_ > 1; break;
      case Global::kLayer: in = g.layer->number / per_stage == p; break;
    }
    in = in && InTargetEp(g, e);
    if (in && (g.expert.kind == ExpertKey::kGrouped1 || g.expert.kind == ExpertKey::kGrouped2)) {
      in = g.global_expert == int64_t{e} * le;
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
    if (g->expert.kind == ExpertKey::kPerExpert) {  // the target's local expert number
      path.back().replace(g->expert_pos, g->expert_len,
                          std::to_string(g->global_expert - int64_t{e} * le));
    }
    if (g->layer) path = WithLayer(path, *g->layer, g->layer->number - p * per_stage);
    ValuePtr parent = model;
    std::string prefix;
    for (size_t i = 0; i + 1 < path.size(); ++i) {
      prefix += (prefix.empty() ? "" : ".") + path[i];
      auto it = made.find(prefix);
      if (it == made.end()) {
        const Decoded& from = FileOf(*g, 0);
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
    const uint32_t src_tp = std::min<uint32_t>(ptp, src_.tp - 1);
    const Decoded& holder = FileOf(*g, src_tp);
    const ModelEntry& me = holder.entries[g->entry[src_tp]];
    if (g->rule == Rule::kExtraState || !me.tensor) {
      ASSIGN_OR_RETURN(leaf, Copy(&out, holder, me.leaf));
    } else {
      ASSIGN_OR_RETURN(leaf, ReshardParam(
                                 &out, *g, t,
                                 [](const Decoded& d, size_t i) -> Result<const TorchTensor*> {
                                   return d.entries[i].tensor;
                                 },
                                 name));
      params.emplace_back(g, leaf);
      if (g->rule != Rule::kExtraState) dist_params.push_back(g);
    }
    Put(parent, pickle::MakeStr(path.back()), leaf);
  }

  ValuePtr optimizer;
  if (!primary.subs.empty()) {
    ASSIGN_OR_RETURN(optimizer, PlanOptimizer(&out, t, primary, params));
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
      if (model_.num_experts > 0) {
        SetArg(nd, "expert_model_parallel_size", pickle::MakeInt(E_));
        if (IntArg(nd, "expert_tensor_parallel_size")) {  // ETP = TP, as the source's
          SetArg(nd, "expert_tensor_parallel_size", pickle::MakeInt(T_));
        }
      }
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
    ASSIGN_OR_RETURN(*distrib, PlanDistOpt(t, p, e, primary, dist_params));
  }
  return out.Finish(primary.rank->file->prefix, root, primary.rank->extra_records);
}

}  // namespace ckptfs::reshard::megatron_planner
