// Rules: which rule covers a parameter (both Megatron naming eras, user rules first), and
// PlanShard's gathers checked by materializing them over small integer-valued source shards and
// comparing with target shards built by plain index math.
#include "reshard/rules.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: the reference tensors and their helpers

// ---- Classify ----

struct Case {
  std::string name;
  Rule plain, swiglu;  // without and with args.swiglu
};

void ExpectRules(const Rules& rules, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    auto r = rules.Classify(c.name, false);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().ToString();
    EXPECT_EQ(*r, c.plain) << c.name << " is " << RuleName(*r);
    auto s = rules.Classify(c.name, true);
    ASSERT_TRUE(s.ok()) << c.name << ": " << s.status().ToString();
    EXPECT_EQ(*s, c.swiglu) << c.name << " (swiglu) is " << RuleName(*s);
  }
}

constexpr Rule kCol = Rule::kColumn, kSwi = Rule::kSwiglu, kRow = Rule::kRow, kVoc = Rule::kVocab,
               kRep = Rule::kReplicated, kExt = Rule::kExtraState;

TEST(Classify, LegacyNames) {
  const std::string l = "model.language_model.encoder.layers.12.";
  ExpectRules(*Rules::BuiltIn(),
              {
                  {"model.language_model.embedding.word_embeddings.weight", kVoc, kVoc},
                  {"model.language_model.embedding.position_embeddings.weight", kRep, kRep},
                  {l + "input_norm.weight", kRep, kRep},
                  {l + "input_norm.bias", kRep, kRep},
                  {l + "input_layernorm.weight", kRep, kRep},
                  {l + "self_attention.query_key_value.weight", kCol, kCol},
                  {l + "self_attention.query_key_value.bias", kCol, kCol},
                  {l + "self_attention.query_key_value._extra_state", kExt, kExt},
                  {l + "self_attention.dense.weight", kRow, kRow},
                  {l + "self_attention.dense.bias", kRep, kRep},
                  {l + "self_attention.dense._extra_state", kExt, kExt},
                  {l + "post_attention_norm.weight", kRep, kRep},
                  {l + "post_attention_layernorm.bias", kRep, kRep},
                  {l + "mlp.dense_h_to_4h.weight", kCol, kSwi},
                  {l + "mlp.dense_h_to_4h.bias", kCol, kSwi},
                  {l + "mlp.dense_4h_to_h.weight", kRow, kRow},
                  {l + "mlp.dense_4h_to_h.bias", kRep, kRep},
                  {"model.language_model.encoder.final_norm.weight", kRep, kRep},
                  {"model.language_model.encoder.final_layernorm.bias", kRep, kRep},
                  {"model.language_model.output_layer.weight", kVoc, kVoc},
                  {"model.word_embeddings_for_head.weight", kVoc, kVoc},
              });
}

TEST(Classify, McoreNames) {
  const std::string l = "model.decoder.layers.3.";
  ExpectRules(*Rules::BuiltIn(),
              {
                  {"model.embedding.word_embeddings.weight", kVoc, kVoc},
                  {"model.embedding.position_embeddings.weight", kRep, kRep},
                  {l + "input_layernorm.weight", kRep, kRep},
                  {l + "input_layernorm.bias", kRep, kRep},
                  {l + "self_attention.core_attention._extra_state", kExt, kExt},
                  {l + "self_attention.linear_proj.weight", kRow, kRow},
                  {l + "self_attention.linear_proj.bias", kRep, kRep},
                  {l + "self_attention.linear_proj._extra_state", kExt, kExt},
                  {l + "self_attention.linear_qkv.weight", kCol, kCol},
                  {l + "self_attention.linear_qkv.bias", kCol, kCol},
                  {l + "self_attention.linear_qkv.layer_norm_weight", kRep, kRep},
                  {l + "self_attention.linear_qkv.layer_norm_bias", kRep, kRep},
                  {l + "self_attention.linear_qkv._extra_state", kExt, kExt},
                  {l + "self_attention.q_layernorm.weight", kRep, kRep},
                  {l + "pre_mlp_layernorm.weight", kRep, kRep},
                  {l + "mlp.linear_fc1.weight", kCol, kSwi},
                  {l + "mlp.linear_fc1.bias", kCol, kSwi},
                  {l + "mlp.linear_fc1.layer_norm_weight", kRep, kRep},
                  {l + "mlp.linear_fc1._extra_state", kExt, kExt},
                  {l + "mlp.linear_fc2.weight", kRow, kRow},
                  {l + "mlp.linear_fc2.bias", kRep, kRep},
                  {"model.decoder.final_layernorm.weight", kRep, kRep},
                  {"model.decoder.final_layernorm.bias", kRep, kRep},
                  {"model.output_layer.weight", kVoc, kVoc},
                  {"model.output_layer._extra_state", kExt, kExt},
              });
}

TEST(Classify, MixtureOfExpertsDenseParts) {
  // The router and the shared experts' gate are replicated; the router's expert_bias is a buffer
  // passed through like extra state; the shared experts' linears follow the dense rules.
  const auto& r = *Rules::BuiltIn();
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.router.weight", true), Rule::kReplicated);
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.router.bias", true), Rule::kReplicated);
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.router.expert_bias", true), Rule::kExtraState);
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.shared_experts.gate_weight", true),
            Rule::kReplicated);
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.shared_experts.linear_fc1.weight", true),
            Rule::kSwiglu);
  EXPECT_EQ(*r.Classify("model.decoder.layers.1.mlp.shared_experts.linear_fc2.weight", true),
            Rule::kRow);
}

TEST(Classify, UnknownParameterIsAnErrorNamingIt) {
  for (const std::string name :
       {"model.decoder.layers.0.mlp.mystery_gate.weight",
        "model.decoder.layers.0.mlp.linear_fc3.weight",
        "model.language_model.encoder.layers.0.mlp.dense.weight", "model.rotary_pos_emb.inv_freq",
        "model.language_model.encoder.layers.0.self_attention.query_key_value.scale",
        "model.normal_init"}) {
    auto r = Rules::BuiltIn()->Classify(name, false);
    ASSERT_FALSE(r.ok()) << name << " is " << RuleName(*r);
    EXPECT_EQ(r.status().code(), Code::kInvalid);
    EXPECT_TRUE(Contains(r.status().message(), "'" + name + "'"));
  }
}

// ---- user rules ----

TEST(UserRules, ParseAndFirstMatchWins) {
  auto rules = Rules::Parse(
      "# my model\n"
      "\n"
      "   \\.my_proj\\.weight$    row   # trailing comment\n"
      "\\.my_[a-z]+\\.weight$ column\n"    // shadowed for my_proj by the line above
      "linear_qkv\\.weight$ replicated\n"  // overrides a built-in rule
      "gate and up swiglu\r\n"             // spaces inside the regex, CRLF
      "^exact$\tvocab\n"
      "\\.state$ extra_state");  // no final newline
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  const Rules& r = **rules;
  auto rule = [&](const std::string& name, bool swiglu = false) {
    auto x = r.Classify(name, swiglu);
    EXPECT_TRUE(x.ok()) << name << ": " << x.status().ToString();
    return x.ok() ? *x : Rule::kExtraState;
  };
  EXPECT_EQ(rule("model.x.my_proj.weight"), Rule::kRow);
  EXPECT_EQ(rule("model.x.my_fc.weight"), Rule::kColumn);
  EXPECT_EQ(rule("model.decoder.layers.0.self_attention.linear_qkv.weight"), Rule::kReplicated);
  EXPECT_EQ(rule("the gate and up proj"), Rule::kSwiglu);
  EXPECT_EQ(rule("the gate and up proj", true), Rule::kSwiglu);
  EXPECT_EQ(rule("exact"), Rule::kVocab);
  EXPECT_EQ(rule("model.foo.state"), Rule::kExtraState);
  // Names no user rule covers fall through to the built-in rules.
  EXPECT_EQ(rule("model.decoder.layers.0.self_attention.linear_qkv.bias"), Rule::kColumn);
  EXPECT_EQ(rule("model.decoder.layers.0.mlp.linear_fc1.weight", true), Rule::kSwiglu);
  auto unknown = r.Classify("not.exact", false);
  EXPECT_FALSE(unknown.ok());
  EXPECT_TRUE(Contains(unknown.status().message(), "not.exact"));
}

TEST(UserRules, EmptyFileIsTheBuiltIns) {
  auto rules = Rules::Parse("\n# nothing\n  \n");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  auto r = (*rules)->Classify("model.decoder.layers.0.mlp.linear_fc2.weight", false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, Rule::kRow);
}

TEST(UserRules, ErrorsNameTheLine) {
  struct Bad {
    std::string text;
    std::string line, detail;
  };
  for (const Bad& b : std::vector<Bad>{
           {"a column\nlonely\n", "line 2", "REGEX RULE"},
           {"# c\n\nfoo\\.weight columnar\n", "line 3", "columnar"},
           {"ok row\nfoo( column\n", "line 2", "foo("},
           {"x column\ny row\nz Column\n", "line 3", "Column"},
       }) {
    auto r = Rules::Parse(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_EQ(r.status().code(), Code::kInvalid);
    EXPECT_TRUE(Contains(r.status().message(), b.line)) << b.text;
    EXPECT_TRUE(Contains(r.status().message(), b.detail)) << b.text;
  }
}

// ---- PlanShard ----

// Source shards laid out one per source file, each after some filler bytes.
struct Sources {
  std::vector<std::string> files;
  std::vector<Shard> shards;
};
Sources Lay(const std::vector<T32>& shards) {
  Sources s;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string f(13 * i + 5, static_cast<char>(0xa0 + i));
    s.shards.push_back(Shard{static_cast<uint32_t>(i), f.size(), shards[i].shape});
    f += shards[i].Bytes();
    f += "trailing";
    s.files.push_back(std::move(f));
  }
  return s;
}


// Padded vocabulary rows for vocab 10, divisible-by 2 (Megatron's rule).
int64_t Padded(int64_t T) { return (10 + 2 * T - 1) / (2 * T) * (2 * T); }

struct Tp {
  uint32_t from, to;
};
const std::vector<Tp> kTps = {{4, 2}, {1, 4}, {2, 4}, {4, 1}, {2, 2},
                              {1, 1}, {3, 2}, {2, 3}, {4, 3}};

// Reshards `full` (the logical whole tensor; for kVocab the source's padded table) from tp.from
// to tp.to and compares every target shard with the reference.
void CheckReshard(Rule rule, const T32& full, Tp tp) {
  SCOPED_TRACE(std::string(RuleName(rule)) + " " + std::to_string(tp.from) + "->" +
               std::to_string(tp.to) + " rank-" + std::to_string(full.shape.size()));
  std::vector<T32> src;
  for (uint32_t s = 0; s < tp.from; ++s) src.push_back(RefShard(rule, full, tp.from, s));
  const Sources in = Lay(src);
  VocabSizes vocab;
  T32 target_full = full;
  if (rule == Rule::kVocab) {
    vocab.source_rows = full.shape[0];
    vocab.target_rows = Padded(tp.to);
    target_full = PadRows(full, vocab.target_rows);
  }
  for (uint32_t t = 0; t < tp.to; ++t) {
    std::vector<Gather> gathers;
    std::vector<int64_t> shape;
    Status st = PlanShard("p.weight", rule, in.shards, 4, t, tp.to, vocab, &gathers, &shape);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const T32 want = RefShard(rule, target_full, tp.to, t);
    EXPECT_EQ(shape, want.shape) << "shard " << t;
    EXPECT_EQ(Expand(in.files, gathers), want.Bytes()) << "shard " << t;
    ASSERT_FALSE(gathers.empty());
    ASSERT_FALSE(gathers[0].parts.empty());
    if (rule != Rule::kVocab) {
      // The first element's source shard: where a split tensor's unsplit state comes from.
      EXPECT_EQ(FirstSourceRank(rule, tp.from, t, tp.to), gathers[0].parts[0].source)
          << "shard " << t;
    }
  }
}

TEST(PlanShard, ColumnMatchesReference) {
  for (Tp tp : kTps) {
    CheckReshard(Rule::kColumn, Iota({24, 3}, 1000), tp);
    CheckReshard(Rule::kColumn, Iota({24, 2, 3}, 5000), tp);
    CheckReshard(Rule::kColumn, Iota({24}, 7), tp);  // a bias
  }
}

TEST(PlanShard, RowMatchesReference) {
  for (Tp tp : kTps) {
    CheckReshard(Rule::kRow, Iota({3, 24}, 1000), tp);
    CheckReshard(Rule::kRow, Iota({2, 12, 3}, 5000), tp);
    CheckReshard(Rule::kRow, Iota({1, 12}, 9), tp);
  }
}

TEST(PlanShard, SwigluMatchesReference) {
  for (Tp tp : kTps) {
    CheckReshard(Rule::kSwiglu, Iota({24, 3}, 1000), tp);  // gate 12 rows, up 12 rows
    CheckReshard(Rule::kSwiglu, Iota({48}, 1), tp);        // a bias
  }
}

TEST(PlanShard, SwigluKeepsGateAndUpApart) {
  // Gate values < 100, up values >= 100: every target shard is [gate_t; up_t].
  T32 full = Iota({8, 2}, 0);
  for (size_t i = 8; i < 16; ++i) full.v[i] += 100;
  const Sources in =
      Lay({RefShard(Rule::kSwiglu, full, 2, 0), RefShard(Rule::kSwiglu, full, 2, 1)});
  std::vector<Gather> g;
  std::vector<int64_t> shape;
  ASSERT_TRUE(PlanShard("fc1", Rule::kSwiglu, in.shards, 4, 1, 4, {}, &g, &shape).ok());
  EXPECT_EQ(shape, (std::vector<int64_t>{2, 2}));
  const std::string b = Expand(in.files, g);
  std::vector<uint32_t> got(b.size() / 4);
  std::memcpy(got.data(), b.data(), b.size());
  EXPECT_EQ(got, (std::vector<uint32_t>{2, 3, 110, 111}));
}

TEST(PlanShard, VocabCutsAndPads) {
  // vocab 10, divisible by 2: padded rows 10 (TP 1), 12 (TP 2, 3), 16 (TP 4).
  for (Tp tp : kTps) {
    CheckReshard(Rule::kVocab, Iota({Padded(tp.from), 3}, 1000), tp);
  }
}

TEST(PlanShard, VocabPaddingRepeatsTheLastRowWithOneGather) {
  // TP 1 -> 4: 10 rows become 16; shard 3 is rows 12..15, all copies of row 9.
  const T32 full = Iota({10, 3}, 0);
  const Sources in = Lay({full});
  std::vector<Gather> g;
  std::vector<int64_t> shape;
  ASSERT_TRUE(
      PlanShard("emb", Rule::kVocab, in.shards, 4, 3, 4, VocabSizes{10, 16}, &g, &shape).ok());
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 3}));
  ASSERT_EQ(g.size(), 1u) << "a repeat is one stride-0 gather";
  EXPECT_EQ(g[0].rows, 4u);
  ASSERT_EQ(g[0].parts.size(), 1u);
  EXPECT_EQ(g[0].parts[0].stride, 0u);
  EXPECT_EQ(g[0].parts[0].offset, in.shards[0].offset + 9 * 12);
  // Shard 2: rows 8, 9 then 9 twice more: a range, then one repeat.
  ASSERT_TRUE(
      PlanShard("emb", Rule::kVocab, in.shards, 4, 2, 4, VocabSizes{10, 16}, &g, &shape).ok());
  EXPECT_EQ(Expand(in.files, g), RefShard(Rule::kVocab, PadRows(full, 16), 4, 2).Bytes());
  EXPECT_LE(g.size(), 2u);
}

// docs/views.md: state that is not split comes "from the source shard that holds the target
// shard's first element". With vocabulary padding the target's rows are not at the same fraction
// of the axis as the source's.
TEST(PlanShard, FirstSourceRankHoldsTheFirstVocabRow) {
  for (Tp tp : kTps) {
    const T32 full = Iota({Padded(tp.from), 3}, 0);
    std::vector<T32> src;
    for (uint32_t s = 0; s < tp.from; ++s) src.push_back(Chunk(full, 0, tp.from, s));
    const Sources in = Lay(src);
    for (uint32_t t = 0; t < tp.to; ++t) {
      std::vector<Gather> g;
      std::vector<int64_t> shape;
      ASSERT_TRUE(PlanShard("emb", Rule::kVocab, in.shards, 4, t, tp.to,
                            VocabSizes{Padded(tp.from), Padded(tp.to)}, &g, &shape)
                      .ok());
      EXPECT_EQ(FirstSourceRank(Rule::kVocab, tp.from, t, tp.to,
                                VocabSizes{Padded(tp.from), Padded(tp.to)}),
                g[0].parts[0].source)
          << "TP " << tp.from << "->" << tp.to << " shard " << t << " (rows " << Padded(tp.from)
          << "->" << Padded(tp.to) << ")";
    }
  }
}

TEST(PlanShard, ReplicatedAndExtraStateCopyRankZero) {
  const Sources in = Lay({Iota({3, 5}, 0), Iota({2}, 100)});  // rank 1's need not agree
  for (Rule r : {Rule::kReplicated, Rule::kExtraState}) {
    for (uint32_t t = 0; t < 3; ++t) {
      std::vector<Gather> g;
      std::vector<int64_t> shape;
      ASSERT_TRUE(PlanShard("n", r, in.shards, 4, t, 3, {}, &g, &shape).ok());
      EXPECT_EQ(shape, (std::vector<int64_t>{3, 5}));
      EXPECT_EQ(Expand(in.files, g), Iota({3, 5}, 0).Bytes());
      EXPECT_EQ(FirstSourceRank(r, 2, t, 3), 0u);
    }
  }
  // A scalar.
  const Sources scalar = Lay({Iota({}, 42)});
  std::vector<Gather> g;
  std::vector<int64_t> shape;
  ASSERT_TRUE(PlanShard("s", Rule::kReplicated, scalar.shards, 4, 0, 2, {}, &g, &shape).ok());
  EXPECT_TRUE(shape.empty());
  EXPECT_EQ(Expand(scalar.files, g), Iota({}, 42).Bytes());
}

// ---- PlanShard errors ----

Status Plan(Rule rule, const std::vector<std::vector<int64_t>>& shapes, uint32_t T,
            VocabSizes vocab = {}) {
  std::vector<Shard> src;
  for (size_t i = 0; i < shapes.size(); ++i)
    src.push_back(Shard{static_cast<uint32_t>(i), 0, shapes[i]});
  std::vector<Gather> g;
  std::vector<int64_t> shape;
  return PlanShard("model.the.param", rule, src, 2, 0, T, vocab, &g, &shape);
}

void ExpectInvalid(const Status& st, const std::string& detail) {
  EXPECT_EQ(st.code(), Code::kInvalid) << st.ToString();
  EXPECT_TRUE(Contains(st.message(), "model.the.param"));
  EXPECT_TRUE(Contains(st.message(), detail));
}

TEST(PlanShard, IndivisibleSizesAreErrors) {
  ExpectInvalid(Plan(Rule::kColumn, {{6, 3}}, 4), "not divisible by TP 4");
  ExpectInvalid(Plan(Rule::kColumn, {{3, 8}, {3, 8}}, 4), "not divisible by TP 4");
  ExpectInvalid(Plan(Rule::kRow, {{8, 6}}, 4), "not divisible by TP 4");
  ExpectInvalid(Plan(Rule::kRow, {{8, 3}, {8, 3}}, 4), "not divisible by TP 4");
  ExpectInvalid(Plan(Rule::kSwiglu, {{12, 3}}, 4), "not divisible by TP 4");  // halves of 6
  ExpectInvalid(Plan(Rule::kSwiglu, {{5, 3}, {5, 3}}, 1), "SwiGLU");          // odd shards
  ExpectInvalid(Plan(Rule::kVocab, {{8, 3}, {8, 3}}, 4, VocabSizes{16, 18}), "not divisible");
  EXPECT_TRUE(Plan(Rule::kColumn, {{6, 3}}, 3).ok());
  EXPECT_TRUE(Plan(Rule::kVocab, {{8, 3}, {8, 3}}, 3, VocabSizes{16, 18}).ok());
}

TEST(PlanShard, InconsistentShardsAreErrors) {
  ExpectInvalid(Plan(Rule::kColumn, {{4, 3}, {5, 3}}, 1), "different shapes");
  ExpectInvalid(Plan(Rule::kRow, {{4, 3}, {4, 3, 1}}, 1), "different shapes");
  ExpectInvalid(Plan(Rule::kRow, {{12}}, 1), "too few dimensions");
  ExpectInvalid(Plan(Rule::kColumn, {{}}, 1), "too few dimensions");
  ExpectInvalid(Plan(Rule::kVocab, {{8, 3}, {8, 3}}, 2, VocabSizes{10, 12}), "10");
  ExpectInvalid(Plan(Rule::kColumn, {}, 1), "no source shard");
}

}  // namespace
}  // namespace ckptfs::reshard
