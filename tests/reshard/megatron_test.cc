// PlanMegatron end to end on tiny checkpoints built in memory: source rank files (pickle writer +
// TorchZipWriter with literal records) for TP_s x PP_s, resharded to T x P, materialized, parsed
// with ReadTorchFile, and every tensor compared with shards of the full model cut by plain index
// math (docs/views.md). Also the refusals: unknown parameter, virtual pipeline, missing args.
#include "reshard/megatron.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "formats/zip.h"
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: the reference tensors and their helpers

using pickle::Kind;
using pickle::ValuePtr;

// ---- the model ----

enum Place { kPre, kLayer, kPost };

struct Config {
  bool legacy = false, swiglu = false, tied = false, optimizer = false;
  int64_t layers = 4, hidden = 8, heads = 4, ffn = 16, vocab = 10, divisible = 2;
  uint32_t tp = 1, pp = 1;
  // Test hooks: an extra layer parameter no rule covers; the root's model under "model0".
  bool mystery = false, virtual_pp = false, no_args = false;
};

int64_t Padded(const Config& c, int64_t T) {
  const int64_t m = c.divisible * T;
  return (c.vocab + m - 1) / m * m;
}

// One model entry: its key path template ('/' between dicts, '#' for the stage-local layer).
struct Param {
  std::string tmpl;
  Rule rule;
  Place place;
  std::vector<int64_t> shape;  // whole (for kVocab: rows filled in per TP)
  bool none = false;           // `_extra_state: None`
  bool head = false;           // the tied head copy (present only with PP > 1)
  bool parameter = false;      // wrapped in nn.Parameter
};

std::vector<Param> Params(const Config& c) {
  const int64_t H = c.hidden, F = c.ffn, fc1 = c.swiglu ? 2 * F : F;
  const Rule fc1_rule = c.swiglu ? Rule::kSwiglu : Rule::kColumn;
  std::vector<Param> p;
  if (c.legacy) {
    const std::string l = "language_model/encoder/layers.#.";
    p = {
        {"language_model/embedding/word_embeddings/weight", Rule::kVocab, kPre, {0, H}},
        {l + "input_norm.weight", Rule::kReplicated, kLayer, {H}},
        {l + "input_norm.bias", Rule::kReplicated, kLayer, {H}},
        {l + "self_attention.query_key_value.weight", Rule::kColumn, kLayer, {3 * H, H}},
        {l + "self_attention.query_key_value.bias", Rule::kColumn, kLayer, {3 * H}},
        {l + "self_attention.query_key_value._extra_state", Rule::kExtraState, kLayer, {}, true},
        {l + "self_attention.dense.weight", Rule::kRow, kLayer, {H, H}},
        {l + "self_attention.dense.bias", Rule::kReplicated, kLayer, {H}},
        {l + "post_attention_norm.weight", Rule::kReplicated, kLayer, {H}},
        {l + "mlp.dense_h_to_4h.weight", fc1_rule, kLayer, {fc1, H}},
        {l + "mlp.dense_4h_to_h.weight", Rule::kRow, kLayer, {H, F}},
        {l + "mlp.dense_4h_to_h.bias", Rule::kReplicated, kLayer, {H}},
        {"language_model/encoder/final_norm.weight",
         Rule::kReplicated,
         kPost,
         {H},
         false,
         false,
         true},
    };
    if (!c.tied) p.push_back({"language_model/output_layer/weight", Rule::kVocab, kPost, {0, H}});
    if (c.tied)
      p.push_back({"word_embeddings_for_head/weight", Rule::kVocab, kPost, {0, H}, false, true});
  } else {
    const std::string l = "decoder.layers.#.";
    p = {
        {"embedding.word_embeddings.weight", Rule::kVocab, kPre, {0, H}},
        {l + "input_layernorm.weight", Rule::kReplicated, kLayer, {H}},
        {l + "self_attention.core_attention._extra_state", Rule::kExtraState, kLayer, {}, true},
        {l + "self_attention.linear_proj.weight", Rule::kRow, kLayer, {H, H}},
        {l + "self_attention.linear_proj.bias", Rule::kReplicated, kLayer, {H}},
        {l + "self_attention.linear_proj._extra_state", Rule::kExtraState, kLayer, {}, true},
        {l + "self_attention.linear_qkv.weight", Rule::kColumn, kLayer, {3 * H, H}},
        {l + "self_attention.linear_qkv.bias", Rule::kColumn, kLayer, {3 * H}},
        {l + "pre_mlp_layernorm.weight", Rule::kReplicated, kLayer, {H}},
        {l + "mlp.linear_fc1.weight", fc1_rule, kLayer, {fc1, H}},
        {l + "mlp.linear_fc2.weight", Rule::kRow, kLayer, {H, F}},
        {"decoder.final_layernorm.weight", Rule::kReplicated, kPost, {H}, false, false, true},
        {"output_layer.weight", Rule::kVocab, kPost, {0, H}, false, c.tied},
        {"output_layer._extra_state", Rule::kExtraState, kPost, {}, true},
    };
  }
  if (c.mystery)
    p.insert(p.begin() + 2,
             {"decoder.layers.#.mlp.mystery_gate.weight", Rule::kReplicated, kLayer, {4, H}});
  return p;
}

// Every full tensor of the model, by (template, global layer); the head shares the embeddings'.
struct Model {
  Config c;
  std::vector<Param> params;
  std::map<std::pair<std::string, int64_t>, T32> full, exp_avg, master;

  explicit Model(const Config& cfg) : c(cfg), params(Params(cfg)) {
    uint32_t base = 1;
    auto make = [&](std::vector<int64_t> shape) {
      T32 t = Iota(std::move(shape), base);
      base += static_cast<uint32_t>(t.v.size()) + 1000;
      return t;
    };
    for (const Param& p : params) {
      if (p.none) continue;
      std::vector<int64_t> shape = p.shape;
      if (p.rule == Rule::kVocab) shape[0] = Padded(c, c.tp);
      const int64_t n = p.place == kLayer ? c.layers : 1;
      for (int64_t l = 0; l < n; ++l) {
        full[{p.tmpl, l}] = make(shape);
        exp_avg[{p.tmpl, l}] = make(shape);
        master[{p.tmpl, l}] = make(shape);
      }
    }
    if (c.tied) {
      for (const Param& p : params) {
        if (p.head) {
          const std::string emb = params[0].tmpl;
          full[{p.tmpl, 0}] = full[{emb, 0}];
          exp_avg[{p.tmpl, 0}] = exp_avg[{emb, 0}];
          master[{p.tmpl, 0}] = master[{emb, 0}];
        }
      }
    }
  }
};

// The source TP rank holding the first element of target shard t of T (docs/views.md).
uint32_t RefFirstRank(const Config& c, Rule r, const T32& x, uint32_t T, uint32_t t) {
  const int64_t Ts = c.tp;
  switch (r) {
    case Rule::kColumn:
      return static_cast<uint32_t>(t * (x.shape[0] / T) / (x.shape[0] / Ts));
    case Rule::kRow:
      return static_cast<uint32_t>(t * (x.shape[1] / T) / (x.shape[1] / Ts));
    case Rule::kSwiglu: {
      const int64_t f = x.shape[0] / 2;
      return static_cast<uint32_t>(t * (f / T) / (f / Ts));
    }
    case Rule::kVocab: {
      const int64_t r0 = t * (Padded(c, T) / T);
      return static_cast<uint32_t>(r0 >= x.shape[0] ? Ts - 1 : r0 / (x.shape[0] / Ts));
    }
    default:
      return 0;
  }
}

T32 TargetShard(const Model& m, const Param& p, const T32& full, uint32_t T, uint32_t t) {
  if (p.rule == Rule::kVocab) return RefShard(p.rule, PadRows(full, Padded(m.c, T)), T, t);
  return RefShard(p.rule, full, T, t);
}

std::vector<std::string> Split(const std::string& tmpl, int64_t layer) {
  std::string s = tmpl;
  if (auto at = s.find('#'); at != std::string::npos) s.replace(at, 1, std::to_string(layer));
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t at; (at = s.find('/', from)) != std::string::npos; from = at + 1)
    out.push_back(s.substr(from, at - from));
  out.push_back(s.substr(from));
  return out;
}
std::string Dotted(const std::string& tmpl, int64_t layer) {
  std::string s;
  for (const std::string& c : Split(tmpl, layer)) s += (s.empty() ? "" : ".") + c;
  return s;
}

// ---- writing a rank file ----

void Insert(const ValuePtr& root, const std::vector<std::string>& path, ValuePtr leaf) {
  ValuePtr d = root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    ValuePtr next;
    for (auto& [k, v] : d->pairs) {
      if (k->str == path[i]) next = v;
    }
    if (!next) {
      next = pickle::MakeDict({});
      d->pairs.emplace_back(pickle::MakeStr(path[i]), next);
    }
    d = next;
  }
  d->pairs.emplace_back(pickle::MakeStr(path.back()), std::move(leaf));
}

// The source: every rank file's bytes (index p * TP + t) and the parsed files.
struct Source {
  std::vector<std::string> bytes;
  MegatronSource src;
};

// Adam's state index order: group after group (decay, then no decay, by first appearance).
bool NoDecay(const Param& p) { return p.tmpl.ends_with("bias") || p.shape.size() == 1; }

// A rank (t, p) entry list: (param, global layer) in file order.
std::vector<std::pair<const Param*, int64_t>> Entries(const Model& m, uint32_t P, uint32_t p) {
  const int64_t per = m.c.layers / P;
  std::vector<std::pair<const Param*, int64_t>> out;
  for (const Param& x : m.params) {
    if (x.place == kPre && p == 0) out.push_back({&x, 0});
  }
  for (int64_t l = p * per; l < (p + 1) * per; ++l) {
    for (const Param& x : m.params) {
      if (x.place == kLayer) out.push_back({&x, l});
    }
  }
  for (const Param& x : m.params) {
    if (x.place == kPost && p == P - 1 && (!x.head || P > 1)) out.push_back({&x, 0});
  }
  return out;
}

Source BuildSource(const Model& m) {
  const Config& c = m.c;
  Source s;
  s.src.tp = c.tp;
  s.src.pp = c.pp;
  const int64_t per = c.layers / c.pp;
  for (uint32_t p = 0; p < c.pp; ++p) {
    for (uint32_t t = 0; t < c.tp; ++t) {
      FileBuilder fb;
      ValuePtr model = pickle::MakeDict({});
      // Optimizer: groups by class in order of first appearance.
      std::vector<std::pair<ValuePtr, ValuePtr>> state;
      std::vector<std::vector<int64_t>> group_members(2);  // class -> entry indices
      std::vector<int> order;
      const auto entries = Entries(m, c.pp, p);
      std::vector<ValuePtr> tensors(entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto& [x, l] = entries[i];
        const int64_t local = x->place == kLayer ? l - p * per : l;
        ValuePtr leaf =
            x->none ? pickle::MakeNone()
                    : fb.Tensor(RefShard(x->rule, m.full.at({x->tmpl, l}), c.tp, t), x->parameter);
        Insert(model, Split(x->tmpl, local), leaf);
        if (x->none) continue;
        const int cls = NoDecay(*x) ? 1 : 0;
        if (group_members[cls].empty()) order.push_back(cls);
        group_members[cls].push_back(static_cast<int64_t>(i));
      }
      std::vector<ValuePtr> groups, masters;
      int64_t idx = 0;
      for (int cls : order) {
        std::vector<ValuePtr> ids, ms;
        for (int64_t i : group_members[cls]) {
          const auto& [x, l] = entries[i];
          const uint32_t step = 1000 * t + static_cast<uint32_t>(i);
          state.emplace_back(
              pickle::MakeInt(idx),
              pickle::MakeDict(
                  {{pickle::MakeStr("step"), pickle::MakeInt(step)},
                   {pickle::MakeStr("exp_avg"),
                    fb.Tensor(RefShard(x->rule, m.exp_avg.at({x->tmpl, l}), c.tp, t))}}));
          ms.push_back(fb.Tensor(RefShard(x->rule, m.master.at({x->tmpl, l}), c.tp, t)));
          ids.push_back(pickle::MakeInt(idx++));
        }
        groups.push_back(
            pickle::MakeDict({{pickle::MakeStr("params"), pickle::MakeList(ids)},
                              {pickle::MakeStr("wd_mult"), pickle::MakeFloat(cls ? 0.0 : 1.0)},
                              {pickle::MakeStr("lr_mult"), pickle::MakeFloat(1.0)}}));
        masters.push_back(pickle::MakeList(std::move(ms)));
      }
      auto args = std::make_shared<pickle::Value>(
          *pickle::MakeCall(pickle::MakeGlobal("argparse", "Namespace"), pickle::MakeTuple({})));
      auto kv = [](const char* k, ValuePtr v) { return std::make_pair(pickle::MakeStr(k), v); };
      args->state = pickle::MakeDict({
          kv("num_layers", pickle::MakeInt(c.layers)),
          kv("hidden_size", pickle::MakeInt(c.hidden)),
          kv("num_attention_heads", pickle::MakeInt(c.heads)),
          kv("ffn_hidden_size", pickle::MakeInt(c.ffn)),
          kv("swiglu", pickle::MakeBool(c.swiglu)),
          kv("untie_embeddings_and_output_weights", pickle::MakeBool(!c.tied)),
          kv("vocab_size", pickle::MakeInt(c.vocab)),
          kv("make_vocab_size_divisible_by", pickle::MakeInt(c.divisible)),
          kv("padded_vocab_size", pickle::MakeInt(Padded(c, c.tp))),
          kv("tensor_model_parallel_size", pickle::MakeInt(c.tp)),
          kv("pipeline_model_parallel_size", pickle::MakeInt(c.pp)),
          kv("data_parallel_size", pickle::MakeInt(2)),
          kv("world_size", pickle::MakeInt(2 * c.tp * c.pp)),
      });
      std::vector<std::pair<ValuePtr, ValuePtr>> root;
      if (!c.no_args) root.push_back(kv("args", args));
      root.push_back(kv("checkpoint_version", pickle::MakeFloat(3.0)));
      root.push_back(kv("iteration", pickle::MakeInt(7)));
      root.push_back(kv(c.virtual_pp ? "model0" : "model", model));
      if (c.optimizer) {
        ValuePtr inner = pickle::MakeDict(
            {kv("state", pickle::MakeDict(state)), kv("param_groups", pickle::MakeList(groups))});
        root.push_back(kv("optimizer", pickle::MakeDict({kv("optimizer", inner),
                                                         kv("fp32_from_fp16_params",
                                                            pickle::MakeList(masters))})));
      }
      root.push_back(
          kv("rng_state",
             pickle::MakeList({pickle::MakeDict(
                 {kv("who", pickle::MakeStr(std::to_string(t) + "," + std::to_string(p)))})})));
      root.push_back(kv("num_floating_point_operations_so_far", pickle::MakeInt(42)));
      const std::vector<std::pair<std::string, std::string>> extra{
          {".data/version", "3\n"},
          {".data/serialization_id", "sid-" + std::to_string(p * c.tp + t)}};
      s.bytes.push_back(fb.Write(pickle::MakeDict(root), "model_optim_rng", extra));
      auto parsed = Parse(s.bytes.back());
      EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
      MegatronRankFile r;
      r.tp = t;
      r.pp = p;
      r.source = p * c.tp + t;
      r.file = std::make_shared<const TorchFile>(std::move(parsed).value());
      r.extra_records = extra;
      s.src.ranks.push_back(std::move(r));
    }
  }
  return s;
}

// ---- reading a target file back ----

ValuePtr Get(const ValuePtr& m, const std::string& key) {
  if (!m) return nullptr;
  const auto& pairs = m->kind == Kind::kDict ? m->pairs : m->dict_items;
  for (const auto& [k, v] : pairs) {
    if (k->kind == Kind::kStr && k->str == key) return v;
    if (k->kind == Kind::kInt && std::to_string(k->i) == key) return v;
  }
  return nullptr;
}

void FlattenModel(const ValuePtr& v, const std::string& path,
                  std::vector<std::pair<std::string, ValuePtr>>* out) {
  const bool mapping = v && (v->kind == Kind::kDict || v->IsCallOf("collections", "OrderedDict"));
  if (!mapping) {
    out->emplace_back(path, v);
    return;
  }
  for (const auto& [k, x] : v->kind == Kind::kDict ? v->pairs : v->dict_items) {
    FlattenModel(x, path.empty() ? k->str : path + "." + k->str, out);
  }
}

struct Target {
  std::string bytes;
  TorchFile file;
  std::map<const pickle::Value*, const TorchTensor*> by_node;
  T32 Tensor(const ValuePtr& v) const {
    T32 out;
    auto it = by_node.find(v.get());
    if (it == by_node.end()) {
      ADD_FAILURE() << "not a tensor: " << pickle::Debug(v, 200);
      return out;
    }
    out.shape = it->second->shape;
    EXPECT_EQ(it->second->dtype, "float32");
    out.v.resize(it->second->length / 4);
    std::memcpy(out.v.data(), bytes.data() + it->second->offset, it->second->length);
    return out;
  }
};

// Plans T x P, fills in the CRCs, materializes each file and checks it is a sound zip.
std::vector<Target> View(const Source& s, uint32_t T, uint32_t P) {
  auto views = PlanMegatron(s.src, T, P, *Rules::BuiltIn());
  EXPECT_TRUE(views.ok()) << views.status().ToString();
  if (!views.ok()) return {};
  EXPECT_EQ(views->size(), size_t{T} * P);
  std::vector<Target> out;
  for (ViewFile& f : *views) {
    Status st = ComputeCrcs(
        &f,
        [&](uint32_t src, uint64_t off, uint64_t len,
            const std::function<void(const uint8_t*, size_t)>& sink) -> Status {
          EXPECT_LE(off + len, s.bytes[src].size());
          sink(reinterpret_cast<const uint8_t*>(s.bytes[src].data()) + off, len);
          return Status::Ok();
        },
        nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Target t;
    t.bytes = Materialize(f.recipe, s.bytes);
    auto parsed = Parse(t.bytes);
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    if (!parsed.ok()) return {};
    t.file = std::move(parsed).value();
    for (const zip::Entry& e : t.file.dir.entries) {
      const uint32_t crc = static_cast<uint32_t>(
          crc32_z(crc32(0, Z_NULL, 0),
                  reinterpret_cast<const Bytef*>(t.bytes.data()) + e.data_offset, e.size));
      EXPECT_EQ(e.crc32, crc) << e.name;
      EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
    }
    out.push_back(std::move(t));
  }
  for (Target& t : out) {
    for (const TorchTensor& x : t.file.pickle.tensors) t.by_node[x.node] = &x;
  }
  return out;
}

// Checks every target file against the reference.
void CheckView(const Model& m, const Source& s, uint32_t T, uint32_t P) {
  SCOPED_TRACE("TP " + std::to_string(m.c.tp) + "x PP " + std::to_string(m.c.pp) + " -> TP " +
               std::to_string(T) + " x PP " + std::to_string(P));
  std::vector<Target> views = View(s, T, P);
  ASSERT_EQ(views.size(), size_t{T} * P);
  const int64_t per = m.c.layers / P;
  for (uint32_t p = 0; p < P; ++p) {
    for (uint32_t t = 0; t < T; ++t) {
      SCOPED_TRACE("target rank " + std::to_string(t) + "," + std::to_string(p));
      const Target& v = views[p * T + t];
      const ValuePtr& root = v.file.root;
      EXPECT_EQ(v.file.prefix, "model_optim_rng");
      // The model: names in order, tensors cut by the rules.
      std::vector<std::pair<std::string, ValuePtr>> got;
      FlattenModel(Get(root, "model"), "", &got);
      const auto entries = Entries(m, P, p);
      ASSERT_EQ(got.size(), entries.size());
      for (size_t i = 0; i < entries.size(); ++i) {
        const auto& [x, l] = entries[i];
        const int64_t local = x->place == kLayer ? l - p * per : l;
        EXPECT_EQ(got[i].first, Dotted(x->tmpl, local));
        if (x->none) {
          EXPECT_EQ(got[i].second->kind, Kind::kNone) << got[i].first;
          continue;
        }
        const T32 want = TargetShard(m, *x, m.full.at({x->tmpl, l}), T, t);
        const T32 have = v.Tensor(got[i].second);
        EXPECT_EQ(have.shape, want.shape) << got[i].first;
        EXPECT_TRUE(have.v == want.v) << got[i].first << ": bytes differ";
        EXPECT_EQ(got[i].second->IsCallOf("torch._utils", "_rebuild_parameter"), x->parameter)
            << got[i].first;
      }
      // What comes from the primary source rank, and the rewritten args.
      const uint32_t pt = t * m.c.tp / T, pp = p * m.c.pp / P;
      ValuePtr rng = Get(root, "rng_state");
      ASSERT_TRUE(rng && rng->kind == Kind::kList && rng->items.size() == 1);
      EXPECT_EQ(Get(rng->items[0], "who")->str, std::to_string(pt) + "," + std::to_string(pp));
      EXPECT_EQ(Get(root, "iteration")->i, 7);
      EXPECT_EQ(Get(root, "num_floating_point_operations_so_far")->i, 42);
      ValuePtr args = Get(root, "args");
      ASSERT_TRUE(args && args->state);
      EXPECT_EQ(Get(args->state, "tensor_model_parallel_size")->i, int64_t{T});
      EXPECT_EQ(Get(args->state, "pipeline_model_parallel_size")->i, int64_t{P});
      EXPECT_EQ(Get(args->state, "padded_vocab_size")->i, Padded(m.c, T));
      EXPECT_EQ(Get(args->state, "world_size")->i, int64_t{2} * T * P);
      EXPECT_EQ(Get(args->state, "num_layers")->i, m.c.layers);
      const zip::Entry* sid = v.file.dir.Find("model_optim_rng/.data/serialization_id");
      ASSERT_NE(sid, nullptr);
      EXPECT_EQ(v.bytes.substr(sid->data_offset, sid->size),
                "sid-" + std::to_string(pp * m.c.tp + pt));

      if (!m.c.optimizer) continue;
      // The optimizer: groups by class in order of first appearance on this stage, indices
      // group after group, state and masters cut like their parameter, step from the source
      // shard holding the target's first element.
      ValuePtr wrap = Get(root, "optimizer");
      ValuePtr inner = Get(wrap, "optimizer");
      ValuePtr groups = Get(inner, "param_groups");
      ValuePtr state = Get(inner, "state");
      ValuePtr masters = Get(wrap, "fp32_from_fp16_params");
      ASSERT_TRUE(groups && state && masters);
      std::vector<std::vector<size_t>> members(2);
      std::vector<int> order;
      for (size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].first->none) continue;
        const int cls = NoDecay(*entries[i].first) ? 1 : 0;
        if (members[cls].empty()) order.push_back(cls);
        members[cls].push_back(i);
      }
      ASSERT_EQ(groups->items.size(), order.size());
      ASSERT_EQ(masters->items.size(), order.size());
      int64_t idx = 0;
      for (size_t g = 0; g < order.size(); ++g) {
        const ValuePtr& group = groups->items[g];
        EXPECT_EQ(Get(group, "wd_mult")->f, order[g] ? 0.0 : 1.0);
        ValuePtr ids = Get(group, "params");
        ASSERT_EQ(ids->items.size(), members[order[g]].size());
        ASSERT_EQ(masters->items[g]->items.size(), members[order[g]].size());
        for (size_t k = 0; k < members[order[g]].size(); ++k) {
          const auto& [x, l] = entries[members[order[g]][k]];
          const std::string name = Dotted(x->tmpl, l);
          EXPECT_EQ(ids->items[k]->i, idx) << name;
          ValuePtr st = Get(state, std::to_string(idx));
          ++idx;
          ASSERT_TRUE(st) << name;
          const T32 ea = v.Tensor(Get(st, "exp_avg"));
          EXPECT_TRUE(ea.v == TargetShard(m, *x, m.exp_avg.at({x->tmpl, l}), T, t).v)
              << name << " exp_avg";
          const T32 ms = v.Tensor(masters->items[g]->items[k]);
          EXPECT_TRUE(ms.v == TargetShard(m, *x, m.master.at({x->tmpl, l}), T, t).v)
              << name << " master";
          // step = 1000 * source tp + the entry's index in its source file.
          const uint32_t first = RefFirstRank(m.c, x->rule, m.full.at({x->tmpl, l}), T, t);
          const auto src_entries =
              Entries(m, m.c.pp, static_cast<uint32_t>(l * m.c.pp / m.c.layers));
          int64_t src_i = -1;
          for (size_t j = 0; j < src_entries.size(); ++j) {
            if (src_entries[j].first == x && (x->place != kLayer || src_entries[j].second == l)) {
              src_i = static_cast<int64_t>(j);
            }
          }
          if (x->place == kPost) {
            const auto last = Entries(m, m.c.pp, m.c.pp - 1);
            for (size_t j = 0; j < last.size(); ++j) {
              if (last[j].first == x) src_i = static_cast<int64_t>(j);
            }
          }
          if (x->head && m.c.pp == 1) src_i = 0;  // made from the embeddings (entry 0)
          EXPECT_EQ(Get(st, "step")->i, 1000 * first + src_i) << name << " step";
        }
      }
    }
  }
}

struct Shape {
  uint32_t T, P;
};

void RunAll(Config c, Shape from, const std::vector<Shape>& to) {
  c.tp = from.T;
  c.pp = from.P;
  const Model m(c);
  const Source s = BuildSource(m);
  for (Shape x : to) CheckView(m, s, x.T, x.P);
}

TEST(Megatron, McoreUntied) {
  Config c;
  RunAll(c, {2, 2}, {{2, 2}, {1, 1}, {4, 1}, {4, 2}, {1, 4}, {2, 4}});
}

TEST(Megatron, McoreSwigluTiedWithOptimizer) {
  Config c;
  c.swiglu = c.tied = c.optimizer = true;
  RunAll(c, {1, 1}, {{1, 1}, {2, 1}, {4, 2}, {2, 4}});
  RunAll(c, {2, 2}, {{2, 2}, {1, 1}, {4, 4}});
}

TEST(Megatron, LegacyTiedWithOptimizer) {
  Config c;
  c.legacy = c.tied = c.optimizer = true;
  RunAll(c, {1, 1}, {{2, 2}, {4, 1}});
  RunAll(c, {4, 2}, {{2, 1}, {1, 4}});
}

TEST(Megatron, LegacyUntiedSwiglu) {
  Config c;
  c.legacy = c.swiglu = true;
  RunAll(c, {4, 1}, {{1, 2}, {2, 1}, {4, 4}});
}

// Layer numbers change width between stage-local and global numbering (4 -> 10).
TEST(Megatron, TwoDigitLayerNumbersRenumber) {
  Config c;
  c.layers = 12;
  RunAll(c, {1, 2}, {{1, 1}, {1, 3}, {2, 4}});
  c.legacy = true;
  RunAll(c, {1, 3}, {{1, 1}, {1, 2}});
}

TEST(Megatron, SameShapeIsTheSourceTensorForTensor) {
  Config c;
  c.optimizer = true;
  c.tp = 2;
  c.pp = 2;
  const Model m(c);
  const Source s = BuildSource(m);
  std::vector<Target> v = View(s, 2, 2);
  ASSERT_EQ(v.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& want = s.src.ranks[i].file->pickle.tensors;
    const auto& got = v[i].file.pickle.tensors;
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].name, want[k].name);
      EXPECT_EQ(got[k].shape, want[k].shape);
      EXPECT_EQ(v[i].bytes.substr(got[k].offset, got[k].length),
                s.bytes[i].substr(want[k].offset, want[k].length))
          << got[k].name;
    }
  }
}

// ---- refusals ----

Status PlanError(Config c, uint32_t T, uint32_t P) {
  const Model m(c);
  const Source s = BuildSource(m);
  auto r = PlanMegatron(s.src, T, P, *Rules::BuiltIn());
  return r.ok() ? Status::Ok() : r.status();
}

TEST(MegatronErrors, UnknownParameterIsNamed) {
  Config c;
  c.mystery = true;
  Status st = PlanError(c, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "model.decoder.layers.0.mlp.mystery_gate.weight"));
}

TEST(MegatronErrors, UserRulesCoverAnUnknownParameter) {
  Config c;
  c.mystery = true;
  const Model m(c);
  const Source s = BuildSource(m);
  auto rules = Rules::Parse("mlp\\.mystery_gate\\.weight$ replicated\n");
  ASSERT_TRUE(rules.ok());
  auto r = PlanMegatron(s.src, 1, 2, **rules);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

TEST(MegatronErrors, VirtualPipelineIsRefused) {
  Config c;
  c.virtual_pp = true;
  Status st = PlanError(c, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "model0"));
}

TEST(MegatronErrors, MissingArgsIsRefused) {
  Config c;
  c.no_args = true;
  Status st = PlanError(c, 1, 1);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "args"));
}

TEST(MegatronErrors, TargetShapeMustDivide) {
  Config c;  // 4 heads, ffn 16, 4 layers
  Status st = PlanError(c, 3, 1);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "TP 3 does not divide num_attention_heads 4"));
  st = PlanError(c, 1, 3);
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "PP 3 does not divide num_layers 4"));
  EXPECT_EQ(PlanError(c, 8, 1).code(), Code::kInvalid);
}

TEST(MegatronErrors, MissingRankFileIsRefused) {
  Config c;
  c.tp = 2;
  const Model m(c);
  Source s = BuildSource(m);
  s.src.ranks.pop_back();
  auto r = PlanMegatron(s.src, 1, 1, *Rules::BuiltIn());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalid);
}

TEST(Megatron, RankDirectoryNames) {
  EXPECT_EQ(MegatronRankDir(3, 0, 1), "mp_rank_03");
  EXPECT_EQ(MegatronRankDir(3, 1, 2), "mp_rank_03_001");
  EXPECT_EQ(MegatronRankDir(12, 7, 8), "mp_rank_12_007");
}

}  // namespace
}  // namespace ckptfs::reshard
