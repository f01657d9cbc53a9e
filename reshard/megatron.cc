#include "reshard/megatron.h"

#include <cctype>
#include <cstdio>

#include "reshard/megatron_planner.h"

namespace ckptfs::reshard {
namespace megatron_planner {

std::optional<LayerRef> FindLayer(const std::vector<std::string>& path) {
  static constexpr std::string_view kWord = "layers.";
  for (size_t c = 0; c < path.size(); ++c) {
    const std::string& s = path[c];
    for (size_t at = s.find(kWord); at != std::string::npos; at = s.find(kWord, at + 1)) {
      if (at != 0 && s[at - 1] != '.') continue;
      size_t d = at + kWord.size(), e = d;
      while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      if (e == d || (e < s.size() && s[e] != '.')) continue;
      return LayerRef{c, d, e - d, std::stoll(s.substr(d, e - d))};
    }
    if (s == "layers" && c + 1 < path.size() && !path[c + 1].empty() &&
        path[c + 1].find_first_not_of("0123456789") == std::string::npos) {
      return LayerRef{c + 1, 0, path[c + 1].size(), std::stoll(path[c + 1])};
    }
  }
  return std::nullopt;
}
std::vector<std::string> WithLayer(std::vector<std::string> path, const LayerRef& r, int64_t n) {
  path[r.component].replace(r.pos, r.len, std::to_string(n));
  return path;
}
std::string Join(const std::vector<std::string>& path) {
  std::string s;
  for (const auto& c : path) s += (s.empty() ? "" : ".") + c;
  return s;
}

namespace {

Status Flatten(Decoded* d, const ValuePtr& m, std::vector<std::string>* path, int depth) {
  if (depth > 64) return Invalid("model state nests too deep");
  d->containers.emplace(Join(*path), m);
  for (const auto& [k, v] : PairsOf(*m)) {
    path->push_back(KeyName(k));
    if (IsMapping(v)) {
      RETURN_IF_ERROR(Flatten(d, v, path, depth + 1));
    } else {
      ModelEntry e{*path, v, nullptr};
      if (auto it = d->tensors.find(v.get()); it != d->tensors.end()) e.tensor = it->second;
      d->entries.push_back(std::move(e));
    }
    path->pop_back();
  }
  return Status::Ok();
}

double Number(const ValuePtr& v, double dflt) {
  if (!v) return dflt;
  if (v->kind == Kind::kFloat) return v->f;
  if (v->kind == Kind::kInt) return static_cast<double>(v->i);
  return dflt;
}
}  // namespace

bool NoWeightDecay(const ModelEntry& e) {
  return (!e.path.empty() && e.path.back().ends_with("bias")) ||
         Join(e.path).ends_with(".bias") || e.tensor->shape.size() == 1;
}

namespace {

// One sub-optimizer's state: the wrapper (Float16OptimizerWithFloat16Params: optimizer,
// fp32_from_fp16_params) or the torch optimizer's state dict itself (fp32).
Status DecodeSubOptimizer(const ValuePtr& o, Decoded::SubOpt* sub) {
  if (!IsMapping(o)) return Invalid("an optimizer state is not a dict");
  sub->wrapper = o;
  if (ValuePtr inner = Get(o, "optimizer"); IsMapping(inner)) {
    sub->inner = inner;
    sub->fp32 = Get(o, "fp32_from_fp16_params");
  } else if (Get(o, "param_groups")) {
    sub->inner = o;
    sub->wrapper = nullptr;
  } else {
    return Invalid("optimizer state of an unknown kind (a distributed optimizer?)");
  }
  ValuePtr pg = Get(sub->inner, "param_groups");
  if (!pg || pg->kind != Kind::kList) return Invalid("optimizer has no param_groups list");
  sub->groups = pg->items;
  // Each group's class: no weight decay when wd_mult is 0, or without wd_mult, weight_decay 0.
  std::vector<int> cls;
  bool have_wd_mult = false;
  for (const ValuePtr& g : sub->groups) {
    if (!IsMapping(g)) return Invalid("optimizer param group is not a dict");
    if (ValuePtr w = Get(g, "wd_mult")) {
      have_wd_mult = true;
      cls.push_back(Number(w, 1) == 0 ? 1 : 0);
    } else {
      cls.push_back(Number(Get(g, "weight_decay"), 0) == 0 ? 1 : 0);
    }
  }
  if (!have_wd_mult && cls.size() == 2 && cls[0] == cls[1]) cls = {0, 1};  // both decay 0: legacy order
  sub->group_class = cls;
  return Status::Ok();
}

// Maps each model parameter of d to its sub-optimizer, group, position and state index. With
// expert parallelism (source_ep > 1) a file holding expert parameters has two sub-optimizers,
// the dense parameters' and the experts'; else one, holding every parameter in model order.
Status DecodeOptimizer(Decoded* d, const Rules& rules, bool swiglu, uint32_t source_ep) {
  const size_t n = d->entries.size();
  d->opt_sub.assign(n, -1);
  d->opt_index.assign(n, -1);
  d->opt_group.assign(n, -1);
  d->opt_pos.assign(n, -1);
  ValuePtr o = Get(d->root, "optimizer");
  if (o && o->kind == Kind::kList) {
    if (o->items.size() != 2) {
      return Invalid("the optimizer state is a list of " + std::to_string(o->items.size()) +
                     " sub-optimizers (expected the dense and the experts' ones)");
    }
    d->optim_list = true;
    d->subs.resize(2);
    for (size_t i = 0; i < 2; ++i) RETURN_IF_ERROR(DecodeSubOptimizer(o->items[i], &d->subs[i]));
    d->subs[1].expert = true;
  } else if (IsMapping(o)) {
    d->subs.resize(1);
    RETURN_IF_ERROR(DecodeSubOptimizer(o, &d->subs[0]));
  } else {
    return Status::Ok();  // saved without optimizer (--no-save-optim)
  }
  for (size_t s = 0; s < d->subs.size(); ++s) {
    Decoded::SubOpt& sub = d->subs[s];
    int group_of_class[2] = {-1, -1};
    for (size_t g = 0; g < sub.group_class.size(); ++g) {
      if (group_of_class[sub.group_class[g]] != -1) {
        return Invalid(
            "optimizer has two parameter groups of one weight-decay class (lr_mult "
            "groups?): their parameters cannot be told apart");
      }
      group_of_class[sub.group_class[g]] = static_cast<int>(g);
    }
    std::vector<size_t> filled(sub.groups.size(), 0);
    for (size_t i = 0; i < n; ++i) {
      const ModelEntry& e = d->entries[i];
      if (!e.tensor) continue;
      const std::string name = "model." + Join(e.path);
      ASSIGN_OR_RETURN(Rule r, ClassifyEntry(rules, name, d->expert[i], swiglu));
      if (r == Rule::kExtraState) continue;
      const bool expert_param = source_ep > 1 && d->expert[i].kind != ExpertKey::kDense &&
                                d->expert[i].kind != ExpertKey::kModuleState;
      if (expert_param && !d->optim_list) {
        return Invalid("expert parameter '" + name + "' at expert parallelism " +
                       std::to_string(source_ep) + " has no optimizer of its own");
      }
      if (d->optim_list && expert_param != sub.expert) continue;
      const int g = group_of_class[NoWeightDecay(e) ? 1 : 0];
      if (g < 0) return Invalid("no optimizer param group fits parameter '" + name + "'");
      ValuePtr params = Get(sub.groups[g], "params");
      if (!params || params->kind != Kind::kList || filled[g] >= params->items.size() ||
          params->items[filled[g]]->kind != Kind::kInt) {
        return Invalid("optimizer param group " + std::to_string(g) +
                       " does not match the model's parameters at '" + name + "'");
      }
      d->opt_sub[i] = static_cast<int64_t>(s);
      d->opt_group[i] = g;
      d->opt_pos[i] = static_cast<int64_t>(filled[g]);
      d->opt_index[i] = params->items[filled[g]]->i;
      ++filled[g];
    }
    for (size_t g = 0; g < sub.groups.size(); ++g) {
      ValuePtr params = Get(sub.groups[g], "params");
      if (filled[g] != params->items.size()) {
        return Invalid("optimizer param group " + std::to_string(g) + " holds " +
                       std::to_string(params->items.size()) + " parameters, the model has " +
                       std::to_string(filled[g]) + " of its class");
      }
    }
  }
  return Status::Ok();
}

// The source shard of one tensor in one file.
Result<Shard> ShardOf(const Decoded& d, const TorchTensor& t, const std::string& name) {
  if (!IsContiguous(t.shape, t.stride)) {
    return Invalid("tensor '" + name + "' is not contiguous: views reshard contiguous tensors only");
  }
  return Shard{d.rank->source, t.offset, t.shape};
}

}  // namespace

Status Planner::DecodeAll() {
  files_.resize(size_t{src_.tp} * src_.pp * src_.ep);
  std::vector<bool> seen(files_.size());
  for (const MegatronRankFile& r : src_.ranks) {
    if (r.tp >= src_.tp || r.pp >= src_.pp || r.ep >= src_.ep ||
        seen[FileIndex(r.tp, r.pp, r.ep)]) {
      return Invalid("rank files do not form a " + std::to_string(src_.tp) + "x" +
                     std::to_string(src_.pp) + "x" + std::to_string(src_.ep) + " grid");
    }
    seen[FileIndex(r.tp, r.pp, r.ep)] = true;
    Decoded& d = File(r.tp, r.pp, r.ep);
    d.rank = &r;
    d.root = r.file->root;
    for (const TorchTensor& t : r.file->pickle.tensors) d.tensors.emplace(t.node, &t);
    if (!IsMapping(d.root)) return Invalid("model_optim_rng.pt does not hold a dict");
    for (const auto& [k, v] : PairsOf(*d.root)) {
      const std::string key = KeyName(k);
      if (key.size() > 5 && key.starts_with("model") && std::isdigit(static_cast<unsigned char>(key[5]))) {
        return Invalid("virtual pipeline stages ('" + key + "') are not supported");
      }
    }
    d.model = Get(d.root, "model");
    if (!IsMapping(d.model)) return Invalid("rank file has no 'model' dict");
    std::vector<std::string> path;
    RETURN_IF_ERROR(Flatten(&d, d.model, &path, 0));
    for (const ModelEntry& e : d.entries) {
      ASSIGN_OR_RETURN(ExpertKey k, ParseExpertKey(e.path));
      if (k.kind != ExpertKey::kDense && model_.num_experts == 0) {
        return Invalid("'model." + Join(e.path) +
                       "' is an expert's, but args.num_experts is not set");
      }
      d.expert.push_back(std::move(k));
    }
    if (model_only_) continue;
    if (model_.distributed_optimizer) {
      const std::string rank = "rank (" + std::to_string(r.tp) + ", " + std::to_string(r.pp) +
                               (src_.ep > 1 ? ", " + std::to_string(r.ep) : "") + ")";
      const std::string where = rank + "'s distrib_optim.pt";
      if (!r.distrib) {
        // Saved with --no-save-optim: no optimizer entry, no distrib_optim.pt. The model alone.
        ValuePtr o = Get(d.root, "optimizer");
        if (!o || o->kind == Kind::kNone) continue;
        return Invalid("args.use_distributed_optimizer is set but " + rank +
                       " has no distrib_optim.pt" +
                       (r.ep > 0 ? " (a stage without experts at EP > 1, whose other EP ranks "
                                   "hold no optimizer state, is not resharded)"
                                 : ""));
      }
      ASSIGN_OR_RETURN(DistOptStates ds, ReadDistOpt(*r.distrib, r.distrib_source, where));
      // At EP > 1 the dense optimizer's state is in EP rank 0's files (DP rank 0 of the dense
      // group), the experts' in every EP rank's (expert-DP rank 0): [dense or None, experts]. A
      // stage without experts has the dense optimizer alone.
      bool chained = false;
      for (size_t x = 0; x < d.entries.size(); ++x) chained |= DistSub(d, x, src_.ep) == 1;
      if (ds.list != chained || ds.subs.size() != (chained ? 2u : 1u) || !ds.subs.back() ||
          (chained && ds.subs[0].has_value() != (r.ep == 0))) {
        return Invalid(where + (chained ? " is not [dense state or None, experts' state] as a "
                                          "ChainedOptimizer of a run at EP " +
                                              std::to_string(src_.ep) + " saves it"
                                        : " holds other than one optimizer's state"));
      }
      d.dist = std::move(ds);
    } else {
      RETURN_IF_ERROR(DecodeOptimizer(&d, rules_, model_.swiglu, src_.ep));
    }
  }
  for (bool s : seen) {
    if (!s) return Invalid("a rank file of the source grid is missing");
  }
  return Status::Ok();
}

Status Planner::BuildGlobals() {
  const int64_t per_stage = model_.num_layers / src_.pp;
  std::map<std::string, size_t> index;  // canonical name -> globals_
  for (uint32_t pp = 0; pp < src_.pp; ++pp) {
    for (uint32_t tp = 0; tp < src_.tp; ++tp) {
      ASSIGN_OR_RETURN(std::vector<Item> items, MergedEntries(tp, pp));
      for (const Item& item : items) {
        const Decoded& d = File(tp, pp, item.ep);
        const size_t i = item.entry;
        const ModelEntry& e = d.entries[i];
        if (!e.path.empty() && e.path[0] == "language_model") legacy_ = true;
        Global g;
        g.path = e.path;
        g.ep = item.ep;
        g.expert = d.expert[i];
        g.global_expert = item.global_expert;
        g.local = item.local;
        if (g.expert.kind == ExpertKey::kPerExpert) {  // the global expert number in the name
          g.path.back().replace(g.expert.pos, g.expert.len, std::to_string(item.global_expert));
        }
        g.layer = FindLayer(g.path);
        if (g.layer) {
          if (g.layer->number < 0 || g.layer->number >= per_stage) {
            return Invalid("'" + Join(e.path) + "' on pipeline stage " + std::to_string(pp) +
                           " is outside the stage's " + std::to_string(per_stage) + " layers");
          }
          g.path = WithLayer(g.path, *g.layer, g.layer->number + pp * per_stage);
          g.layer->number += pp * per_stage;
          g.layer->len = std::to_string(g.layer->number).size();  // the path now holds these digits
          g.place = Global::kLayer;
        }
        if (g.expert.kind == ExpertKey::kPerExpert) {
          ASSIGN_OR_RETURN(ExpertKey k, ParseExpertKey(g.path));
          g.expert_pos = k.pos;
          g.expert_len = k.len;
        }
        std::string canon = Join(g.path);
        const std::string key =
            g.expert.kind == ExpertKey::kModuleState ? canon + "#ep" + std::to_string(item.ep)
            : g.expert.kind == ExpertKey::kGrouped1 || g.expert.kind == ExpertKey::kGrouped2
                ? canon + "#" + std::to_string(item.global_expert)
                : canon;
        auto [it, fresh] = index.emplace(key, globals_.size());
        if (!fresh) {
          Global& have = globals_[it->second];
          if (have.stage != pp) {
            return Invalid("'model." + canon + "' appears on pipeline stages " +
                           std::to_string(have.stage) + " and " + std::to_string(pp));
          }
          if (have.entry.size() != tp) {
            return Invalid("'model." + canon + "' is missing on a tensor-parallel rank");
          }
          have.entry.push_back(i);
          continue;
        }
        if (tp != 0) return Invalid("'model." + canon + "' is missing on tensor-parallel rank 0");
        g.stage = pp;
        g.entry.push_back(i);
        if (e.tensor || IsMapping(e.leaf)) {
          ASSIGN_OR_RETURN(g.rule,
                           ClassifyEntry(rules_, "model." + canon, g.expert, model_.swiglu));
        } else {
          g.rule = Rule::kExtraState;  // None or an object: passed through
        }
        if (!g.layer) {
          const bool head = canon.find("word_embeddings_for_head") != std::string::npos ||
                            (model_.tied && canon.ends_with("output_layer.weight"));
          if (head) {
            g.place = Global::kHead;
          } else if (src_.pp > 1) {
            if (pp == 0) g.place = Global::kPre;
            else if (pp == src_.pp - 1) g.place = Global::kPost;
            else return Invalid("'model." + canon + "' on a middle pipeline stage is not a layer");
          } else {
            g.place = canon.find("embedding") != std::string::npos ? Global::kPre : Global::kPost;
          }
        }
        globals_.push_back(std::move(g));
      }
    }
  }
  for (const Global& g : globals_) {
    if (g.entry.size() != src_.tp) {
      return Invalid("'model." + Join(g.path) + "' is missing on a tensor-parallel rank");
    }
  }
  // A head copy for P > 1 with tied embeddings, made from the word embeddings when the source
  // (one stage) has none.
  bool have_head = false;
  const Global* emb = nullptr;
  for (const Global& g : globals_) {
    if (g.place == Global::kHead) have_head = true;
    if (g.place == Global::kPre && Join(g.path).ends_with("word_embeddings.weight")) emb = &g;
  }
  if (model_.tied && P_ > 1 && !have_head) {
    if (emb == nullptr) return Invalid("tied embeddings but no word_embeddings.weight found");
    Global h = *emb;
    h.place = Global::kHead;
    h.from_embedding = true;
    h.rule = Rule::kVocab;
    if (legacy_) {
      h.path = {"word_embeddings_for_head", "weight"};
      globals_.push_back(std::move(h));
    } else {
      h.path = {"output_layer.weight"};
      size_t at = globals_.size();
      for (size_t i = 0; i < globals_.size(); ++i) {
        if (Join(globals_[i].path) == "output_layer._extra_state") at = i;
      }
      globals_.insert(globals_.begin() + static_cast<std::ptrdiff_t>(at), std::move(h));
    }
  }
  return Status::Ok();
}

Result<ValuePtr> Planner::Rebuild(Out* out, const Decoded& d, const ValuePtr& m,
                                  const std::map<std::string, ValuePtr>& replace) {
  ValuePtr c = EmptyLike(m);
  for (const auto& [k, v] : PairsOf(*m)) {
    auto it = replace.find(KeyName(k));
    if (it != replace.end()) {
      Put(c, k, it->second);
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, Copy(out, d, v));
      Put(c, k, nv);
    }
  }
  return c;
}

Result<ValuePtr> Planner::ReshardTensor(
    Out* out, const Global& g, uint32_t t,
    const std::function<Result<const TorchTensor*>(const Decoded&, size_t)>& pick,
    const std::string& what) {
  std::vector<Shard> shards;
  const TorchTensor* first = nullptr;
  for (uint32_t k = 0; k < src_.tp; ++k) {
    const Decoded& d = FileOf(g, k);
    ASSIGN_OR_RETURN(const TorchTensor* tt, pick(d, g.entry[k]));
    if (!first) first = tt;
    if (tt->dtype != first->dtype) return Invalid("'" + what + "' has shards of different dtypes");
    ASSIGN_OR_RETURN(Shard s, ShardOf(d, *tt, what));
    shards.push_back(std::move(s));
  }
  const uint32_t itemsize = DtypeSize(first->dtype);
  if (itemsize == 0) return Invalid("'" + what + "' has an unknown dtype " + first->dtype);
  std::vector<Gather> gathers;
  std::vector<int64_t> shape;
  RETURN_IF_ERROR(PlanShard(what, g.rule, shards, itemsize, t, T_, vocab_, &gathers, &shape));
  uint64_t nbytes = itemsize;
  for (int64_t x : shape) nbytes *= static_cast<uint64_t>(x);
  return out->NewTensor(*first->node, std::move(gathers), shape, ContiguousStride(shape), nbytes);
}

bool Planner::SharedEmbedding(const std::string& name, bool head, uint32_t p, uint32_t P) const {
  // Megatron marks the tied copies shared_embedding only when they live on different stages.
  if (!model_.tied || P < 2) return false;
  return (p == 0 && name.ends_with("word_embeddings.weight")) ||
         (p == P - 1 && (head || name.ends_with("output_layer.weight")));
}

Status Planner::LayOutSourceDistOpt() {
  for (Decoded& d : files_) {
    d.dist_offset.assign(d.entries.size(), -1);
    d.dist_sub.assign(d.entries.size(), 0);
    for (size_t sub = 0; sub < d.dist->subs.size(); ++sub) {
      std::vector<DistOptParam> params;
      std::vector<size_t> which;
      for (size_t i = 0; i < d.entries.size(); ++i) {
        const ModelEntry& e = d.entries[i];
        if (!e.tensor) continue;
        const std::string name = Join(e.path);
        ASSIGN_OR_RETURN(Rule rule,
                         ClassifyEntry(rules_, "model." + name, d.expert[i], model_.swiglu));
        if (rule == Rule::kExtraState || DistSub(d, i, src_.ep) != static_cast<int>(sub)) continue;
        if (d.expert[i].kind == ExpertKey::kGrouped1 || d.expert[i].kind == ExpertKey::kGrouped2) {
          return Invalid("'model." + name + "': the distributed optimizer's state of the legacy "
                         "GroupedMLP's experts is not resharded");
        }
        int64_t numel = 1;
        for (int64_t x : e.tensor->shape) numel *= x;
        params.push_back({numel, sub == 0 && SharedEmbedding(name, false, d.rank->pp, src_.pp)});
        which.push_back(i);
      }
      ASSIGN_OR_RETURN(auto size, DistOptBucketSize(params, d.root ? Get(d.root, "args") : nullptr,
                                                    d.rank->pp));
      DistOptLayout layout = LayoutDistOpt(params, size);
      for (size_t k = 0; k < which.size(); ++k) d.dist_sub[which[k]] = static_cast<int>(sub);
      const std::optional<DistOptSource>& state = d.dist->subs[sub];
      if (!state) continue;  // another rank's to hold
      if (layout.numel_unpadded != state->numel_unpadded) {
        return Invalid("rank (" + std::to_string(d.rank->tp) + ", " + std::to_string(d.rank->pp) +
                       ")'s parameters lay out to " + std::to_string(layout.numel_unpadded) +
                       " elements in Megatron's buffer, but its distrib_optim.pt holds " +
                       std::to_string(state->numel_unpadded) +
                       ": the checkpoint was not written with the layout its args describe");
      }
      for (size_t k = 0; k < which.size(); ++k) d.dist_offset[which[k]] = layout.offset[k];
    }
  }
  const DistOptSource& first = *files_[0].dist->subs[0];
  for (const Decoded& d : files_) {
    for (const std::optional<DistOptSource>& s : d.dist->subs) {
      if (!s) continue;
      bool same = s->states.size() == first.states.size();
      for (size_t k = 0; same && k < s->states.size(); ++k) {
        same = s->states[k].first == first.states[k].first;
      }
      if (!same) return Invalid("the ranks' distrib_optim.pt hold different optimizer states");
    }
  }
  return Status::Ok();
}

Result<ViewFile> Planner::PlanDistOpt(uint32_t t, uint32_t p, uint32_t e, const Decoded& primary,
                                      const std::vector<const Global*>& params) {
  // At EP > 1: [the dense state on EP rank 0, else None; the experts' state]; a stage without
  // experts has the dense optimizer alone.
  bool chained = false;
  for (const Global* g : params) chained |= ExpertParallel(*g, E_);
  if (!chained && E_ > 1 && e > 0) {
    return Invalid("pipeline stage " + std::to_string(p) + " has no experts: its expert-parallel "
                   "ranks other than 0 hold no optimizer state of their own, and Megatron writes "
                   "no distrib_optim.pt there, which the views do not model");
  }
  std::vector<DistOptPlan> subs(chained ? 2 : 1);
  const Decoded& dense_like = File(primary.rank->tp, primary.rank->pp, 0);
  subs[0].like = !chained || e == 0 ? &*dense_like.dist->subs[0] : nullptr;
  if (chained) {
    // The experts' state of a source file with experts (the primary's stage may have none).
    for (const Decoded& d : files_) {
      if (d.dist->subs.size() == 2) subs[1].like = &*d.dist->subs[1];
    }
    if (!subs[1].like) return Invalid("no source rank holds an experts' optimizer state");
  }
  std::vector<std::vector<DistOptParam>> layout_params(subs.size());
  for (const Global* g : params) {
    const size_t sub = ExpertParallel(*g, E_) ? 1 : 0;
    DistOptPlan& plan = subs[sub];
    if (!plan.like) continue;
    const std::string name = Join(g->path);
    const size_t nstates = plan.like->states.size();
    plan.gathers.resize(nstates);
    std::vector<int64_t> shape;
    for (size_t s = 0; s < nstates; ++s) {
      std::vector<Shard> shards;
      for (uint32_t k = 0; k < src_.tp; ++k) {
        const Decoded& d = FileOf(*g, k);
        const size_t x = g->entry[k];
        const int64_t off = d.dist_offset[x];
        if (off < 0) return Invalid("'" + name + "' has no distributed optimizer state");
        const DistOptSource& from = *d.dist->subs[static_cast<size_t>(d.dist_sub[x])];
        if (from.states[s].first != plan.like->states[s].first) {
          return Invalid("the ranks' distrib_optim.pt hold different optimizer states");
        }
        shards.push_back(Shard{from.source,
                               from.states[s].second->offset + static_cast<uint64_t>(off) * 4,
                               d.entries[x].tensor->shape});
      }
      plan.gathers[s].emplace_back();
      RETURN_IF_ERROR(PlanShard(name + " " + plan.like->states[s].first, g->rule, shards, 4, t,
                                T_, vocab_, &plan.gathers[s].back(), &shape));
    }
    int64_t numel = 1;
    for (int64_t x : shape) numel *= x;
    plan.numels.push_back(numel);
    layout_params[sub].push_back(
        {numel, sub == 0 && SharedEmbedding(name, g->place == Global::kHead, p, P_)});
  }
  for (size_t sub = 0; sub < subs.size(); ++sub) {
    if (!subs[sub].like) continue;
    ASSIGN_OR_RETURN(auto size, DistOptBucketSize(layout_params[sub], Get(primary.root, "args"), p));
    subs[sub].layout = LayoutDistOpt(layout_params[sub], size);
  }
  return WriteDistOpt(primary.rank->distrib->prefix, subs, chained,
                      primary.rank->distrib_extra_records);
}

Status Planner::Prepare() {
  if (src_.ranks.empty()) return Invalid("no rank files");
  ASSIGN_OR_RETURN(model_, ReadMegatronModel(*src_.ranks[0].file));
  if (!model_only_) RETURN_IF_ERROR(CheckMegatronTarget(model_, T_, P_, asked_E_));
  if (model_.num_experts > 0 && src_.ep != model_.source_ep) {
    return Invalid("the rank files have " + std::to_string(src_.ep) +
                   " expert-parallel ranks, args.expert_model_parallel_size says " +
                   std::to_string(model_.source_ep));
  }
  if (model_.num_experts == 0 && src_.ep != 1)
    return Invalid("expert-parallel rank files without experts");
  if (model_.num_layers % src_.pp != 0) return Invalid("the source's PP does not divide num_layers");
  vocab_.source_rows = model_.padded_vocab_size;
  vocab_.target_rows = PaddedVocab(model_, T_);
  RETURN_IF_ERROR(DecodeAll());
  // The source's vocabulary rows come from its shards when args lack padded_vocab_size.
  for (const Decoded& d : files_) {
    for (const ModelEntry& e : d.entries) {
      if (e.tensor && !e.tensor->shape.empty() &&
          Join(e.path).ends_with("word_embeddings.weight") && vocab_.source_rows == 0) {
        vocab_.source_rows = e.tensor->shape[0] * src_.tp;
        if (model_.vocab_size == 0) {
          model_.padded_vocab_size = vocab_.source_rows;
          vocab_.target_rows = PaddedVocab(model_, T_);
        }
      }
    }
  }
  RETURN_IF_ERROR(BuildGlobals());
  if (model_.distributed_optimizer && !model_only_) {
    size_t with = 0;
    for (const Decoded& d : files_) with += d.dist.has_value();
    if (with != 0 && with != files_.size()) {
      return Invalid("some ranks have a distrib_optim.pt and some do not");
    }
    has_distrib_ = with != 0;
    if (has_distrib_ && model_.num_experts > 0 && (src_.ep > 1) != (E_ > 1)) {
      return Invalid("EP " + std::to_string(src_.ep) + " to EP " + std::to_string(E_) +
                     " with the distributed optimizer: the experts' optimizer state is of an "
                     "optimizer of its own at EP > 1 only, and is not moved between the two");
    }
    if (has_distrib_) RETURN_IF_ERROR(LayOutSourceDistOpt());
  }
  if (!model_only_ && legacy_ && model_.query_groups % T_ != 0) {
    return Invalid("TP " + std::to_string(T_) + " does not divide the query groups " +
                   std::to_string(model_.query_groups) + " of a legacy model (language_model.*)");
  }
  return Status::Ok();
}

Result<std::vector<ViewFile>> Planner::Run(std::vector<ViewFile>* distrib) {
  RETURN_IF_ERROR(Prepare());
  std::vector<ViewFile> out;
  if (distrib) distrib->clear();
  for (uint32_t p = 0; p < P_; ++p) {
    for (uint32_t e = 0; e < E_; ++e) {
      for (uint32_t t = 0; t < T_; ++t) {
        ViewFile d;
        ASSIGN_OR_RETURN(ViewFile f, PlanFile(t, p, e, distrib && has_distrib_ ? &d : nullptr));
        out.push_back(std::move(f));
        if (distrib && has_distrib_) distrib->push_back(std::move(d));
      }
    }
  }
  return out;
}

Result<MegatronTensors> Planner::Tensors() {
  model_only_ = true;
  RETURN_IF_ERROR(Prepare());
  MegatronTensors out;
  out.model = model_;
  out.legacy = legacy_;
  out.source_vocab_rows = vocab_.source_rows;
  for (const Global& g : globals_) {
    if (g.from_embedding) continue;
    if (g.expert.kind == ExpertKey::kGrouped1 || g.expert.kind == ExpertKey::kGrouped2) {
      return Invalid("'model." + Join(g.path) +
                     "': the legacy GroupedMLP stores every expert's weights transposed in one "
                     "tensor, which this view does not transpose");
    }
    MegatronTensor mt;
    mt.name = Join(g.path);
    mt.layer = g.layer ? g.layer->number : -1;
    mt.rule = g.rule;
    mt.expert = g.expert.kind == ExpertKey::kPerExpert ? g.global_expert : -1;
    for (uint32_t k = 0; k < src_.tp; ++k) {
      const Decoded& d = FileOf(g, k);
      const ModelEntry& e = d.entries[g.entry[k]];
      if (!e.tensor) break;  // extra state, None: not a tensor
      if (k == 0) mt.dtype = e.tensor->dtype;
      if (e.tensor->dtype != mt.dtype) {
        return Invalid("'" + mt.name + "' has shards of different dtypes");
      }
      ASSIGN_OR_RETURN(Shard sh, ShardOf(d, *e.tensor, mt.name));
      mt.shards.push_back(std::move(sh));
    }
    if (mt.shards.size() == src_.tp) out.tensors.push_back(std::move(mt));
  }
  return out;
}

}  // namespace megatron_planner

Result<MegatronTensors> ListMegatronTensors(const MegatronSource& src, const Rules& rules) {
  return megatron_planner::Planner(src, 1, 1, 0, rules).Tensors();
}

Result<std::vector<ViewFile>> PlanMegatron(const MegatronSource& src, uint32_t T, uint32_t P,
                                           const Rules& rules, std::vector<ViewFile>* distrib,
                                           uint32_t E) {
  return megatron_planner::Planner(src, T, P, E, rules).Run(distrib);
}

}  // namespace ckptfs::reshard
