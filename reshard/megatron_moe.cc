// The Megatron view planner's mixture-of-experts parts: megatron.core's expert entries, the
// source's expert-parallel files merged into one model, and the legacy GroupedMLP's tensors, which
// hold every local expert at once.
//
// Facts (Megatron-LM, megatron/core/transformer/moe/): local expert k of EP rank r is global
// expert r * E/EP + k (moe_layer.py, experts.py sharded_state_dict); SequentialMLP names them
// local_experts.{k}.*, TEGroupedMLP linear_fcN.weight{k} with one _extra_state per module, the
// legacy GroupedMLP weight1 [H, Le * fc1 cols] whose memory is Le blocks [H, fc1 cols] (one
// expert's fc1 transposed) and weight2 [Le * fc2 rows, H], Le blocks [fc2 rows, H].
#include <algorithm>
#include <cctype>
#include <map>
#include <tuple>

#include "reshard/megatron_planner.h"

namespace ckptfs::reshard::megatron_planner {

namespace {

constexpr std::string_view kExperts = "mlp.experts.";

size_t TrailingDigits(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[s.size() - 1 - n]))) ++n;
  return n;
}

int64_t LayerOf(const ModelEntry& e) {
  auto l = FindLayer(e.path);
  return l ? l->number : -1;
}

bool Grouped(ExpertKey::Kind k) { return k == ExpertKey::kGrouped1 || k == ExpertKey::kGrouped2; }

}  // namespace

Result<ExpertKey> ParseExpertKey(const std::vector<std::string>& path) {
  ExpertKey k;
  if (path.empty()) return k;
  size_t at = std::string::npos;
  for (size_t c = 0; c < path.size(); ++c) {
    for (size_t x = path[c].find(kExperts); x != std::string::npos;
         x = path[c].find(kExperts, x + 1)) {
      if (x == 0 || path[c][x - 1] == '.') {
        if (c + 1 != path.size()) {
          return Invalid("expert entry '" + Join(path) +
                         "' is nested: expected megatron.core's "
                         "flat state-dict keys");
        }
        at = x;
        break;
      }
    }
  }
  if (at == std::string::npos) return k;
  const std::string& s = path.back();
  const size_t rest = at + kExperts.size();
  const std::string_view r = std::string_view(s).substr(rest);
  auto unknown = [&] {
    return Invalid("'" + s +
                   "' is an expert entry of no known form (SequentialMLP, "
                   "TEGroupedMLP or GroupedMLP)");
  };
  if (r.starts_with("local_experts.")) {  // SequentialMLP
    const size_t d = rest + std::string_view("local_experts.").size();
    size_t e = d;
    while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
    if (e == d || e >= s.size() || s[e] != '.') return unknown();
    k.kind = ExpertKey::kPerExpert;
    k.sequential = true;
    k.pos = d;
    k.len = e - d;
  } else if (r == "weight1") {
    k.kind = ExpertKey::kGrouped1;
  } else if (r == "weight2") {
    k.kind = ExpertKey::kGrouped2;
  } else {  // TEGroupedMLP: linear_fcN.weight{k}, linear_fcN.bias{k}, linear_fcN._extra_state
    const size_t dot = r.rfind('.');
    if (dot == std::string_view::npos) return unknown();
    const std::string_view last = r.substr(dot + 1);
    if (last == "_extra_state") {
      k.kind = ExpertKey::kModuleState;
    } else {
      const size_t n = TrailingDigits(last);
      const std::string_view base = last.substr(0, last.size() - n);
      if (n == 0 || (base != "weight" && base != "bias")) return unknown();
      k.kind = ExpertKey::kPerExpert;
      k.pos = s.size() - n;
      k.len = n;
    }
  }
  k.tmpl = s;
  if (k.kind == ExpertKey::kPerExpert) {
    k.local = std::stoll(s.substr(k.pos, k.len));
    k.tmpl.replace(k.pos, k.len, "*");
  }
  return k;
}

Result<Rule> ClassifyEntry(const Rules& rules, const std::string& name, const ExpertKey& key,
                           bool swiglu) {
  switch (key.kind) {
    case ExpertKey::kModuleState:
      return Rule::kExtraState;
    case ExpertKey::kGrouped1:
      return swiglu ? Rule::kSwiglu : Rule::kColumn;
    case ExpertKey::kGrouped2:
      return Rule::kRow;
    case ExpertKey::kPerExpert:
      if (!key.sequential) {  // linear_fc1.weight7: the rule of linear_fc1.weight
        return rules.Classify(name.substr(0, name.size() - TrailingDigits(name)), swiglu);
      }
      break;
    case ExpertKey::kDense:
      break;
  }
  return rules.Classify(name, swiglu);
}

Result<std::vector<Planner::Item>> Planner::MergedEntries(uint32_t tp, uint32_t pp) {
  const Decoded& d0 = File(tp, pp, 0);
  std::vector<Item> out;
  if (model_.num_experts == 0) {
    for (size_t i = 0; i < d0.entries.size(); ++i) out.push_back({0, i, -1, -1});
    return out;
  }
  const int64_t le = model_.num_experts / src_.ep;  // local experts per source EP rank
  // Per EP rank: each layer's expert entries.
  std::vector<std::map<int64_t, std::vector<size_t>>> by_layer(src_.ep);
  for (uint32_t e = 0; e < src_.ep; ++e) {
    const Decoded& d = File(tp, pp, e);
    for (size_t x = 0; x < d.entries.size(); ++x) {
      if (d.expert[x].kind != ExpertKey::kDense) by_layer[e][LayerOf(d.entries[x])].push_back(x);
    }
  }
  for (size_t i = 0; i < d0.entries.size();) {
    if (d0.expert[i].kind == ExpertKey::kDense) {
      out.push_back({0, i, -1, -1});
      ++i;
      continue;
    }
    // A layer's experts: their entries on every EP rank, in global expert order. The order of a
    // module's entries is EP rank 0's, with the expert number in place of the local one.
    const int64_t layer = LayerOf(d0.entries[i]);
    size_t j = i;
    while (j < d0.entries.size() && d0.expert[j].kind != ExpertKey::kDense &&
           LayerOf(d0.entries[j]) == layer) {
      ++j;
    }
    std::map<std::string, int64_t> tpos;
    for (size_t x = i; x < j; ++x) tpos.emplace(d0.expert[x].tmpl, static_cast<int64_t>(x - i));
    std::vector<std::pair<std::tuple<int64_t, int64_t>, Item>> block;
    for (uint32_t e = 0; e < src_.ep; ++e) {
      const Decoded& d = File(tp, pp, e);
      for (size_t x : by_layer[e][layer]) {
        const ExpertKey& k = d.expert[x];
        auto it = tpos.find(k.tmpl);
        if (it == tpos.end()) {
          return Invalid("expert entry '" + Join(d.entries[x].path) + "' of expert-parallel rank " +
                         std::to_string(e) + " has no counterpart on rank 0");
        }
        const int64_t pos = it->second;
        if (k.kind == ExpertKey::kPerExpert) {
          if (k.local >= le) {
            return Invalid("'" + Join(d.entries[x].path) + "': local expert " +
                           std::to_string(k.local) + " of " + std::to_string(le));
          }
          const int64_t g = e * le + k.local;
          block.push_back({k.sequential ? std::make_tuple(g, pos) : std::make_tuple(pos, g),
                           Item{e, x, g, -1}});
        } else if (k.kind == ExpertKey::kModuleState) {
          block.push_back({{pos, model_.num_experts + e}, Item{e, x, -1, -1}});
        } else {  // grouped: one item per expert it holds
          for (int64_t kk = 0; kk < le; ++kk) {
            block.push_back({{pos, e * le + kk}, Item{e, x, e * le + kk, kk}});
          }
        }
      }
    }
    std::stable_sort(block.begin(), block.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [key, item] : block) out.push_back(item);
    i = j;
  }
  // Every EP rank's dense entries are copies of rank 0's (the dense TP shard): they must agree.
  for (uint32_t e = 1; e < src_.ep; ++e) {
    const Decoded& d = File(tp, pp, e);
    size_t dense = 0;
    for (size_t x = 0; x < d.entries.size(); ++x) {
      if (d.expert[x].kind != ExpertKey::kDense) continue;
      while (dense < d0.entries.size() && d0.expert[dense].kind != ExpertKey::kDense) ++dense;
      if (dense >= d0.entries.size() || d0.entries[dense].path != d.entries[x].path) {
        return Invalid("expert-parallel rank " + std::to_string(e) + "'s dense entry '" +
                       Join(d.entries[x].path) + "' differs from rank 0's");
      }
      ++dense;
    }
  }
  return out;
}

bool Planner::InTargetEp(const Global& g, uint32_t e) const {
  if (g.expert.kind == ExpertKey::kDense) return true;
  const int64_t le = model_.num_experts / E_, le_s = model_.num_experts / src_.ep;
  if (g.expert.kind == ExpertKey::kModuleState) {
    // A grouped module's own state comes from the source rank of the target's first expert.
    return (int64_t{e} * le) / le_s == g.ep;
  }
  return g.global_expert / le == e;
}

Result<ValuePtr> Planner::ReshardParam(
    Out* out, const Global& g, uint32_t t,
    const std::function<Result<const TorchTensor*>(const Decoded&, size_t)>& pick,
    const std::string& what) {
  if (!Grouped(g.expert.kind)) return ReshardTensor(out, g, t, pick, what);
  const int64_t le = model_.num_experts / E_, le_s = model_.num_experts / src_.ep;
  const bool fc1 = g.expert.kind == ExpertKey::kGrouped1;
  const size_t base = static_cast<size_t>(&g - globals_.data());
  const TorchTensor* first = nullptr;
  std::vector<Gather> gathers;
  int64_t hidden = 0, width = 0;  // the target's [H, width] (weight1) or [width, H] (weight2)
  for (int64_t j = 0; j < le; ++j) {
    if (base + static_cast<size_t>(j) >= globals_.size()) {
      return Invalid("'" + what + "': the grouped experts are not in order");
    }
    const Global& gj = globals_[base + static_cast<size_t>(j)];
    if (gj.expert.kind != g.expert.kind || gj.global_expert != g.global_expert + j ||
        gj.path != g.path) {
      return Invalid("'" + what + "': the grouped experts are not in order");
    }
    std::vector<Shard> shards;
    for (uint32_t k = 0; k < src_.tp; ++k) {
      const Decoded& d = FileOf(gj, k);
      ASSIGN_OR_RETURN(const TorchTensor* tt, pick(d, gj.entry[k]));
      if (!first) first = tt;
      if (tt->dtype != first->dtype || tt->shape.size() != 2 ||
          !IsContiguous(tt->shape, tt->stride)) {
        return Invalid("'" + what + "' is not a contiguous 2-d tensor of one dtype on every rank");
      }
      const int64_t cut = fc1 ? tt->shape[1] : tt->shape[0];  // the experts' axis
      if (cut % le_s != 0) {
        return Invalid("'" + what + "': " + std::to_string(cut) + " is not divisible by the " +
                       std::to_string(le_s) + " local experts");
      }
      std::vector<int64_t> shape = tt->shape;
      (fc1 ? shape[1] : shape[0]) = cut / le_s;
      const uint64_t block = static_cast<uint64_t>(shape[0] * shape[1]) * DtypeSize(tt->dtype);
      shards.push_back(
          Shard{d.rank->source, tt->offset + static_cast<uint64_t>(gj.local) * block, shape});
    }
    std::vector<Gather> part;
    std::vector<int64_t> shape;
    RETURN_IF_ERROR(PlanSplit(what + " expert " + std::to_string(gj.global_expert), fc1 ? 1 : 0,
                              fc1 && model_.swiglu, shards, DtypeSize(first->dtype), t, T_, &part,
                              &shape));
    for (Gather& x : part) gathers.push_back(std::move(x));
    hidden = fc1 ? shape[0] : shape[1];
    width += fc1 ? shape[1] : shape[0];
  }
  const std::vector<int64_t> shape =
      fc1 ? std::vector<int64_t>{hidden, width} : std::vector<int64_t>{width, hidden};
  const uint64_t nbytes = static_cast<uint64_t>(hidden * width) * DtypeSize(first->dtype);
  return out->NewTensor(*first->node, std::move(gathers), shape, ContiguousStride(shape), nbytes);
}

}  // namespace ckptfs::reshard::megatron_planner
