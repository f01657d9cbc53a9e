// Megatron-LM and DeepSpeed checkpoint directories. Each name pattern cites the function of the
// framework's save code that produces it; "{W}" is a number padded to W digits (see MatchName).
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "formats/layout_internal.h"

namespace ckptfs::layout::internal {
namespace {

// Python's str.strip() for ASCII whitespace, which is what tracker files hold.
std::string_view Strip(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// int() of a stripped string for what trackers hold: an optional sign and decimal digits.
std::optional<int64_t> ParseInt(std::string_view s) {
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return neg ? -v : v;
}

std::optional<std::string> StrippedContent(const Entry* e) {
  if (!e || !e->content) return std::nullopt;
  return std::string(Strip(*e->content));
}

// ---- Megatron-LM ----------------------------------------------------------------------------
//
// megatron/training/checkpointing.py:
//   get_checkpoint_tracker_filename(): "latest_checkpointed_iteration.txt" in the save directory;
//     read_metadata() strips it and takes int() of it, or "release" (iteration must be > -1).
//   get_checkpoint_name(): directory "release" or "iter_{:07d}"; then "mp_rank_{tp:02d}" without
//     pipeline parallelism or "mp_rank_{tp:02d}_{pp:03d}" with it, plus "_{ep:03d}" with expert
//     parallelism; the file is "model_optim_rng.pt".
//   get_distributed_optimizer_checkpoint_name(): "distrib_optim.pt" beside it.
// megatron/core/dist_checkpointing/core.py: CONFIG_FNAME "metadata.json" marks an iteration saved
//   in the distributed (sharded) format, which holds no rank directories.

constexpr std::string_view kMegatronTracker = "latest_checkpointed_iteration.txt";

std::string RankDirName(RankNaming naming, uint64_t t, uint64_t p, uint64_t e) {
  std::string s = "mp_rank_" + Pad(t, 2);
  if (naming == RankNaming::kTpX || naming == RankNaming::kTpPpEp) s += "_" + Pad(p, 3);
  if (naming == RankNaming::kTpPpEp) s += "_" + Pad(e, 3);
  return s;
}

void ScanIteration(const Tree& tree, MegatronIteration* it, Layout* out) {
  const Tree::Dir* dir = tree.FindDir(it->dir);
  std::set<RankNaming> namings;
  std::set<std::tuple<uint64_t, uint64_t, uint64_t>> cells;  // rank dirs holding the model file
  uint64_t tp = 0, x = 0, ep = 0;
  for (const std::string& sub : dir->subdirs) {
    uint64_t r[3] = {0, 0, 0};
    RankNaming naming;
    if (MatchName(sub, "mp_rank_{2}", r, 3)) {
      naming = RankNaming::kTp;
    } else if (MatchName(sub, "mp_rank_{2}_{3}", r, 3)) {
      naming = RankNaming::kTpX;
    } else if (MatchName(sub, "mp_rank_{2}_{3}_{3}", r, 3)) {
      naming = RankNaming::kTpPpEp;
    } else {
      continue;
    }
    if (r[0] >= kMaxRank || r[1] >= kMaxRank || r[2] >= kMaxRank) continue;
    namings.insert(naming);
    tp = std::max(tp, r[0] + 1);
    x = std::max(x, r[1] + 1);
    ep = std::max(ep, r[2] + 1);
    const std::string path = Join(it->dir, sub);
    if (tree.FindFile(Join(path, "model_optim_rng.pt"))) {
      cells.emplace(r[0], r[1], r[2]);
    } else {
      AddProblem(out, path, "no model_optim_rng.pt");
    }
    if (tree.FindFile(Join(path, "distrib_optim.pt"))) it->distrib_optim = true;
  }
  it->dist_checkpoint = tree.FindFile(Join(it->dir, "metadata.json")) != nullptr;
  if (namings.empty()) {
    it->complete = it->dist_checkpoint;
    return;
  }
  if (namings.size() > 1) {
    it->naming = RankNaming::kMixed;
    AddProblem(out, it->dir, "rank directories named in more than one scheme");
    return;
  }
  it->naming = *namings.begin();
  it->tp = static_cast<uint32_t>(tp);
  it->pp = static_cast<uint32_t>(x);  // 1 when the names have no second number
  it->ep = static_cast<uint32_t>(ep);
  const uint64_t grid = tp * x * ep;  // each factor < 2^20
  it->complete = cells.size() == grid;
  if (it->complete) return;
  // Name the missing cells (a few; a grid of thousands would flood the log).
  size_t named = 0;
  for (uint64_t t = 0; t < tp && named < 8; ++t) {
    for (uint64_t p = 0; p < x && named < 8; ++p) {
      for (uint64_t e = 0; e < ep && named < 8; ++e) {
        if (cells.count({t, p, e})) continue;
        const std::string path = Join(it->dir, RankDirName(it->naming, t, p, e));
        if (!tree.FindDir(path)) {
          AddProblem(out, path, "missing from the rank grid");
          ++named;
        }
      }
    }
  }
  AddProblem(out, it->dir,
             std::to_string(grid - cells.size()) + " of " + std::to_string(grid) +
                 " ranks without model_optim_rng.pt");
}

}  // namespace

void ScanMegatron(const Tree& tree, bool deepspeed_owns_tracker, Layout* out) {
  MegatronLayout m;
  const Entry* tracker = deepspeed_owns_tracker ? nullptr : tree.FindFile(kMegatronTracker);
  m.has_tracker = tracker != nullptr;
  m.tracker = StrippedContent(tracker);
  for (const std::string& d : tree.FindDir("")->subdirs) {
    MegatronIteration it;
    uint64_t n[1];
    if (d == "release") {
      it.release = true;
    } else if (MatchName(d, "iter_{7}", n, 1)) {
      it.iteration = static_cast<int64_t>(n[0]);
    } else {
      continue;
    }
    it.dir = d;
    ScanIteration(tree, &it, out);
    if (it.naming == RankNaming::kNone && !it.dist_checkpoint) continue;  // not a checkpoint
    m.iterations.push_back(std::move(it));
  }
  if (!m.has_tracker && m.iterations.empty()) return;
  std::stable_sort(m.iterations.begin(), m.iterations.end(),
                   [](const MegatronIteration& a, const MegatronIteration& b) {
                     return a.release != b.release ? a.release : a.iteration < b.iteration;
                   });
  if (m.tracker) {
    const std::string path(kMegatronTracker);
    if (*m.tracker == "release") {
      m.tracker_release = true;
      if (!tree.FindDir("release")) AddProblem(out, path, "names release, which is missing");
    } else if (std::optional<int64_t> i = ParseInt(*m.tracker)) {
      m.tracker_iteration = *i;
      if (*i < 0) {
        AddProblem(out, path, "holds a negative iteration");
      } else if (!tree.FindDir("iter_" + Pad(static_cast<uint64_t>(*i), 7))) {
        AddProblem(out, path,
                   "names iter_" + Pad(static_cast<uint64_t>(*i), 7) + ", which is missing");
      }
    } else {
      AddProblem(out, path, "holds neither an iteration nor 'release'");
    }
  }
  out->megatron = std::move(m);
}

namespace {

// ---- DeepSpeed ------------------------------------------------------------------------------
//
// deepspeed/runtime/engine.py, DeepSpeedEngine:
//   save_checkpoint(): tag defaults to f"global_step{self.global_steps}"; writes the tag to the
//     file "latest" in the save directory.
//   _get_ckpt_name(): "mp_rank_{mp:02d}_model_states.pt", or with ZeRO-3 (partitioned weights)
//     "zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt".
//   _get_zero_ckpt_prefix() / _get_rank_zero_ckpt_name(): "{bf16_}zero_pp_rank_{dp}" +
//     "_mp_rank_{mp:02d}_optim_states.pt", bf16_ when bfloat16 is enabled;
//     _get_all_zero_checkpoint_names() also loads the older "..._mp_rank_{mp:02d}optim_states.pt".
//   _get_optimizer_ckpt_name(): MoE "expp_rank_{ep}_mp_rank_{mp:02d}_optim_states.pt".
//   _get_expert_ckpt_name(): "layer_{layer}_expert_{e}_mp_rank_{mp:02d}_model_states.pt" (older:
//     "expert_{e}_mp_rank_{mp:02d}_model_states.pt").
// deepspeed/runtime/pipe/module.py, PipelineModule.ckpt_layer_path(): "layer_{idx:02d}" +
//   "-{rank_repr}" + "-model_states.pt", rank_repr from ProcessTopology.get_rank_repr() (pipe/
//   topology.py) omitting the data and pipe axes: "model_{tp:02d}", or nothing without a model
//   axis. Layers without parameters are skipped, so layer numbers may have gaps.
// deepspeed/checkpoint/ds_to_universal.py: writes <output>/zero/... and the tag of its output
//   folder to "latest_universal" beside it.

struct TagFiles {
  std::set<uint64_t> model_mp;                          // mp_rank_TT_model_states
  std::set<std::pair<uint64_t, uint64_t>> zero3_model;  // (dp, mp)
  std::set<std::pair<uint64_t, uint64_t>> optim;        // (dp, mp)
  std::set<bool> optim_bf16;                            // prefixes seen
  std::map<uint64_t, std::set<uint64_t>> layers;        // layer -> tp ranks
  bool layers_without_tp = false, layers_with_tp = false;
  uint32_t experts = 0, expert_optim = 0;
  bool any() const {
    return !model_mp.empty() || !zero3_model.empty() || !optim.empty() || !layers.empty() ||
           experts || expert_optim;
  }
};

void ClassifyTagFile(const std::string& f, TagFiles* t) {
  uint64_t n[3];
  auto ok = [](const uint64_t* v, size_t k) {
    for (size_t i = 0; i < k; ++i) {
      if (v[i] >= kMaxRank) return false;
    }
    return true;
  };
  if (MatchName(f, "mp_rank_{2}_model_states.pt", n, 1) && ok(n, 1)) {
    t->model_mp.insert(n[0]);
  } else if (MatchName(f, "zero_pp_rank_{1}_mp_rank_{2}_model_states.pt", n, 2) && ok(n, 2)) {
    t->zero3_model.emplace(n[0], n[1]);
  } else if ((MatchName(f, "zero_pp_rank_{1}_mp_rank_{2}_optim_states.pt", n, 2) ||
              MatchName(f, "zero_pp_rank_{1}_mp_rank_{2}optim_states.pt", n, 2)) &&
             ok(n, 2)) {
    t->optim.emplace(n[0], n[1]);
    t->optim_bf16.insert(false);
  } else if ((MatchName(f, "bf16_zero_pp_rank_{1}_mp_rank_{2}_optim_states.pt", n, 2) ||
              MatchName(f, "bf16_zero_pp_rank_{1}_mp_rank_{2}optim_states.pt", n, 2)) &&
             ok(n, 2)) {
    t->optim.emplace(n[0], n[1]);
    t->optim_bf16.insert(true);
  } else if (MatchName(f, "layer_{2}-model_states.pt", n, 1) && ok(n, 1)) {
    t->layers[n[0]].insert(0);
    t->layers_without_tp = true;
  } else if (MatchName(f, "layer_{2}-model_{2}-model_states.pt", n, 2) && ok(n, 2)) {
    t->layers[n[0]].insert(n[1]);
    t->layers_with_tp = true;
  } else if (MatchName(f, "layer_{1}_expert_{1}_mp_rank_{2}_model_states.pt", n, 3) ||
             MatchName(f, "expert_{1}_mp_rank_{2}_model_states.pt", n, 2)) {
    ++t->experts;
  } else if (MatchName(f, "expp_rank_{1}_mp_rank_{2}_optim_states.pt", n, 2)) {
    ++t->expert_optim;
  }
}

// Whether every (dp, mp) of a dp x mp grid is in `cells`; names a few missing ones.
bool CheckGrid(const std::set<std::pair<uint64_t, uint64_t>>& cells, uint64_t dp, uint64_t mp,
               const std::string& tag, const char* what, Layout* out) {
  if (cells.size() == dp * mp) return true;
  size_t named = 0;
  for (uint64_t d = 0; d < dp && named < 8; ++d) {
    for (uint64_t m = 0; m < mp && named < 8; ++m) {
      if (cells.count({d, m})) continue;
      AddProblem(out, tag,
                 std::string(what) + " of dp rank " + std::to_string(d) + ", mp rank " +
                     std::to_string(m) + " missing");
      ++named;
    }
  }
  return false;
}

void SummarizeTag(const Tree& tree, const std::string& tag, const TagFiles& f, DeepSpeedTag* t,
                  Layout* out) {
  uint64_t step[1];
  if (MatchName(tag, "global_step{1}", step, 1)) t->global_step = static_cast<int64_t>(step[0]);
  t->universal = tree.FindDir(Join(tag, "zero")) != nullptr;
  uint64_t mp = 0, dp = 0;
  for (uint64_t m : f.model_mp) mp = std::max(mp, m + 1);
  for (const auto& [d, m] : f.zero3_model) mp = std::max(mp, m + 1), dp = std::max(dp, d + 1);
  for (const auto& [d, m] : f.optim) mp = std::max(mp, m + 1), dp = std::max(dp, d + 1);
  t->mp_size = static_cast<uint32_t>(mp);
  t->dp_size = static_cast<uint32_t>(dp);
  t->zero = !f.zero3_model.empty() ? ZeroStage::kThree
            : !f.optim.empty()     ? ZeroStage::kOneOrTwo
                                   : ZeroStage::kNone;
  t->bf16 = f.optim_bf16.count(true) > 0;
  t->expert_files = f.experts;
  t->expert_optim_files = f.expert_optim;
  bool complete = true;
  if (f.optim_bf16.size() > 1) {
    AddProblem(out, tag, "optimizer files both with and without the bf16_ prefix");
    complete = false;
  }
  if (t->zero == ZeroStage::kThree) {
    complete &= CheckGrid(f.zero3_model, dp, mp, tag, "ZeRO-3 model states", out);
  } else if (f.model_mp.size() != mp) {
    for (uint64_t m = 0; m < mp; ++m) {
      if (!f.model_mp.count(m)) {
        AddProblem(out, Join(tag, "mp_rank_" + Pad(m, 2) + "_model_states.pt"), "missing");
      }
      if (m >= 8) break;
    }
    complete = false;
  }
  if (!f.optim.empty()) complete &= CheckGrid(f.optim, dp, mp, tag, "optimizer states", out);
  // Pipeline layer files: every layer saved by every model-parallel rank of its stage.
  uint64_t layer_tp = 0;
  for (const auto& [layer, tps] : f.layers) layer_tp = std::max(layer_tp, *tps.rbegin() + 1);
  t->pipeline_layers = static_cast<uint32_t>(f.layers.size());
  t->layer_tp_size = static_cast<uint32_t>(layer_tp);
  if (f.layers_with_tp && f.layers_without_tp) {
    AddProblem(out, tag, "layer files both with and without a model rank");
    complete = false;
  }
  for (const auto& [layer, tps] : f.layers) {
    if (tps.size() != layer_tp) {
      AddProblem(out, tag, "layer " + Pad(layer, 2) + " lacks some model ranks");
      complete = false;
    }
  }
  t->complete = complete;
}

// The tag file names a directory that must exist.
void ReadTagFile(const Tree& tree, std::string_view name, bool* has,
                 std::optional<std::string>* tag, Layout* out) {
  const Entry* e = tree.FindFile(name);
  *has = e != nullptr;
  *tag = StrippedContent(e);
  if (!*tag) return;
  if ((*tag)->empty() || (*tag)->find('/') != std::string::npos || !tree.FindDir(**tag)) {
    AddProblem(out, std::string(name), "names tag '" + **tag + "', which is missing");
  }
}

}  // namespace

void ScanDeepSpeed(const Tree& tree, Layout* out) {
  DeepSpeedLayout d;
  for (const std::string& sub : tree.FindDir("")->subdirs) {
    TagFiles files;
    for (const std::string& f : tree.FindDir(sub)->files) ClassifyTagFile(f, &files);
    if (!files.any()) continue;
    DeepSpeedTag t;
    t.tag = sub;
    SummarizeTag(tree, sub, files, &t, out);
    d.tags.push_back(std::move(t));
  }
  if (d.tags.empty()) return;  // a `latest` file alone says nothing
  std::stable_sort(d.tags.begin(), d.tags.end(), [](const DeepSpeedTag& a, const DeepSpeedTag& b) {
    if (a.global_step.has_value() != b.global_step.has_value()) return a.global_step.has_value();
    if (a.global_step != b.global_step) return *a.global_step < *b.global_step;
    return a.tag < b.tag;
  });
  ReadTagFile(tree, "latest", &d.has_latest, &d.latest, out);
  ReadTagFile(tree, "latest_universal", &d.has_latest_universal, &d.latest_universal, out);
  const Entry* tracker = tree.FindFile(kMegatronTracker);
  d.has_megatron_tracker = tracker != nullptr;
  d.megatron_tracker = StrippedContent(tracker);
  out->deepspeed = std::move(d);
}

}  // namespace ckptfs::layout::internal
