// PlanMegatron on tiny mixture-of-experts checkpoints built in memory: rank files for TP_s x EP_s
// in each of megatron.core's three expert forms, resharded to T x E, materialized, parsed, and
// every expert tensor compared with the global expert it must hold (local expert k of EP rank r
// is expert r * E/EP + k), cut for TP by plain index math. Also the refusals (docs/views.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "reshard/megatron.h"
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: the reference tensors and their helpers

using pickle::ValuePtr;

enum class Form { kSequential, kTe, kGrouped };

struct Moe {
  Form form = Form::kSequential;
  int64_t layers = 2, hidden = 4, experts = 4, ffn = 4, vocab = 8;
  uint32_t tp = 1, ep = 1;
  // Extra args (name, int value; a negative value: None).
  std::vector<std::pair<std::string, int64_t>> extra;
};

T32 Transpose(const T32& x) {
  T32 out{{x.shape[1], x.shape[0]}, {}};
  for (int64_t j = 0; j < x.shape[1]; ++j) {
    for (int64_t i = 0; i < x.shape[0]; ++i) out.v.push_back(x.v[i * x.shape[1] + j]);
  }
  return out;
}

// The full weights of expert g of layer l: fc1 [2F, H] (gate rows, then up rows), fc2 [H, F].
T32 Fc1(const Moe& m, int64_t l, int64_t g) {
  return Iota({2 * m.ffn, m.hidden}, static_cast<uint32_t>(100000 * (l + 1) + 1000 * g));
}
T32 Fc2(const Moe& m, int64_t l, int64_t g) {
  return Iota({m.hidden, m.ffn}, static_cast<uint32_t>(100000 * (l + 1) + 1000 * g + 500));
}

ValuePtr Kv(const ValuePtr& d, const std::string& k, ValuePtr v) {
  d->pairs.emplace_back(pickle::MakeStr(k), std::move(v));
  return d;
}

struct Source {
  MegatronSource src;
  std::vector<std::string> bytes;
};

Source Build(const Moe& m) {
  Source s;
  s.src.tp = m.tp;
  s.src.pp = 1;
  s.src.ep = m.ep;
  const int64_t le = m.experts / m.ep;
  for (uint32_t e = 0; e < m.ep; ++e) {
    for (uint32_t t = 0; t < m.tp; ++t) {
      FileBuilder fb;
      ValuePtr model = pickle::MakeDict({});
      Kv(model, "embedding.word_embeddings.weight",
         fb.Tensor(Chunk(Iota({m.vocab, m.hidden}, 7), 0, m.tp, t)));
      for (int64_t l = 0; l < m.layers; ++l) {
        const std::string x = "decoder.layers." + std::to_string(l) + ".mlp.";
        Kv(model, x + "router.weight", fb.Tensor(Iota({m.experts, m.hidden}, 50000)));
        std::vector<T32> w1, w2;  // the local experts' TP shards
        for (int64_t k = 0; k < le; ++k) {
          w1.push_back(RefShard(Rule::kSwiglu, Fc1(m, l, e * le + k), m.tp, t));
          w2.push_back(RefShard(Rule::kRow, Fc2(m, l, e * le + k), m.tp, t));
        }
        const std::string xe = x + "experts.";
        if (m.form == Form::kSequential) {
          for (int64_t k = 0; k < le; ++k) {
            const std::string p = xe + "local_experts." + std::to_string(k) + ".";
            Kv(model, p + "linear_fc1.weight", fb.Tensor(w1[k]));
            Kv(model, p + "linear_fc1._extra_state", pickle::MakeNone());
            Kv(model, p + "linear_fc2.weight", fb.Tensor(w2[k]));
            Kv(model, p + "linear_fc2._extra_state", pickle::MakeNone());
          }
        } else if (m.form == Form::kTe) {
          for (int64_t k = 0; k < le; ++k) {
            Kv(model, xe + "linear_fc1.weight" + std::to_string(k), fb.Tensor(w1[k]));
          }
          Kv(model, xe + "linear_fc1._extra_state", pickle::MakeNone());
          for (int64_t k = 0; k < le; ++k) {
            Kv(model, xe + "linear_fc2.weight" + std::to_string(k), fb.Tensor(w2[k]));
          }
          Kv(model, xe + "linear_fc2._extra_state", pickle::MakeNone());
        } else {  // one block per expert, each expert's weight transposed
          T32 g1{{0}, {}}, g2{{0}, {}};
          for (int64_t k = 0; k < le; ++k) {
            T32 a = Transpose(w1[k]), b = Transpose(w2[k]);
            g1.v.insert(g1.v.end(), a.v.begin(), a.v.end());
            g2.v.insert(g2.v.end(), b.v.begin(), b.v.end());
          }
          g1.shape = {m.hidden, static_cast<int64_t>(g1.v.size()) / m.hidden};
          g2.shape = {static_cast<int64_t>(g2.v.size()) / m.hidden, m.hidden};
          Kv(model, xe + "weight1", fb.Tensor(g1));
          Kv(model, xe + "weight2", fb.Tensor(g2));
        }
      }
      Kv(model, "decoder.final_layernorm.weight", fb.Tensor(Iota({m.hidden}, 90000)));
      Kv(model, "output_layer.weight",
         fb.Tensor(Chunk(Iota({m.vocab, m.hidden}, 70000), 0, m.tp, t)));
      auto args = std::make_shared<pickle::Value>(
          *pickle::MakeCall(pickle::MakeGlobal("argparse", "Namespace"), pickle::MakeTuple({})));
      args->state = pickle::MakeDict({});
      auto arg = [&](const std::string& k, int64_t v, bool overridable = true) {
        for (const auto& [ek, ev] : m.extra) {
          if (overridable && ek == k) return;  // m.extra's value, added below
        }
        Kv(args->state, k, v < 0 ? pickle::MakeNone() : pickle::MakeInt(v));
      };
      arg("num_layers", m.layers);
      arg("hidden_size", m.hidden);
      arg("num_attention_heads", 2);
      arg("ffn_hidden_size", 8);
      Kv(args->state, "swiglu", pickle::MakeBool(true));
      Kv(args->state, "untie_embeddings_and_output_weights", pickle::MakeBool(true));
      arg("vocab_size", m.vocab);
      arg("make_vocab_size_divisible_by", 2);
      arg("padded_vocab_size", m.vocab);
      arg("tensor_model_parallel_size", m.tp);
      arg("pipeline_model_parallel_size", 1);
      arg("expert_model_parallel_size", m.ep);
      arg("expert_tensor_parallel_size", m.tp);
      arg("num_experts", m.experts);
      arg("moe_ffn_hidden_size", m.ffn);
      for (const auto& [k, v] : m.extra) arg(k, v, false);
      ValuePtr root = pickle::MakeDict({});
      Kv(root, "args", args);
      Kv(root, "iteration", pickle::MakeInt(7));
      Kv(root, "model", model);
      Kv(root, "rng_state", pickle::MakeStr(std::to_string(t) + "," + std::to_string(e)));
      s.bytes.push_back(fb.Write(root, "model_optim_rng"));
      auto parsed = Parse(s.bytes.back());
      EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
      MegatronRankFile r;
      r.tp = t;
      r.ep = e;
      r.source = static_cast<uint32_t>(s.bytes.size() - 1);
      r.file = std::make_shared<const TorchFile>(std::move(parsed).value());
      s.src.ranks.push_back(std::move(r));
    }
  }
  return s;
}

// The target files' model tensors by name (float32), and their `rng_state`.
struct Target {
  std::map<std::string, T32> tensors;
  std::vector<std::string> order;
  std::string rng;
};

std::vector<Target> View(const Source& s, uint32_t T, uint32_t E) {
  auto views = PlanMegatron(s.src, T, 1, *Rules::BuiltIn(), nullptr, E);
  EXPECT_TRUE(views.ok()) << views.status().ToString();
  if (!views.ok()) return {};
  std::vector<Target> out;
  for (ViewFile& f : *views) {
    Status st = ComputeCrcs(
        &f,
        [&](uint32_t src, uint64_t off, uint64_t len,
            const std::function<void(const uint8_t*, size_t)>& sink) -> Status {
          sink(reinterpret_cast<const uint8_t*>(s.bytes[src].data()) + off, len);
          return Status::Ok();
        },
        nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    const std::string bytes = Materialize(f.recipe, s.bytes);
    auto parsed = Parse(bytes);
    EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
    if (!parsed.ok()) return {};
    std::map<const pickle::Value*, const TorchTensor*> by_node;
    for (const TorchTensor& x : parsed->pickle.tensors) by_node[x.node] = &x;
    Target t;
    for (const auto& [k, v] : parsed->root->pairs) {
      if (k->str == "rng_state") t.rng = v->str;
      if (k->str != "model") continue;
      for (const auto& [name, leaf] : v->pairs) {
        t.order.push_back(name->str);
        auto it = by_node.find(leaf.get());
        if (it == by_node.end()) continue;
        T32 x{it->second->shape, std::vector<uint32_t>(it->second->length / 4)};
        std::memcpy(x.v.data(), bytes.data() + it->second->offset, it->second->length);
        t.tensors[name->str] = x;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

void ExpectSame(const T32& got, const T32& want, const std::string& what) {
  EXPECT_EQ(got.shape, want.shape) << what;
  EXPECT_TRUE(got.v == want.v) << what << ": values differ";
}

void Check(Moe m, uint32_t T, uint32_t E) {
  SCOPED_TRACE("TP " + std::to_string(m.tp) + " EP " + std::to_string(m.ep) + " -> TP " +
               std::to_string(T) + " EP " + std::to_string(E));
  const Source s = Build(m);
  const std::vector<Target> views = View(s, T, E);
  ASSERT_EQ(views.size(), size_t{T} * E);
  const int64_t le = m.experts / E;
  for (uint32_t e = 0; e < E; ++e) {
    for (uint32_t t = 0; t < T; ++t) {
      const Target& v = views[e * T + t];
      SCOPED_TRACE("target rank tp " + std::to_string(t) + " ep " + std::to_string(e));
      // Everything not split comes from the primary source rank.
      EXPECT_EQ(v.rng, std::to_string(t * m.tp / T) + "," + std::to_string(e * m.ep / E));
      for (int64_t l = 0; l < m.layers; ++l) {
        const std::string xe = "decoder.layers." + std::to_string(l) + ".mlp.experts.";
        std::vector<T32> w1, w2;
        for (int64_t k = 0; k < le; ++k) {
          w1.push_back(RefShard(Rule::kSwiglu, Fc1(m, l, e * le + k), T, t));
          w2.push_back(RefShard(Rule::kRow, Fc2(m, l, e * le + k), T, t));
        }
        for (int64_t k = 0; k < le; ++k) {
          const std::string ks = std::to_string(k);
          if (m.form == Form::kSequential) {
            ExpectSame(v.tensors.at(xe + "local_experts." + ks + ".linear_fc1.weight"), w1[k], ks);
            ExpectSame(v.tensors.at(xe + "local_experts." + ks + ".linear_fc2.weight"), w2[k], ks);
          } else if (m.form == Form::kTe) {
            ExpectSame(v.tensors.at(xe + "linear_fc1.weight" + ks), w1[k], ks);
            ExpectSame(v.tensors.at(xe + "linear_fc2.weight" + ks), w2[k], ks);
          }
        }
        if (m.form == Form::kGrouped) {
          T32 g1{{m.hidden, 0}, {}}, g2{{0, m.hidden}, {}};
          for (int64_t k = 0; k < le; ++k) {
            T32 a = Transpose(w1[k]), b = Transpose(w2[k]);
            g1.v.insert(g1.v.end(), a.v.begin(), a.v.end());
            g1.shape[1] += a.shape[1];
            g2.v.insert(g2.v.end(), b.v.begin(), b.v.end());
            g2.shape[0] += b.shape[0];
          }
          ExpectSame(v.tensors.at(xe + "weight1"), g1, "weight1");
          ExpectSame(v.tensors.at(xe + "weight2"), g2, "weight2");
        }
        ExpectSame(v.tensors.at("decoder.layers." + std::to_string(l) + ".mlp.router.weight"),
                   Iota({m.experts, m.hidden}, 50000), "router");
      }
      if (m.form == Form::kTe) {  // the module's extra state, right after its weights
        const std::string fc1x = "decoder.layers.0.mlp.experts.linear_fc1._extra_state";
        auto at = std::find(v.order.begin(), v.order.end(), fc1x);
        ASSERT_NE(at, v.order.end());
        EXPECT_EQ(*(at - 1),
                  "decoder.layers.0.mlp.experts.linear_fc1.weight" + std::to_string(le - 1));
      }
    }
  }
}

TEST(MegatronMoe, SequentialExpertsMoveBetweenEpRanks) {
  for (auto [T, E] :
       std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 4}, {2, 2}, {2, 4}, {1, 2}}) {
    Check({.form = Form::kSequential, .tp = 2, .ep = 2}, T, E);
  }
}

TEST(MegatronMoe, TeGroupedExpertsMoveBetweenEpRanks) {
  for (auto [T, E] : std::vector<std::pair<uint32_t, uint32_t>>{{1, 4}, {2, 1}, {1, 2}}) {
    Check({.form = Form::kTe, .tp = 2, .ep = 2}, T, E);
  }
  Check({.form = Form::kTe, .tp = 1, .ep = 4}, 2, 2);
}

TEST(MegatronMoe, LegacyGroupedWeightsAreRecutPerExpert) {
  for (auto [T, E] : std::vector<std::pair<uint32_t, uint32_t>>{{1, 1}, {1, 4}, {2, 2}, {2, 1}}) {
    Check({.form = Form::kGrouped, .tp = 2, .ep = 2}, T, E);
  }
  Check({.form = Form::kGrouped, .tp = 1, .ep = 4}, 2, 2);
}

Status PlanError(Moe m, uint32_t T, uint32_t E) {
  const Source s = Build(m);
  auto r = PlanMegatron(s.src, T, 1, *Rules::BuiltIn(), nullptr, E);
  EXPECT_FALSE(r.ok());
  return r.ok() ? Status::Ok() : r.status();
}

TEST(MegatronMoeErrors, ExpertTensorParallelismOtherThanTpIsRefused) {
  Moe m{.tp = 2, .ep = 2};
  m.extra = {{"expert_tensor_parallel_size", 1}};
  EXPECT_TRUE(Contains(PlanError(m, 1, 2).message(),
                       "expert_tensor_parallel_size 1 differs from tensor_model_parallel_size 2"));
}

TEST(MegatronMoeErrors, InterleavedGluIsRefused) {
  Moe m{.ep = 2};
  m.extra = {{"moe_mlp_glu_interleave_size", 2}};
  EXPECT_TRUE(Contains(PlanError(m, 1, 1).message(), "moe_mlp_glu_interleave_size"));
  m.extra = {{"moe_mlp_glu_interleave_size", -1}};  // None: the plain [gate; up] layout
  Check(m, 1, 1);
}

TEST(MegatronMoeErrors, EpMustDivideTheExperts) {
  EXPECT_TRUE(Contains(PlanError({.ep = 2}, 1, 3).message(), "EP 3 does not divide num_experts 4"));
}

TEST(MegatronMoeErrors, RankFilesMustMatchTheArgsEp) {
  Moe m{.ep = 2};
  Source s = Build(m);
  s.src.ranks.pop_back();
  s.src.ep = 1;
  auto r = PlanMegatron(s.src, 1, 1, *Rules::BuiltIn(), nullptr, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "expert_model_parallel_size says 2"));
}

TEST(MegatronMoe, RankDirectoryNamesWithExperts) {
  EXPECT_EQ(MegatronRankDir(3, 0, 1, 0, 1), "mp_rank_03");
  EXPECT_EQ(MegatronRankDir(3, 0, 1, 5, 8), "mp_rank_03_005");
  EXPECT_EQ(MegatronRankDir(3, 1, 2, 5, 8), "mp_rank_03_001_005");
  EXPECT_EQ(MegatronRankDir(3, 1, 2, 0, 1), "mp_rank_03_001");
}

}  // namespace
}  // namespace ckptfs::reshard
