// ListTorchDistTensors on torch_dist metadata built in memory: the experts' tensors (an expert
// axis after the layer axis, or first in per-layer keys) taken apart into one tensor per layer
// and expert, named as SequentialMLP's in a rank file, each shard at its chunk's bytes; chunks
// spanning several experts (the legacy GroupedMLP's); and the refusals (docs/views.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "reshard/megatron_dist.h"
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: the torch file builders

using pickle::ValuePtr;

ValuePtr Kv(const ValuePtr& d, const std::string& k, ValuePtr v) {
  d->pairs.emplace_back(pickle::MakeStr(k), std::move(v));
  return d;
}

// common.pt of a model with `layers` layers, hidden 4, `experts` experts (TP 2, EP 2); `extra`
// adds integer args.
TorchFile Common(int64_t layers, int64_t experts,
                 const std::vector<std::pair<std::string, int64_t>>& extra = {}) {
  auto args = std::make_shared<pickle::Value>(
      *pickle::MakeCall(pickle::MakeGlobal("argparse", "Namespace"), pickle::MakeTuple({})));
  args->state = pickle::MakeDict({});
  std::map<std::string, int64_t> a = {
      {"num_layers", layers}, {"hidden_size", 4}, {"num_attention_heads", 2},
      {"ffn_hidden_size", 8}, {"tensor_model_parallel_size", 2}, {"num_experts", experts},
      {"moe_ffn_hidden_size", 2}, {"expert_model_parallel_size", 2}};
  for (const auto& [k, v] : extra) a[k] = v;
  for (const auto& [k, v] : a) Kv(args->state, k, pickle::MakeInt(v));
  Kv(args->state, "swiglu", pickle::MakeBool(true));
  ValuePtr root = pickle::MakeDict({});
  Kv(root, "args", args);
  FileBuilder fb;
  auto tf = Parse(fb.Write(root, "common"));
  EXPECT_TRUE(tf.ok()) << tf.status().ToString();
  return std::move(tf).value();
}

// A chunk to add: its place in the tensor, and the data file holding it.
struct ChunkSpec {
  std::vector<int64_t> offsets, sizes;
  std::string rel = "__0_0.distcp";
};

// .metadata and the data files' descriptions, float32 chunks laid back to back in each file.
struct Dcp {
  dcp::Metadata md;
  std::vector<DcpDataFile> files;
  std::map<std::string, uint64_t> end;  // bytes used in each file

  // Tensor `fqn` of global shape `size` and its chunks, in the order given; returns each
  // chunk's byte offset in its file.
  std::vector<uint64_t> Add(const std::string& fqn, const std::vector<int64_t>& size,
                            const std::vector<ChunkSpec>& chunks) {
    dcp::TensorEntry t{fqn, "float32", size, false, {}};
    std::vector<uint64_t> at;
    for (const ChunkSpec& c : chunks) {
      DcpDataFile* f = nullptr;
      for (DcpDataFile& x : files) {
        if (x.relative_path == c.rel) f = &x;
      }
      if (!f) {
        files.push_back(DcpDataFile{c.rel, static_cast<uint32_t>(files.size()), {}});
        f = &files.back();
      }
      uint64_t len = 4;
      for (int64_t x : c.sizes) len *= static_cast<uint64_t>(x);
      at.push_back(end[c.rel]);
      t.chunks.push_back(dcp::Chunk{c.offsets, c.sizes, dcp::StorageRef{c.rel, end[c.rel], len, {}}});
      f->desc.tensors.push_back(TensorInfo{fqn, "float32", c.sizes, {}, end[c.rel], len, size,
                                           c.offsets});
      end[c.rel] += len;
    }
    md.tensors.push_back(std::move(t));
    return at;
  }
};

const MegatronTensor* Find(const MegatronTensors& ts, const std::string& name) {
  for (const MegatronTensor& t : ts.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

TEST(TorchDistExperts, StackedExpertsBecomeOneTensorPerLayerAndExpert) {
  // L 2, E 4, F 2, H 4, expert TP 2: fc1 [L, E, 2F, H] in (gate, up) x TP chunks of one row,
  // fc2 [L, E, H, F] in TP column chunks, the router [L, E, H] one chunk per layer.
  Dcp d;
  d.Add("decoder.layers.mlp.router.weight", {2, 4, 4},
        {{{0, 0, 0}, {1, 4, 4}}, {{1, 0, 0}, {1, 4, 4}}});
  // EP rank x / 2, TP rank r % 2 writes __{r % 2 + 2 * (x / 2)}_0.distcp.
  auto rel = [](int64_t x, int64_t r) {
    return "__" + std::to_string(r % 2 + 2 * (x / 2)) + "_0.distcp";
  };
  std::vector<ChunkSpec> fc1, fc2;
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t x = 0; x < 4; ++x) {
      for (int64_t r = 0; r < 4; ++r) fc1.push_back({{l, x, r, 0}, {1, 1, 1, 4}, rel(x, r)});
      for (int64_t r = 0; r < 2; ++r) fc2.push_back({{l, x, 0, r}, {1, 1, 4, 1}, rel(x, r)});
    }
  }
  const auto fc1_at = d.Add("decoder.layers.mlp.experts.experts.linear_fc1.weight",
                            {2, 4, 4, 4}, fc1);
  const auto fc2_at = d.Add("decoder.layers.mlp.experts.experts.linear_fc2.weight",
                            {2, 4, 4, 2}, fc2);
  auto ts = ListTorchDistTensors(Common(2, 4), d.md, d.files);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  EXPECT_EQ(ts->tensors.size(), 2u * (1 + 4 + 4));
  for (int64_t l = 0; l < 2; ++l) {
    const std::string layer = "decoder.layers." + std::to_string(l) + ".mlp.";
    const MegatronTensor* router = Find(*ts, layer + "router.weight");
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->expert, -1);
    EXPECT_EQ(router->shards.size(), 1u);
    EXPECT_EQ(router->shards[0].shape, (std::vector<int64_t>{4, 4}));
    for (int64_t x = 0; x < 4; ++x) {
      const std::string ex = layer + "experts.local_experts." + std::to_string(x) + ".";
      const MegatronTensor* fc1 = Find(*ts, ex + "linear_fc1.weight");
      ASSERT_NE(fc1, nullptr) << ex;
      EXPECT_EQ(fc1->layer, l);
      EXPECT_EQ(fc1->expert, x);
      EXPECT_TRUE(fc1->gate_up_whole);
      EXPECT_EQ(fc1->rule, Rule::kColumn);
      ASSERT_EQ(fc1->shards.size(), 4u);
      for (int64_t r = 0; r < 4; ++r) {
        const Shard& s = fc1->shards[static_cast<size_t>(r)];
        EXPECT_EQ(s.shape, (std::vector<int64_t>{1, 4}));
        EXPECT_EQ(s.offset, fc1_at[static_cast<size_t>((l * 4 + x) * 4 + r)]);
        EXPECT_EQ(d.files[s.source].relative_path, rel(x, r));
      }
      const MegatronTensor* fc2 = Find(*ts, ex + "linear_fc2.weight");
      ASSERT_NE(fc2, nullptr) << ex;
      EXPECT_FALSE(fc2->gate_up_whole);
      EXPECT_EQ(fc2->rule, Rule::kRow);
      ASSERT_EQ(fc2->shards.size(), 2u);
      EXPECT_EQ(fc2->shards[1].offset, fc2_at[static_cast<size_t>((l * 4 + x) * 2 + 1)]);
      EXPECT_EQ(d.files[fc2->shards[1].source].relative_path, rel(x, 1));
    }
  }
  // Layer by layer: layer 0's tensors all come before layer 1's.
  EXPECT_EQ(ts->tensors[8].layer, 0);
  EXPECT_EQ(ts->tensors[9].layer, 1);
}

TEST(TorchDistExperts, AChunkOfSeveralExpertsIsCutPerExpert) {
  // The legacy GroupedMLP: EP rank e's two experts in one chunk [1, 2, rows, H], TP 1.
  Dcp d;
  std::vector<ChunkSpec> chunks;
  for (int64_t e = 0; e < 2; ++e) {
    for (int64_t half = 0; half < 2; ++half) chunks.push_back({{0, 2 * e, 2 * half, 0}, {1, 2, 2, 4}});
  }
  const auto at = d.Add("decoder.layers.mlp.experts.experts.linear_fc1.weight", {1, 4, 4, 4},
                        chunks);
  auto ts = ListTorchDistTensors(Common(1, 4), d.md, d.files);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  ASSERT_EQ(ts->tensors.size(), 4u);
  for (int64_t x = 0; x < 4; ++x) {
    const MegatronTensor& t = ts->tensors[static_cast<size_t>(x)];
    EXPECT_EQ(t.name, "decoder.layers.0.mlp.experts.local_experts." + std::to_string(x) +
                          ".linear_fc1.weight");
    EXPECT_EQ(t.expert, x);
    ASSERT_EQ(t.shards.size(), 2u);  // its gate rows, its up rows
    const uint64_t block = 2 * 4 * 4;  // one expert's [2, 4] float32 rows in the chunk
    for (int64_t half = 0; half < 2; ++half) {
      EXPECT_EQ(t.shards[static_cast<size_t>(half)].offset,
                at[static_cast<size_t>(2 * (x / 2) + half)] + static_cast<uint64_t>(x % 2) * block);
      EXPECT_EQ(t.shards[static_cast<size_t>(half)].shape, (std::vector<int64_t>{2, 4}));
    }
  }
}

TEST(TorchDistExperts, PerLayerKeysHaveTheExpertAxisFirst) {
  Dcp d;
  std::vector<ChunkSpec> chunks;
  for (int64_t x = 0; x < 4; ++x) chunks.push_back({{x, 0, 0}, {1, 4, 2}});
  d.Add("decoder.layers.1.mlp.experts.experts.linear_fc2.weight", {4, 4, 2}, chunks);
  d.Add("decoder.layers.0.mlp.linear_fc2.weight", {4, 8}, {{{0, 0}, {4, 8}}});
  auto ts = ListTorchDistTensors(Common(2, 4), d.md, d.files);
  ASSERT_TRUE(ts.ok()) << ts.status().ToString();
  ASSERT_EQ(ts->tensors.size(), 5u);
  EXPECT_EQ(ts->tensors[0].name, "decoder.layers.0.mlp.linear_fc2.weight");
  EXPECT_EQ(ts->tensors[0].expert, -1);
  EXPECT_EQ(ts->tensors[4].name, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight");
  EXPECT_EQ(ts->tensors[4].layer, 1);
  EXPECT_EQ(ts->tensors[4].expert, 3);
  EXPECT_EQ(ts->tensors[4].shards[0].shape, (std::vector<int64_t>{4, 2}));
}

TEST(TorchDistExperts, RefusesWithTheReason) {
  auto refused = [](const std::string& fqn, std::vector<int64_t> size, std::string why,
                    int64_t experts = 4) {
    Dcp d;
    std::vector<int64_t> offsets(size.size(), 0);
    d.Add(fqn, size, {{offsets, size}});
    auto ts = ListTorchDistTensors(Common(1, experts), d.md, d.files);
    ASSERT_FALSE(ts.ok()) << fqn;
    EXPECT_TRUE(Contains(ts.status().message(), why));
  };
  refused("decoder.layers.0.mlp.experts.experts.3.linear_fc2.weight", {4, 2},
          "singleton_local_shards");
  refused("decoder.layers.0.mlp.linear_fc1.weight_w", {8, 4}, "separate _w and _v tensors");
  refused("decoder.layers.mlp.experts.experts.linear_fc2.weight", {1, 8, 4, 2},
          "not stacked over the model's 1 layers and 4 experts");
  refused("decoder.layers.mlp.experts.experts.linear_fc2.weight", {1, 4, 4, 2},
          "args.num_experts is 0", 0);
  // An expert without a chunk.
  Dcp d;
  d.Add("decoder.layers.0.mlp.experts.experts.linear_fc2.weight", {4, 4, 2},
        {{{0, 0, 0}, {3, 4, 2}}});
  auto ts = ListTorchDistTensors(Common(1, 4), d.md, d.files);
  ASSERT_FALSE(ts.ok());
  EXPECT_TRUE(Contains(ts.status().message(), "has no chunk of expert 3 in layer 0"));
}

TEST(TorchDistExperts, RankFileLayoutsDoNotMatterHere) {
  // Expert TP other than TP, one grouped weight, the distributed optimizer: how rank files are
  // laid out, refused there; torch_dist holds the same global tensors whatever they were.
  const std::vector<std::pair<std::string, int64_t>> args = {
      {"expert_tensor_parallel_size", 1}, {"moe_single_grouped_weight", 1},
      {"use_distributed_optimizer", 1}};
  const TorchFile common = Common(1, 4, args);
  EXPECT_FALSE(ReadMegatronModel(common).ok());
  auto m = ReadMegatronModel(common, /*torch_dist=*/true);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->torch_dist);
  Dcp d;
  auto ts = ListTorchDistTensors(common, d.md, d.files);
  EXPECT_TRUE(ts.ok()) << ts.status().ToString();
  // Interleaved GLU halves change the global tensors: refused in both.
  const TorchFile interleaved = Common(1, 4, {{"moe_mlp_glu_interleave_size", 8}});
  auto refused = ReadMegatronModel(interleaved, /*torch_dist=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "interleaved"));
}

}  // namespace
}  // namespace ckptfs::reshard
