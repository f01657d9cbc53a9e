// Native DeepSpeed MoE (deepspeed.moe.layer.MoE) checkpoints at ZeRO stage 1/2: decoding and the
// dpD view (docs/views.md, "DeepSpeed MoE").
#include <algorithm>
#include <cstdio>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {
namespace {

using pickle::Kind;
using pickle::ValuePtr;

// "ep_size_N" (the name split_params_into_different_moe_groups_for_optimizer gives moe groups).
std::optional<uint32_t> EpOfName(const ValuePtr& v) {
  if (!v || v->kind != Kind::kStr) return std::nullopt;
  unsigned ep = 0;
  char tail = 0;
  if (std::sscanf(v->str.c_str(), "ep_size_%u%c", &ep, &tail) != 1 || ep == 0 ||
      v->str != "ep_size_" + std::to_string(ep)) {
    return std::nullopt;
  }
  return ep;
}

// The partition windows param_slice_mappings describe: [Lo(r), Lo(r) + size) of a flat buffer of
// `total` real elements cut as `part`.
struct Windows {
  uint64_t size = 0;
  uint64_t Lo(uint64_t r) const { return r * size; }
};
Windows WindowsOf(const Partitioning& part, bool full_dp, uint64_t dp) {
  return Windows{full_dp ? part.size * part.dp / dp : part.size};
}

// The parameters the mappings of partitions 0..n-1 (windows w) name, in flat order, merged across
// partitions; false when the fragments do not tile each window's real elements.
bool ParamsOfMappings(const std::vector<ValuePtr>& mappings, const Windows& w, uint64_t total,
                      std::vector<Param>* params) {
  params->clear();
  for (size_t r = 0; r < mappings.size(); ++r) {
    const uint64_t lo = std::min(total, w.Lo(r)), hi = std::min(total, w.Lo(r) + w.size);
    uint64_t at = lo;
    for (const auto& [k, v] : PairsOf(*mappings[r])) {
      const auto numel = IntField(v, "numel"), start = IntField(v, "start");
      if (!numel || !start || *numel <= 0 || *start < 0 || lo + *start != at) return false;
      const std::string name = KeyName(k);
      if (!params->empty() && params->back().name == name &&
          params->back().offset + params->back().numel == at) {
        params->back().numel += *numel;
      } else {
        if (at != (params->empty() ? 0 : params->back().offset + params->back().numel)) {
          return false;
        }
        params->push_back(Param{name, {}, static_cast<uint64_t>(*numel), at});
      }
      at += *numel;
    }
    if (at != hi) return false;
  }
  return true;
}

}  // namespace

std::pair<uint32_t, uint32_t> Moe::Split(uint32_t r, uint32_t dp) const {
  const uint32_t edp = dp / ep;
  return data_before_expert ? std::pair{r / edp, r % edp} : std::pair{r % ep, r / ep};
}

uint32_t Moe::Join(uint32_t e, uint32_t q, uint32_t dp) const {
  return data_before_expert ? e * (dp / ep) + q : q * ep + e;
}

Status Checkpoint::DecodeMoe(
    const std::map<uint32_t, const DsSourceFile*>& models,
    const std::map<std::pair<uint32_t, uint32_t>, const DsSourceFile*>& optims) {
  const std::string tag = src.tag;
  if (models.size() != 1 || !models.count(0)) {
    return Invalid("DeepSpeed MoE checkpoints with tensor parallelism (" +
                   std::to_string(models.size()) + " model-states files) have no views yet");
  }
  moe = std::make_unique<Moe>();
  tp.resize(1);
  TpRank& tr = tp[0];
  tr.model = models.at(0);
  tr.model_tensors = IndexTensors(*tr.model->file);
  const ValuePtr& root = tr.model->file->root;
  const std::string where = tag + "/" + tr.model->name;
  if (!IsMapping(root)) return Invalid(where + " is not a DeepSpeed model-states dict");
  ValuePtr dpws = Get(root, "dp_world_size");
  if (!dpws || dpws->kind != Kind::kInt || dpws->i < 1 || dpws->i > 4096) {
    return Invalid(where + " has no dp_world_size");
  }
  D = static_cast<uint32_t>(dpws->i);
  tr.optim.resize(D);
  for (uint32_t d = 0; d < D; ++d) {
    auto it = optims.find({0, d});
    if (it == optims.end()) {
      return Invalid("optimizer file " + OptimFileName(optim_prefix, d, 0) + " of " + tag +
                     " is missing (dp_world_size " + std::to_string(D) + ")");
    }
    tr.optim[d].file = it->second;
  }
  for (const auto& [key, f] : optims) {
    if (key.first != 0 || key.second >= D) {
      return Invalid(f->name + " lies outside dp_world_size " + std::to_string(D) +
                     " x mp_world_size 1");
    }
  }
  // The groups, from dp rank 0's param_groups: dense ones, and moe ones named ep_size_EP.
  const Optim& first = tr.optim[0];
  ValuePtr groups = Get(Get(Get(first.file->file->root, "optimizer_state_dict"),
                            "base_optimizer_state"), "param_groups");
  if (!groups || groups->kind != Kind::kList) {
    return Invalid(tag + "/" + first.file->name + " has no base_optimizer_state.param_groups");
  }
  const size_t G = groups->items.size();
  moe->groups.resize(G);
  std::optional<uint32_t> ep;
  for (size_t g = 0; g < G; ++g) {
    ValuePtr m = Get(groups->items[g], "moe");
    moe->groups[g].moe = m && m->kind == Kind::kBool && m->b;
    if (!moe->groups[g].moe) continue;
    const auto e = EpOfName(Get(groups->items[g], "name"));
    if (!e) return Invalid("moe param group " + std::to_string(g) + " is not named ep_size_N");
    if (ep && *e != *ep) {
      return Invalid("moe param groups of several expert-parallel sizes (ep_size_" +
                     std::to_string(*ep) + ", ep_size_" + std::to_string(*e) + ") have no views yet");
    }
    ep = e;
  }
  if (!ep) {
    return Invalid(tag + " is a DeepSpeed MoE checkpoint (num_experts, or expert files) whose "
                   "optimizer has no param group marked moe");
  }
  moe->ep = *ep;
  if (D % moe->ep != 0) {
    return Invalid("dp_world_size " + std::to_string(D) + " is not a multiple of ep_size " +
                   std::to_string(moe->ep));
  }
  for (uint32_t d = 0; d < D; ++d) {
    RETURN_IF_ERROR(ParseOptim(&tr.optim[d], G));
  }
  if (bf16_optimizer.value_or(false)) {
    return Invalid("DeepSpeed MoE checkpoints written by BF16_Optimizer (no zero_stage in " +
                   tr.optim[0].file->name + ") have no views yet");
  }
  ValuePtr topo = Get(Get(first.file->file->root, "ds_config"), "use_data_before_expert_parallelism");
  moe->data_before_expert = topo && topo->kind == Kind::kBool && topo->b;

  // Each group's domains: their totals from the fp32 partitions (stripped of their padding),
  // their sizes checked, the windows their mappings describe.
  const uint32_t edp = D / moe->ep;
  struct Domain {
    size_t g;
    uint32_t e;
    Partitioning part;
    std::vector<ValuePtr> maps;
    std::string by;
  };
  std::vector<Domain> domains;
  for (size_t g = 0; g < G; ++g) {
    const bool is_moe = moe->groups[g].moe;
    const uint32_t n = is_moe ? edp : D;
    for (uint32_t e = 0; e < (is_moe ? moe->ep : 1); ++e) {
      auto optim_of = [&](uint32_t q) -> const Optim& {
        return tr.optim[is_moe ? moe->Join(e, q, D) : q];
      };
      uint64_t total = 0;
      for (uint32_t q = 0; q < n; ++q) total += static_cast<uint64_t>(optim_of(q).fp32[g]->shape[0]);
      Domain dom{g, e, Partitioning(total, n), {}, ""};
      dom.by = is_moe ? "the expert-data-parallel size " + std::to_string(n) + " of EP rank " +
                            std::to_string(e)
                      : "dp_world_size " + std::to_string(D);
      for (uint32_t q = 0; q < n; ++q) {
        RETURN_IF_ERROR(CheckOptimGroup(optim_of(q), g, dom.part, q, dom.by));
        dom.maps.push_back(optim_of(q).mappings[g]);
      }
      domains.push_back(std::move(dom));
    }
  }
  // The moe groups' mappings are cut by their own partitions (DeepSpeed 0.14.5 on) or by the
  // full dp size (0.14.4): the sizing every moe group's mappings follow (the former when both
  // do, as with EP 1).
  bool own = true, full = moe->ep > 1;
  std::vector<Param> scratch;
  for (const Domain& dom : domains) {
    if (!moe->groups[dom.g].moe) continue;
    own = own && ParamsOfMappings(dom.maps, WindowsOf(dom.part, false, D), dom.part.total, &scratch);
    full = full && ParamsOfMappings(dom.maps, WindowsOf(dom.part, true, D), dom.part.total, &scratch);
  }
  moe->full_dp_mappings = !own && full;
  for (const Domain& dom : domains) {
    Moe::Group& mg = moe->groups[dom.g];
    const Windows w = WindowsOf(dom.part, mg.moe && moe->full_dp_mappings, D);
    std::vector<Param> params;
    if (!ParamsOfMappings(dom.maps, w, dom.part.total, &params)) {
      return Invalid(tag + "/" + tr.optim[mg.moe ? moe->Join(dom.e, 0, D) : 0].file->name +
                     ": param_slice_mappings of group " + std::to_string(dom.g) +
                     " do not follow its partitioning (" + dom.by + "; round_robin_gradients?)");
    }
    mg.totals.push_back(dom.part.total);
    mg.params.push_back(std::move(params));
    mg.known.push_back(std::min(dom.part.total, w.Lo(dom.part.dp)));
  }
  return Status::Ok();
}

Status PlanDpMoe(const Checkpoint& c, uint32_t D, std::vector<ViewEntry>* out) {
  const Moe& m = *c.moe;
  if (D % m.ep != 0) {
    return Invalid("dp" + std::to_string(D) + " of a DeepSpeed MoE checkpoint at ep_size " +
                   std::to_string(m.ep) + ": DeepSpeed needs the data-parallel size to be a "
                   "multiple of the expert-parallel size");
  }
  // The expert files (one expert each, named by its global id) and the expp_rank optimizer files
  // ({'optimizer': None} under ZeRO) do not depend on the data-parallel size: as they are.
  PlanLatestAndCopies(c, c.src.moe_files, out);
  const TpRank& tr = c.tp[0];
  ASSIGN_OR_RETURN(ViewEntry ms, PlanModelStates(c, tr, 0, D));
  out->push_back(std::move(ms));

  const uint32_t S = c.D, edp_s = S / m.ep, edp = D / m.ep;
  Target target;
  target.primary = &tr;
  target.groups.resize(m.groups.size());
  target.cut = [&](size_t g, uint32_t d) -> Result<GroupCut> {
    const Moe::Group& mg = m.groups[g];
    // Plain variables, not a structured binding: the lambda below captures e (clang 14 cannot
    // capture bindings).
    const std::pair<uint32_t, uint32_t> split =
        mg.moe ? m.Split(d, D) : std::pair<uint32_t, uint32_t>{0, d};
    const uint32_t e = split.first, q = split.second;
    const uint32_t n = mg.moe ? edp : D, n_s = mg.moe ? edp_s : S;
    GroupCut cut;
    cut.part = Partitioning(mg.totals[e], n);
    cut.r = q;
    cut.count = n;
    const Windows w = WindowsOf(cut.part, mg.moe && m.full_dp_mappings, D);
    const uint64_t hi = std::min(mg.totals[e], w.Lo(q) + w.size);
    if (hi > mg.known[e]) {
      return Invalid("dp" + std::to_string(D) + ": the source's param_slice_mappings of moe group " +
                     std::to_string(g) + " (cut by the full data-parallel size, as DeepSpeed "
                     "0.14.4 writes them) name its parameters up to element " +
                     std::to_string(mg.known[e]) + ", and the view's would need them up to " +
                     std::to_string(hi));
    }
    cut.fragments = FragmentsIn(mg.params[e], w.Lo(q), w.Lo(q) + w.size);
    const Partitioning src_part(mg.totals[e], n_s);
    cut.range = [&tr, &m, mg_moe = mg.moe, e, g, src_part, S](
                    const std::string& key, uint64_t from,
                    uint64_t to) -> Result<std::vector<Gather>> {
      auto pick = [&](const Optim& o) {
        return key == "fp32" ? o.fp32[g] : Checkpoint::StateTensor(o, g, key);
      };
      auto optim_of = [&](uint64_t q) -> const Optim& {
        return tr.optim[mg_moe ? m.Join(e, static_cast<uint32_t>(q), S) : q];
      };
      ASSIGN_OR_RETURN(std::vector<Part> parts,
                       FlatOf(src_part, optim_of, from, to, pick,
                              "'" + key + "' of group " + std::to_string(g)));
      std::vector<Gather> gathers;
      if (!parts.empty()) gathers.push_back(Gather{1, std::move(parts)});
      return gathers;
    };
    return cut;
  };
  for (uint32_t d = 0; d < D; ++d) {
    ASSIGN_OR_RETURN(ViewEntry e, PlanOptimFile(c, target, 0, d, D));
    out->push_back(std::move(e));
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard::ds
