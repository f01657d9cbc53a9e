// PlanDeepSpeed end to end on tiny ZeRO stage 1/2 checkpoints built in memory in DeepSpeed's
// layout (docs/views.md; tests/reshard/deepspeed_fixture.py is the full-size Python twin):
// a view for a new data-parallel size must equal, value for value, the files the same model
// saved at that size has; the universal view must hold every parameter's full state, for ZeRO
// stage 3 sources too. Also the refusals: a missing optimizer file, a stage 3 optimizer file
// without stage 3 model states, elastic checkpoints, inconsistent partitions.
#include "reshard/deepspeed.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "reshard/deepspeed_internal.h"  // ds::Numel
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: tensors, file builders and their helpers

using pickle::Kind;
using pickle::ValuePtr;

// How a parameter is cut over TP ranks (Megatron-DeepSpeed's patterns).
enum class Cut { kCat0, kRow, kReplicated, kTwoSub, kVocab, kSubParams };

struct P {
  std::string name;
  std::vector<int64_t> shape;  // the full tensor's
  Cut cut = Cut::kCat0;
  // kSubParams (parameter_with_sub_params): the sub-parameters' sizes along dimension `dim`.
  std::vector<int64_t> subs = {};
  size_t dim = 0;
};

struct Model {
  std::vector<std::vector<P>> groups;
  int64_t T = 1;
  int64_t vocab = -1;  // original_vocab_size: the vocabulary parameter's real rows
  Model WithT(int64_t t) const {
    Model m = *this;
    m.T = t;
    return m;
  }
};

// Megatron's vocabulary padding for TP T (make_vocab_size_divisible_by 2).
int64_t PaddedVocab(const Model& m) { return (m.vocab + 2 * m.T - 1) / (2 * m.T) * (2 * m.T); }

// Two groups whose sizes are not multiples of 2 * dp: padding on the last rank(s), and at
// dp 4 a whole trailing rank of group 1 is padding.
const Model kPlain = {{{{"embed.weight", {3, 5}}, {"layers.0.w", {7}}},
                       {{"layers.0.norm", {4}}, {"head.bias", {1}}}}};

// TP 2 with universal_checkpoint_info: a vocabulary of 10 rows (padded with zero rows for T),
// column, row, replicated and SwiGLU (two sub-parameters) parameters, and sub-parameters of
// unequal sizes along dimension 0 (grouped-query attention's q, k, v) and along dimension 1.
const Model kTp2 = {{{{"embed.weight", {10, 3}, Cut::kVocab},
                      {"layers.0.qkv.weight", {8, 3}},
                      {"layers.0.proj.weight", {3, 8}, Cut::kRow},
                      {"layers.0.fc1.weight", {8, 3}, Cut::kTwoSub},
                      {"layers.0.gqa.weight", {16, 3}, Cut::kSubParams, {8, 4, 4}, 0},
                      {"layers.0.mix.weight", {3, 12}, Cut::kSubParams, {4, 8}, 1}},
                     {{"layers.0.norm.weight", {3}, Cut::kReplicated}, {"layers.0.qkv.bias", {8}}}},
                    2,
                    10};

// The full value of state `key` ("module": the weights) of parameter p: distinct per key,
// parameter and element; the vocabulary's padding rows for m.T are zero.
T32 FullTensor(const Model& m, const std::string& key, const std::string& param) {
  const uint32_t k = key == "fp32" ? 1 : key == "exp_avg" ? 2 : key == "exp_avg_sq" ? 3 : 4;
  uint32_t i = 0;
  for (const auto& g : m.groups) {
    for (const P& p : g) {
      if (p.name == param) {
        T32 x = Iota(p.shape, k * 1000000 + i * 10000);
        if (p.cut == Cut::kVocab) {
          x.v.resize(static_cast<size_t>(PaddedVocab(m) * p.shape[1]), 0);
          x.shape[0] = PaddedVocab(m);
        }
        return x;
      }
      ++i;
    }
  }
  ADD_FAILURE() << "no parameter " << param;
  return {};
}

// TP rank t's slice of parameter p.
T32 SliceOf(const Model& m, const P& p, const T32& full, int64_t t) {
  switch (p.cut) {
    case Cut::kCat0:
    case Cut::kVocab:
      return Chunk(full, 0, m.T, t);
    case Cut::kRow:
      return Chunk(full, 1, m.T, t);
    case Cut::kTwoSub:
      return RefShard(Rule::kSwiglu, full, m.T, t);
    case Cut::kReplicated:
      return full;
    case Cut::kSubParams: {
      T32 out;
      int64_t at = 0;
      for (int64_t sub : p.subs) {
        T32 x = Chunk(Slice(full, p.dim, at, at + sub), p.dim, m.T, t);
        out = out.shape.empty() ? x : Cat(out, x, p.dim);
        at += sub;
      }
      return out;
    }
  }
  return full;
}

// parameter_with_sub_params' entry of p: {patterns, shape (sizes, a tuple of them at p.dim),
// partition_dim}.
ValuePtr SubParamsEntry(const P& p);

// What the universal view's file of p holds: the full tensor (the vocabulary cut to its rows).
T32 UniversalOf(const Model& m, const P& p, const T32& full) {
  return p.cut == Cut::kVocab ? Slice(full, 0, 0, m.vocab) : full;
}

struct Options {
  bool missing_optim = false, zero3 = false, elastic = false, short_fp32 = false;
  // Entries of universal_checkpoint_info that replace (or join) the model's.
  std::vector<std::pair<std::string, pickle::ValuePtr>> uc = {};
};

ValuePtr S(const std::string& s) { return pickle::MakeStr(s); }
ValuePtr I(int64_t i) { return pickle::MakeInt(i); }

ValuePtr Size(const std::vector<int64_t>& shape) {
  return pickle::MakeCall(pickle::MakeGlobal("torch", "Size"),
                          pickle::MakeTuple({IntTuple(shape)}));
}
ValuePtr Obj(const std::string& module, const std::string& name,
             std::vector<std::pair<ValuePtr, ValuePtr>> state) {
  auto v = pickle::MakeCall(pickle::MakeGlobal("copyreg", "_reconstructor"),
                            pickle::MakeTuple({pickle::MakeGlobal(module, name),
                                               pickle::MakeGlobal("builtins", "object"),
                                               pickle::MakeNone()}));
  v->state = pickle::MakeDict(std::move(state));
  return v;
}

const std::vector<std::pair<std::string, std::string>> kExtra = {{"version", "3\n"}};

// The tag directory of the model saved at data-parallel size D, as DeepSpeed lays it out.
struct Source {
  std::vector<std::string> bytes;  // by source index
  DeepSpeedSource src;
  void Add(const std::string& name, std::string b) {
    auto f = Parse(b);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status().ToString();
    DsSourceFile sf;
    sf.name = name;
    sf.source = static_cast<uint32_t>(bytes.size());
    sf.size = b.size();
    sf.file = std::make_shared<const TorchFile>(std::move(f).value());
    sf.extra_records = kExtra;
    bytes.push_back(std::move(b));
    src.files.push_back(std::move(sf));
  }
};

ValuePtr StrList(const std::vector<std::string>& xs) {
  std::vector<ValuePtr> items;
  for (const auto& x : xs) items.push_back(S(x));
  return pickle::MakeList(std::move(items));
}

ValuePtr SubParamsEntry(const P& p) {
  std::vector<ValuePtr> shape, subs;
  for (int64_t x : p.subs) subs.push_back(I(x));
  for (size_t d = 0; d < p.shape.size(); ++d) {
    shape.push_back(d == p.dim ? pickle::MakeTuple(subs) : I(p.shape[d]));
  }
  return pickle::MakeDict({{S("patterns"), StrList({R"(layers\.\d+\.)" + p.name.substr(9)})},
                           {S("shape"), pickle::MakeTuple(shape)},
                           {S("partition_dim"), I(static_cast<int64_t>(p.dim))}});
}

// The SubparamShape object the universal files hold for p.
ValuePtr SubparamShape(const P& p) {
  auto v = std::make_shared<pickle::Value>();
  v->kind = Kind::kObject;
  v->op = pickle::ObjectOp::kNewObj;
  v->callable = pickle::MakeGlobal("deepspeed.checkpoint.universal_checkpoint", "SubparamShape");
  v->args = pickle::MakeTuple({});
  ValuePtr e = SubParamsEntry(p);
  v->state = pickle::MakeDict(e->pairs);
  return v;
}

std::string TwoDigits(int64_t t) { return (t < 10 ? "0" : "") + std::to_string(t); }

Source Build(int64_t D, Options o = {}, const Model& m = kPlain) {
  Source s;
  s.src.tag = "global_step10";
  for (int64_t t = 0; t < m.T; ++t) {
    // Every group's flat buffer of TP rank t: its parameters' slices, one after another.
    std::vector<std::map<std::string, T32>> flats(m.groups.size());
    for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
      for (size_t g = 0; g < m.groups.size(); ++g) {
        T32 flat{{0}, {}};
        for (const P& p : m.groups[g]) {
          T32 x = SliceOf(m, p, FullTensor(m, key, p.name), t);
          flat.v.insert(flat.v.end(), x.v.begin(), x.v.end());
        }
        flat.shape[0] = static_cast<int64_t>(flat.v.size());
        flats[g][key] = flat;
      }
    }
    auto total = [&](size_t g) { return flats[g]["fp32"].shape[0]; };
    auto shape_of = [&](const P& p) { return SliceOf(m, p, FullTensor(m, "fp32", p.name), t).shape; };
    // Model states: the module's tensors view one flat buffer per group.
    {
      FileBuilder fb;
      auto module = OrderedDict();
      std::vector<ValuePtr> shapes;
      for (size_t g = 0; g < m.groups.size(); ++g) {
        const int64_t align = 2 * D, padded = (total(g) + align - 1) / align * align;
        T32 flat{{padded}, {}};
        for (const P& p : m.groups[g]) {
          T32 x = SliceOf(m, p, FullTensor(m, "module", p.name), t);
          flat.v.insert(flat.v.end(), x.v.begin(), x.v.end());
        }
        flat.v.resize(static_cast<size_t>(padded), 0);
        fb.storages.push_back(flat.Bytes());
        auto shape_map = OrderedDict();
        int64_t off = 0;
        for (const P& p : m.groups[g]) {
          const auto shape = shape_of(p);
          module->dict_items.push_back({S(p.name), fb.View(fb.storages.size() - 1, off, shape)});
          shape_map->dict_items.push_back({S(p.name), Size(shape)});
          off += SliceOf(m, p, FullTensor(m, "fp32", p.name), t).v.size();
        }
        shapes.push_back(shape_map);
      }
      std::vector<std::pair<ValuePtr, ValuePtr>> root = {
          {S("module"), module},
          {S("optimizer"), pickle::MakeNone()},
          {S("param_shapes"), pickle::MakeList(shapes)},
          {S("dp_world_size"), I(D)},
          {S("mp_world_size"), I(m.T)},
          {S("ds_version"), S("0.16.5")}};
      if (m.vocab >= 0) {
        root.insert(root.begin(),
                    {S("args"), Obj("argparse", "Namespace",
                                    {{S("tensor_model_parallel_size"), I(m.T)},
                                     {S("make_vocab_size_divisible_by"), I(2)},
                                     {S("padded_vocab_size"), I(PaddedVocab(m))}})});
        std::vector<std::pair<ValuePtr, ValuePtr>> uc =
                 {{S("universal_checkpoint_version"), pickle::MakeFloat(0.2)},
                  {S("original_vocab_size"), I(m.vocab)},
                  {S("padded_vocab_size"), I(PaddedVocab(m))},
                  {S("vocabulary_parameter_patterns"), StrList({"embed.weight"})},
                  {S("tp_replicated_parameter_patterns"), StrList({R"(layers.\d+.norm.weight)"})},
                  {S("parameter_with_row_parallelism_patterns"),
                   StrList({R"(layers.\d+.proj.weight)"})},
                  {S("parameter_with_2_sub_params_cat_dim_0"),
                   StrList({R"(layers.\d+.fc1.weight)"})},
                  {S("parameter_with_sub_params"),
                   pickle::MakeList({SubParamsEntry(m.groups[0][4]),
                                     SubParamsEntry(m.groups[0][5])})}};
        for (const auto& [key, value] : o.uc) {
          auto at = std::find_if(uc.begin(), uc.end(),
                                 [&k = key](const auto& kv) { return kv.first->str == k; });
          if (at == uc.end()) {
            uc.push_back({S(key), value});
          } else {
            at->second = value;
          }
        }
        root.push_back({S("universal_checkpoint_info"), pickle::MakeDict(std::move(uc))});
      }
      const std::string name = "mp_rank_" + TwoDigits(t) + "_model_states";
      s.Add(name + ".pt", fb.Write(pickle::MakeDict(root), name));
    }
    for (int64_t d = 0; d < D; ++d) {
      if (o.missing_optim && d == D - 1) continue;
      FileBuilder fb;
      std::vector<ValuePtr> fp32, paddings, counts, mappings, groups;
      auto state = pickle::MakeDict({});
      for (size_t g = 0; g < m.groups.size(); ++g) {
        const int64_t align = 2 * D, psize = (total(g) + align - 1) / align * align / D;
        const int64_t lo = d * psize;
        const int64_t real = std::max<int64_t>(0, std::min(total(g), lo + psize) - lo);
        auto partition = [&](const std::string& key) {
          T32 x{{psize}, std::vector<uint32_t>(static_cast<size_t>(psize), 0)};
          for (int64_t i = 0; i < real; ++i) {
            x.v[static_cast<size_t>(i)] = flats[g][key].v[static_cast<size_t>(lo + i)];
          }
          return x;
        };
        fb.storages.push_back(partition("fp32").Bytes());
        fp32.push_back(fb.View(fb.storages.size() - 1, 0, {real - (o.short_fp32 ? 1 : 0)}));
        state->pairs.push_back(
            {I(static_cast<int64_t>(g)),
             pickle::MakeDict({{S("step"), I(10)},
                               {S("exp_avg"), fb.Tensor(partition("exp_avg"))},
                               {S("exp_avg_sq"), fb.Tensor(partition("exp_avg_sq"))}})});
        paddings.push_back(I(psize - real));
        counts.push_back(I(D));
        auto mp = OrderedDict();
        int64_t off = 0;
        for (const P& p : m.groups[g]) {
          const int64_t n = static_cast<int64_t>(SliceOf(m, p, FullTensor(m, "fp32", p.name), t).v.size());
          const int64_t a = std::max(off, lo), b = std::min(off + n, lo + psize);
          if (a < b) {
            mp->dict_items.push_back(
                {S(p.name), Obj("deepspeed.utils.tensor_fragment", "fragment_address",
                                {{S("numel"), I(b - a)}, {S("start"), I(a - lo)}})});
          }
          off += n;
        }
        mappings.push_back(mp);
        groups.push_back(pickle::MakeDict({{S("lr"), pickle::MakeFloat(0.001)},
                                           {S("weight_decay"), pickle::MakeFloat(g ? 0.0 : 0.1)},
                                           {S("params"), pickle::MakeList({I(int64_t(g))})}}));
      }
      ValuePtr base = o.elastic ? pickle::MakeList({})
                                : pickle::MakeDict({{S("state"), state},
                                                    {S("param_groups"), pickle::MakeList(groups)}});
      auto stage = pickle::MakeCall(
          pickle::MakeGlobal("deepspeed.runtime.zero.config", "ZeroStageEnum"),
          pickle::MakeTuple({I(o.zero3 ? 3 : 2)}));
      auto osd = pickle::MakeDict(
          {{S("loss_scaler"), Obj("deepspeed.runtime.fp16.loss_scaler", "LossScaler",
                                  {{S("cur_scale"), pickle::MakeFloat(1.0)},
                                   {S("dynamic"), pickle::MakeBool(false)}})},
           {S("dynamic_loss_scale"), pickle::MakeBool(false)},
           {S("overflow"), pickle::MakeBool(false)},
           {S("clip_grad"), pickle::MakeFloat(1.0)},
           {S("base_optimizer_state"), base},
           {S("single_partition_of_fp32_groups"), pickle::MakeList(fp32)},
           {S("zero_stage"), stage},
           {S("group_paddings"), pickle::MakeList(paddings)},
           {S("partition_count"), pickle::MakeList(counts)},
           {S("ds_version"), S("0.16.5")},
           {S("param_slice_mappings"), pickle::MakeList(mappings)}});
      auto root = pickle::MakeDict(
          {{S("optimizer_state_dict"), osd},
           {S("ds_config"), pickle::MakeDict({{S("train_batch_size"), I(8)}})},
           {S("ds_version"), S("0.16.5")}});
      const std::string name =
          "bf16_zero_pp_rank_" + std::to_string(d) + "_mp_rank_" + TwoDigits(t) + "_optim_states";
      s.Add(name + ".pt", fb.Write(root, name, kExtra));
    }
  }
  return s;
}

// A view file's bytes, its CRCs computed over the in-memory sources; every record's CRC checked.
std::string Realize(ViewFile f, const std::vector<std::string>& src) {
  Status st = ComputeCrcs(
      &f,
      [&](uint32_t s, uint64_t off, uint64_t len,
          const std::function<void(const uint8_t*, size_t)>& sink) {
        sink(reinterpret_cast<const uint8_t*>(src[s].data() + off), len);
        return Status::Ok();
      },
      nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return Materialize(f.recipe, src);
}

void CheckCrcs(const std::string& bytes, const TorchFile& f) {
  for (const zip::Entry& e : f.dir.entries) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data() + e.data_offset), e.size));
    EXPECT_EQ(crc, e.crc32) << e.name;
  }
}

// A rendering of a torch file's tree that names each tensor by its shape and bytes, not its
// storage: two files that load to equal objects render equally. A tensor, mapping, list or
// object met again renders as "@N", N its first meeting's number: torch's optimizers update
// state in place, so which objects a file shares is part of what it holds. (Storages are not
// compared: a view gives every tensor a storage of its own, where DeepSpeed's module tensors are
// views of one flat buffer; tests/reshard/sharing.py checks that no view shares more.)
struct CanonState {
  const std::string& bytes;
  const TorchFile& f;
  std::map<const pickle::Value*, size_t> seen;
};
std::string Canon(CanonState& c, const ValuePtr& v) {
  if (!v) return "null";
  const TorchTensor* tensor = nullptr;
  for (const TorchTensor& t : c.f.pickle.tensors) {
    if (t.node == v.get()) tensor = &t;
  }
  // Mutable values only: tuples, torch.Size and other plain calls may be shared freely.
  if (tensor || v->kind == Kind::kDict || v->kind == Kind::kList || IsMapping(v) ||
      (v->kind == Kind::kObject && v->state)) {
    auto [it, fresh] = c.seen.emplace(v.get(), c.seen.size());
    if (!fresh) return "@" + std::to_string(it->second);
  }
  if (tensor) {
    const TorchTensor& t = *tensor;
    std::string s = "T" + pickle::Debug(IntTuple(t.shape)) + t.dtype + "[";
    for (uint64_t i = 0; i < t.length; i += 4) {
      uint32_t x;
      std::memcpy(&x, c.bytes.data() + t.offset + i, 4);
      s += std::to_string(x) + ",";
    }
    return s + "]";
  }
  std::string s = std::to_string(static_cast<int>(v->kind)) + "(";
  switch (v->kind) {
    case Kind::kDict:
      for (const auto& [k, x] : v->pairs) s += Canon(c, k) + ":" + Canon(c, x) + ",";
      break;
    case Kind::kTuple:
    case Kind::kList:
      for (const auto& x : v->items) s += Canon(c, x) + ",";
      break;
    case Kind::kObject:
      s += Canon(c, v->callable) + Canon(c, v->args) + "|";
      for (const auto& [k, x] : v->dict_items) s += Canon(c, k) + ":" + Canon(c, x) + ",";
      s += "|" + Canon(c, v->state);
      break;
    default:
      s += pickle::Debug(v);
  }
  return s + ")";
}

std::string CanonFile(const std::string& bytes) {
  auto f = Parse(bytes);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return "";
  CheckCrcs(bytes, *f);
  CanonState c{bytes, *f, {}};
  return Canon(c, f->root);
}

std::map<std::string, std::string> Plan(const Source& s, const std::string& spec) {
  DsSpec ds;
  EXPECT_TRUE(ParseDsSpec(spec, &ds)) << spec;
  auto v = PlanDeepSpeed(s.src, ds);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  std::map<std::string, std::string> out;
  if (!v.ok()) return out;
  for (ViewEntry& e : *v) out[e.path] = Realize(std::move(e.file), s.bytes);
  return out;
}

void CheckDp(int64_t from, int64_t to, const Model& m = kPlain) {
  SCOPED_TRACE("T " + std::to_string(m.T) + " dp " + std::to_string(from) + " -> " +
               std::to_string(to));
  const Source src = Build(from, {}, m), want = Build(to, {}, m);
  const auto view = Plan(src, "dp" + std::to_string(to));
  ASSERT_EQ(view.size(), want.src.files.size() + 1);  // + latest
  EXPECT_EQ(view.at("latest"), "global_step10");
  for (size_t i = 0; i < want.src.files.size(); ++i) {
    const std::string path = "global_step10/" + want.src.files[i].name;
    ASSERT_TRUE(view.count(path)) << path;
    if (path.ends_with("model_states.pt")) {
      // Equal to the source's but for dp_world_size; the flat buffers keep the source's padding.
      std::string expect;
      for (size_t j = 0; j < src.src.files.size(); ++j) {
        if (src.src.files[j].name == want.src.files[i].name) expect = CanonFile(src.bytes[j]);
      }
      const std::string key = "5('dp_world_size'):2(";
      const size_t at = expect.find(key + std::to_string(from) + ")");
      ASSERT_NE(at, std::string::npos) << expect;
      expect.replace(at, key.size() + std::to_string(from).size(), key + std::to_string(to));
      EXPECT_EQ(CanonFile(view.at(path)), expect);
    } else {
      EXPECT_EQ(CanonFile(view.at(path)), CanonFile(want.bytes[i])) << path;
    }
  }
}

TEST(DeepSpeedDp, RepartitionsAsDeepSpeedWould) {
  for (auto [from, to] : std::vector<std::pair<int64_t, int64_t>>{
           {4, 2}, {4, 1}, {2, 4}, {3, 8}, {1, 3}, {4, 4}, {8, 5}}) {
    CheckDp(from, to);
    CheckDp(from, to, kTp2);
  }
}

TEST(DeepSpeedDp, SameSizeIsTheSourceValueForValue) {
  const Source src = Build(2);
  const auto view = Plan(src, "dp2");
  for (size_t i = 1; i < src.src.files.size(); ++i) {
    EXPECT_EQ(CanonFile(view.at("global_step10/" + src.src.files[i].name)), CanonFile(src.bytes[i]));
  }
}

Status PlanError(const Source& s, const std::string& spec);

// A new TP and DP size: what the same model saved at that size holds (its vocabulary padded for
// the new TP with zero rows, as DeepSpeed's universal loading pads it).
void CheckTp(int64_t T0, int64_t D0, int64_t T1, int64_t D1) {
  SCOPED_TRACE("tp" + std::to_string(T0) + "-dp" + std::to_string(D0) + " -> tp" +
               std::to_string(T1) + "-dp" + std::to_string(D1));
  const Source src = Build(D0, {}, kTp2.WithT(T0)), want = Build(D1, {}, kTp2.WithT(T1));
  const auto view = Plan(src, "tp" + std::to_string(T1) + "-dp" + std::to_string(D1));
  ASSERT_EQ(view.size(), want.src.files.size() + 1);
  EXPECT_EQ(view.at("latest"), "global_step10");
  for (size_t i = 0; i < want.src.files.size(); ++i) {
    const std::string path = "global_step10/" + want.src.files[i].name;
    ASSERT_TRUE(view.count(path)) << path;
    EXPECT_EQ(CanonFile(view.at(path)), CanonFile(want.bytes[i])) << path;
  }
}

TEST(DeepSpeedTp, ReshardsAsUniversalLoadingWould) {
  for (auto [t0, d0, t1, d1] : std::vector<std::array<int64_t, 4>>{
           {2, 2, 1, 2}, {2, 3, 4, 1}, {1, 4, 2, 2}, {4, 1, 2, 3}, {2, 2, 2, 2}, {2, 1, 2, 5}}) {
    CheckTp(t0, d0, t1, d1);
  }
}

TEST(DeepSpeedTp, RefusesWhatDoesNotSplit) {
  Status st = PlanError(Build(2, {}, kTp2), "tp3-dp1");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "does not split in 3")) << st.ToString();
  st = PlanError(Build(2), "tp2-dp2");
  EXPECT_TRUE(Contains(st.message(), "universal_checkpoint_info")) << st.ToString();
}

TEST(DeepSpeedTp, TheSourcesOwnTpSizeNeedsNoUniversalInfo) {
  // A TP 1 source without universal_checkpoint_info: tp1-dpD splits nothing, and is dpD.
  const Source src = Build(2);
  EXPECT_EQ(Plan(src, "tp1-dp3"), Plan(src, "dp3"));
  EXPECT_EQ(Plan(src, "tp1-dp2"), Plan(src, "dp2"));
}

TEST(DeepSpeedDp, Deterministic) {
  const Source src = Build(4);
  EXPECT_EQ(Plan(src, "dp3"), Plan(src, "dp3"));
}

void CheckUniversal(const Model& m, int64_t D) {
  SCOPED_TRACE("T " + std::to_string(m.T) + " dp " + std::to_string(D));
  const Source src = Build(D, {}, m);
  const auto view = Plan(src, "universal");
  EXPECT_EQ(view.at("latest_universal"), "global_step10");
  size_t files = 2;  // latest_universal, optimizer_state.pt
  for (int64_t t = 0; t < m.T; ++t) {
    EXPECT_EQ(view.at("global_step10/mp_rank_" + TwoDigits(t) + "_model_states.pt"),
              src.bytes[static_cast<size_t>(t * (D + 1))]);
    ++files;
  }
  for (const auto& group : m.groups) {
    for (const P& p : group) {
      for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
        const std::string path = "global_step10/zero/" + p.name + "/" + key + ".pt";
        ASSERT_TRUE(view.count(path)) << path;
        FileBuilder fb;
        std::vector<std::pair<ValuePtr, ValuePtr>> items;
        if (p.cut == Cut::kSubParams) {
          items.push_back({S("sub_param_shape"), SubparamShape(p)});
        } else if (p.cut != Cut::kReplicated) {
          items.push_back({S("cat_dim"), I(p.cut == Cut::kRow ? 1 : 0)});
        }
        if (p.cut == Cut::kTwoSub) items.push_back({S("param_n_sub_params"), I(2)});
        if (p.cut == Cut::kVocab) items.push_back({S("vocab_tensor"), pickle::MakeBool(true)});
        items.push_back({S("param"), fb.Tensor(UniversalOf(m, p, FullTensor(m, key, p.name)))});
        EXPECT_EQ(CanonFile(view.at(path)), CanonFile(fb.Write(pickle::MakeDict(items), key)))
            << path;
        ++files;
      }
      const std::string step = "global_step10/zero/" + p.name + "/step.pt";
      ASSERT_TRUE(view.count(step));
      EXPECT_EQ(CanonFile(view.at(step)), CanonFile(FileBuilder().Write(I(10), "step")));
      ++files;
    }
  }
  EXPECT_EQ(view.size(), files);
  // optimizer_state.pt: rank 0's entries without the partitioned ones, paddings zero, then the
  // param groups.
  const std::string o = CanonFile(view.at("global_step10/zero/optimizer_state.pt"));
  EXPECT_EQ(o.find("base_optimizer_state"), std::string::npos);
  EXPECT_EQ(o.find("param_slice_mappings"), std::string::npos);
  EXPECT_EQ(o.find("single_partition_of_fp32_groups"), std::string::npos);
  EXPECT_NE(o.find("5('group_paddings'):9(2(0),2(0),)"), std::string::npos) << o;
  EXPECT_NE(o.rfind("'param_groups'"), std::string::npos);
  EXPECT_GT(o.rfind("'param_groups'"), o.find("'ds_version'"));
}

TEST(DeepSpeedUniversal, EveryParameterWhole) {
  for (int64_t D : {1, 2, 4}) CheckUniversal(kPlain, D);
}

TEST(DeepSpeedUniversal, TensorParallelSlicesMergedByPattern) {
  for (int64_t D : {1, 2, 3, 5}) CheckUniversal(kTp2, D);
}

Status PlanError(const Source& s, const std::string& spec) {
  DsSpec ds;
  EXPECT_TRUE(ParseDsSpec(spec, &ds));
  return PlanDeepSpeed(s.src, ds).status();
}

TEST(DeepSpeedErrors, Refusals) {
  Status st = PlanError(Build(4, {.missing_optim = true}), "dp2");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"));
  st = PlanError(Build(2, {.zero3 = true}), "universal");
  EXPECT_TRUE(Contains(st.message(), "ZeRO stage 3"));
  st = PlanError(Build(2, {.elastic = true}), "dp4");
  EXPECT_TRUE(Contains(st.message(), "elastic"));
  st = PlanError(Build(2, {.short_fp32 = true}), "dp4");
  EXPECT_TRUE(Contains(st.message(), "fp32 elements"));
}

TEST(DeepSpeedDp, PipelineLayerFilesAsTheyAre) {
  // A pipeline module's layer files: dpD copies them, universal leaves them out; tpT-dpD
  // reshards them (the mount tests), so it refuses one it cannot read or place.
  Source s = Build(2, {}, kTp2);
  for (const char* name : {"layer_01-model_00-model_states.pt", "layer_01-model_01-model_states.pt"}) {
    s.src.layers.push_back(DsLayerFile{name, static_cast<uint32_t>(s.bytes.size()), 6});
    s.bytes.push_back("layers");
  }
  const auto dp = Plan(s, "dp4");
  EXPECT_EQ(dp.at("global_step10/layer_01-model_00-model_states.pt"), "layers");
  const auto uni = Plan(s, "universal");
  EXPECT_EQ(uni.count("global_step10/layer_01-model_00-model_states.pt"), 0u);
  EXPECT_TRUE(uni.count("global_step10/zero/optimizer_state.pt"));
  Status st = PlanError(s, "tp1-dp2");  // not parsed: no state_dict
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "layer_01-model_00-model_states.pt is not a layer's "
                                     "state_dict")) << st.ToString();
  s.src.layers[0].name = "layer_01-model_states.pt";  // no TP rank in the name
  st = PlanError(s, "tp1-dp2");
  EXPECT_TRUE(Contains(st.message(), "layer_01-model_states.pt does not name its TP rank"))
      << st.ToString();
}

TEST(DeepSpeedUniversal, AveragedParameterIsTheMeanOfItsSlices) {
  // layers.0.norm.weight averaged instead of replicated: its files hold the mean of the TP
  // slices (here equal, so the mean is the slice), computed by a mean segment, and no cat_dim.
  const Options o{.uc = {{"tp_replicated_parameter_patterns", StrList({})},
                         {"parameter_to_average_patterns",
                          StrList({R"(layers\.\d+\.norm\.weight)"})}}};
  for (int64_t D : {1, 3}) {
    SCOPED_TRACE("dp " + std::to_string(D));
    const Source src = Build(D, o, kTp2);
    DsSpec spec;
    ASSERT_TRUE(ParseDsSpec("universal", &spec));
    auto plan = PlanDeepSpeed(src.src, spec);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
      const std::string path = "global_step10/zero/layers.0.norm.weight/" + key + ".pt";
      auto e = std::find_if(plan->begin(), plan->end(),
                            [&](const ViewEntry& v) { return v.path == path; });
      ASSERT_NE(e, plan->end()) << path;
      const auto& segs = e->file.recipe.segments();
      EXPECT_TRUE(std::any_of(segs.begin(), segs.end(), [](const Segment& x) {
        return x.mean && x.parts.size() == 2;
      })) << path << ": not averaged over the two TP ranks";
      FileBuilder fb;
      const ValuePtr want = pickle::MakeDict(
          {{S("param"), fb.Tensor(FullTensor(kTp2, key, "layers.0.norm.weight"))}});
      EXPECT_EQ(CanonFile(Realize(std::move(e->file), src.bytes)),
                CanonFile(fb.Write(want, key)))
          << path;
    }
    // At another TP size the module weight and the optimizer's masters are that mean too.
    ASSERT_TRUE(ParseDsSpec("tp1-dp2", &spec));
    auto tp = PlanDeepSpeed(src.src, spec);
    ASSERT_TRUE(tp.ok()) << tp.status().ToString();
    std::set<std::string> averaging;  // the files holding a mean of the two TP ranks
    for (const ViewEntry& e : *tp) {
      const auto& segs = e.file.recipe.segments();
      if (std::any_of(segs.begin(), segs.end(),
                      [](const Segment& x) { return x.mean && x.parts.size() == 2; })) {
        averaging.insert(e.path);
      }
    }
    // dp rank 1's partition of the second group holds none of the norm's elements.
    EXPECT_EQ(averaging, (std::set<std::string>{
                             "global_step10/mp_rank_00_model_states.pt",
                             "global_step10/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}));
  }
}

TEST(DeepSpeedErrors, UniversalInfoThatCannotBeGathered) {
  // Uneven sub-parameters and an integer at partition_dim are not described well enough to
  // gather. Each refusal names what it refuses, in both TP views.
  ValuePtr scalar_sub = pickle::MakeList({pickle::MakeDict(
      {{S("patterns"), StrList({R"(layers\.\d+\.gqa\.weight)"})},
       {S("shape"), pickle::MakeTuple({I(16), I(3)})},
       {S("partition_dim"), I(0)}})});
  const std::vector<std::pair<Options, std::string>> cases = {
      {{.uc = {{"sub_param_shard_widths",
                pickle::MakeDict({{S("gqa"), pickle::MakeList({I(4), I(4)})}})}}},
       "sub_param_shard_widths"},
      {{.uc = {{"parameter_with_sub_params", scalar_sub}}}, "integer at partition_dim"},
      {{.uc = {{"parameter_with_sub_params", StrList({"x"})}}}, "parameter_with_sub_params"},
  };
  for (const auto& [o, want] : cases) {
    for (const char* spec : {"universal", "tp1-dp2"}) {
      Status st = PlanError(Build(2, o, kTp2), spec);
      EXPECT_EQ(st.code(), Code::kInvalid) << spec << ": " << st.ToString();
      EXPECT_TRUE(Contains(st.message(), want)) << spec << ": " << st.ToString();
    }
  }
  // Sub-parameters that do not split in the source's TP size.
  ValuePtr odd = pickle::MakeList({pickle::MakeDict(
      {{S("patterns"), StrList({R"(layers\.\d+\.gqa\.weight)"})},
       {S("shape"), pickle::MakeTuple({pickle::MakeTuple({I(9), I(3), I(4)}), I(3)})},
       {S("partition_dim"), I(0)}})});
  Status st = PlanError(Build(2, {.uc = {{"parameter_with_sub_params", odd}}}, kTp2), "universal");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "does not split")) << st.ToString();
}

// ZeRO stage 3: every parameter cut on its own into D partitions of ceil(numel / D) elements
// (the padding filled with a marker, as DeepSpeed leaves it arbitrary); a rank's flat buffer of
// a sub-group is its partitions one after another. `subs`: the sub-groups, as parameter lists.
struct Zero3Options {
  bool missing_optim = false, short_fp32 = false, tp2 = false;
  bool odd_shapes = false;  // dp rank 1's param_shapes lack the last parameter
  bool scalar_state = false;  // dp rank 1's exp_avg of sub-group 0 is a 0-dim tensor
  std::vector<int64_t> group_of;  // each sub-group's optimizer param group (empty: all in 0)
  int64_t sub_group_size = -1;    // written into ds_config when set
  uint32_t pad = 0xDEADBEEF;      // what the padding holds
};
Source BuildZero3(int64_t D, const std::vector<std::vector<P>>& subs, Zero3Options o = {}) {
  Source s;
  s.src.tag = "global_step10";
  const Model m{subs};
  auto part = [&](const P& p) {
    int64_t n = 1;
    for (int64_t x : p.shape) n *= x;
    return std::pair{n, (n + D - 1) / D};  // (numel, partition)
  };
  for (int64_t d = 0; d < D; ++d) {
    std::vector<ValuePtr> shapes;
    for (const auto& sub : subs) {
      auto shape_map = OrderedDict();
      for (const P& p : sub) shape_map->dict_items.push_back({S(p.name), Size(p.shape)});
      shapes.push_back(shape_map);
    }
    if (o.odd_shapes && d == 1) shapes.back()->dict_items.pop_back();
    FileBuilder mb;
    std::vector<std::pair<ValuePtr, ValuePtr>> root = {
        {S("module"), OrderedDict()},       {S("optimizer"), pickle::MakeNone()},
        {S("param_shapes"), pickle::MakeList(shapes)}, {S("dp_world_size"), I(D)},
        {S("mp_world_size"), I(1)},         {S("ds_version"), S("0.16.5")}};
    if (o.sub_group_size >= 0) {
      root.push_back({S("ds_config"),
                      pickle::MakeDict({{S("zero_optimization"),
                                         pickle::MakeDict({{S("stage"), I(3)},
                                                           {S("sub_group_size"),
                                                            I(o.sub_group_size)}})}})});
    }
    const std::string mname = "zero_pp_rank_" + std::to_string(d) + "_mp_rank_00_model_states";
    s.Add(mname + ".pt", mb.Write(pickle::MakeDict(root), mname));
    if (o.missing_optim && d == D - 1) continue;
    FileBuilder fb;
    std::vector<ValuePtr> flats;
    std::vector<std::vector<ValuePtr>> params(1);
    auto state = pickle::MakeDict({});
    for (size_t g = 0; g < subs.size(); ++g) {
      std::map<std::string, T32> flat;
      for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
        T32 x{{0}, {}};
        for (const P& p : subs[g]) {
          const auto [n, ps] = part(p);
          const T32 full = FullTensor(m, key, p.name);
          for (int64_t i = d * ps; i < (d + 1) * ps; ++i) {
            x.v.push_back(i < n ? full.v[static_cast<size_t>(i)] : o.pad);
          }
        }
        x.shape[0] = static_cast<int64_t>(x.v.size()) - (key == "fp32" && o.short_fp32 ? 1 : 0);
        flat[key] = x;
      }
      flats.push_back(fb.Tensor(flat["fp32"]));
      const bool scalar = o.scalar_state && d == 1 && g == 0;
      // torch's Adam keeps a 0-dim 'step' tensor per sub-group.
      ValuePtr st = pickle::MakeDict({{S("step"), fb.Tensor(T32{{}, {10}})},
                                      {S("exp_avg"), fb.Tensor(scalar ? T32{{}, {7}}
                                                                      : flat["exp_avg"])},
                                      {S("exp_avg_sq"), fb.Tensor(flat["exp_avg_sq"])}});
      state->pairs.push_back({I(static_cast<int64_t>(g)), st});
      const size_t pg = o.group_of.empty() ? 0 : static_cast<size_t>(o.group_of[g]);
      params.resize(std::max(params.size(), pg + 1));
      params[pg].push_back(I(static_cast<int64_t>(g)));
    }
    std::vector<ValuePtr> groups;
    for (size_t pg = 0; pg < params.size(); ++pg) {
      groups.push_back(pickle::MakeDict({{S("lr"), pickle::MakeFloat(0.001 * (pg + 1))},
                                         {S("params"), pickle::MakeList(params[pg])}}));
    }
    auto inner = pickle::MakeDict(
        {{S("state"), state}, {S("param_groups"), pickle::MakeList(groups)}});
    auto osd = pickle::MakeDict({{S("zero_stage"), I(3)},
                                 {S("partition_count"), I(D)},
                                 {S("optimizer_state_dict"), inner},
                                 {S("fp32_flat_groups"), pickle::MakeList(flats)}});
    const std::string oname = "bf16_zero_pp_rank_" + std::to_string(d) + "_mp_rank_00_optim_states";
    s.Add(oname + ".pt", fb.Write(pickle::MakeDict({{S("optimizer_state_dict"), osd}}), oname));
  }
  if (o.tp2) {
    FileBuilder fb;
    const std::string name = "zero_pp_rank_0_mp_rank_01_model_states";
    s.Add(name + ".pt", fb.Write(pickle::MakeDict({{S("dp_world_size"), I(D)}}), name));
  }
  return s;
}

// kPlain's parameters with the first group cut in two sub-groups.
const std::vector<std::vector<P>> kZero3Subs = {
    {kPlain.groups[0][0]}, {kPlain.groups[0][1]}, kPlain.groups[1]};

TEST(DeepSpeedZero3, UniversalHoldsEveryParameterWhole) {
  for (int64_t D : {1, 2, 3, 5}) {
    SCOPED_TRACE("dp " + std::to_string(D));
    const Source src = BuildZero3(D, kZero3Subs);
    const auto view = Plan(src, "universal");
    EXPECT_EQ(view.at("latest_universal"), "global_step10");
    size_t files = 2;  // latest_universal, optimizer_state.pt
    for (const DsSourceFile& f : src.src.files) {
      if (!f.name.ends_with("_model_states.pt")) continue;
      EXPECT_EQ(view.at("global_step10/" + f.name), src.bytes[f.source]) << f.name;
      ++files;
    }
    const Model m{kZero3Subs};
    for (const auto& sub : kZero3Subs) {
      for (const P& p : sub) {
        for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
          const std::string path = "global_step10/zero/" + p.name + "/" + key + ".pt";
          ASSERT_TRUE(view.count(path)) << path;
          T32 full = FullTensor(m, key, p.name);
          full.shape = {static_cast<int64_t>(full.v.size())};  // ds_to_universal: 1-D, bare
          FileBuilder fb;
          EXPECT_EQ(CanonFile(view.at(path)), CanonFile(fb.Write(fb.Tensor(full), key))) << path;
          ++files;
        }
        EXPECT_EQ(view.count("global_step10/zero/" + p.name + "/step.pt"), 0u);
      }
    }
    EXPECT_EQ(view.size(), files);
    // optimizer_state.pt: rank 0's optimizer_state_dict whole, its param_groups added last.
    const std::string o = CanonFile(view.at("global_step10/zero/optimizer_state.pt"));
    EXPECT_NE(o.find("'fp32_flat_groups'"), std::string::npos) << o;
    EXPECT_NE(o.find("5('partition_count'):2(" + std::to_string(D) + ")"), std::string::npos) << o;
    EXPECT_GT(o.rfind("'param_groups'"), o.find("'fp32_flat_groups'")) << o;
  }
}

// kPlain's parameters (15, 7 | 4, 1 elements in two param groups) in the sub-groups DeepSpeed
// forms at dp size D with sub_group_size 4, worked out by hand: a group whose partitions fit in
// 4 elements is one sub-group; otherwise a sub-group closes once its partitions reach 4.
struct Zero3Layout {
  std::vector<std::vector<P>> subs;
  std::vector<int64_t> group_of;
};
Zero3Layout Zero3At(int64_t D) {
  const P& e = kPlain.groups[0][0];
  const P& w = kPlain.groups[0][1];
  const P& n = kPlain.groups[1][0];
  const P& b = kPlain.groups[1][1];
  if (D == 1) return {{{e}, {w}, {n}, {b}}, {0, 0, 1, 1}};  // 15, 7 | 4, 1
  if (D <= 4) return {{{e}, {w}, {n, b}}, {0, 0, 1}};       // at 2: 8, 4 | 2, 1 (fits)
  return {{{e, w}, {n, b}}, {0, 1}};                        // at 5: 3, 2 (3 < 4) | 1, 1
}

TEST(DeepSpeedZero3, DpViewIsWhatDeepSpeedWritesAtTheNewSize) {
  for (const auto& [from, to] : std::vector<std::pair<int64_t, int64_t>>{
           {2, 5}, {5, 1}, {3, 2}, {1, 3}, {2, 2}, {5, 4}}) {
    SCOPED_TRACE("dp " + std::to_string(from) + " -> " + std::to_string(to));
    const Zero3Layout a = Zero3At(from), b = Zero3At(to);
    const Source src = BuildZero3(from, a.subs, {.group_of = a.group_of, .sub_group_size = 4});
    // What a run at the new size writes; the view pads with zeros (DeepSpeed leaves the padding
    // arbitrary), the source with a marker.
    const Source want =
        BuildZero3(to, b.subs, {.group_of = b.group_of, .sub_group_size = 4, .pad = 0});
    const auto view = Plan(src, "dp" + std::to_string(to));
    EXPECT_EQ(view.at("latest"), "global_step10");
    EXPECT_EQ(view.size(), want.src.files.size() + 1);
    for (const DsSourceFile& f : want.src.files) {
      const std::string path = "global_step10/" + f.name;
      ASSERT_TRUE(view.count(path)) << path;
      EXPECT_EQ(CanonFile(view.at(path)), CanonFile(want.bytes[f.source])) << path;
    }
    EXPECT_EQ(Plan(src, "tp1-dp" + std::to_string(to)), view);
  }
}

TEST(DeepSpeedZero3, Refusals) {
  Status st = PlanError(BuildZero3(2, kZero3Subs), "tp2-dp2");
  EXPECT_EQ(st.code(), Code::kInvalid);
  EXPECT_TRUE(Contains(st.message(), "no tensor-parallel views")) << st.ToString();
  // Sub-groups that sub_group_size does not explain: those at another size are unknown.
  const Zero3Layout two = Zero3At(2);
  st = PlanError(BuildZero3(2, two.subs, {.group_of = two.group_of, .sub_group_size = 100}),
                 "dp4");
  EXPECT_TRUE(Contains(st.message(), "not those sub_group_size 100 gives at dp 2"))
      << st.ToString();
  st = PlanError(BuildZero3(2, kZero3Subs), "dp4");  // no ds_config: DeepSpeed's 1e9
  EXPECT_TRUE(Contains(st.message(), "sub_group_size 1000000000")) << st.ToString();
  // A scalar where a flat state belongs is refused, not read past.
  st = PlanError(BuildZero3(2, two.subs, {.scalar_state = true, .group_of = two.group_of,
                                          .sub_group_size = 4}),
                 "dp1");
  EXPECT_TRUE(Contains(st.message(), "'exp_avg' of sub-group 0 is not a flat tensor"))
      << st.ToString();
  const std::vector<std::tuple<int64_t, Zero3Options, std::string>> universal = {
      {3, {.missing_optim = true},
       "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt of global_step10 is missing"},
      {2, {.short_fp32 = true}, "fp32_flat_groups[0] holds 7 elements"},
      {2, {.odd_shapes = true},
       "zero_pp_rank_1_mp_rank_00_model_states.pt: param_shapes differ from dp rank 0's"},
      {2, {.tp2 = true}, "tensor parallelism"},
  };
  for (const auto& [D, o, want] : universal) {
    st = PlanError(BuildZero3(D, kZero3Subs, o), "universal");
    EXPECT_TRUE(Contains(st.message(), want)) << st.ToString();
  }
  auto specs = DeepSpeedSpecs(BuildZero3(2, kZero3Subs).src);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_EQ(*specs, (std::vector<std::string>{"dp1", "dp2", "dp4", "dp8", "universal"}));
  specs = DeepSpeedSpecs(Build(2).src);
  ASSERT_TRUE(specs.ok()) << specs.status().ToString();
  EXPECT_EQ(specs->back(), "universal");
  EXPECT_EQ(specs->front(), "dp1");
}

TEST(DeepSpeedShapes, ElementCountsThatOverflowAreRefused) {
  EXPECT_EQ(*ds::Numel({2, 3}, "w"), 6u);
  EXPECT_EQ(*ds::Numel({}, "w"), 1u);
  EXPECT_EQ(*ds::Numel({4, 0}, "w"), 0u);
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{
           {3, 6148914691236517205}, {-1}, {1ll << 30, 1ll << 30}}) {
    auto n = ds::Numel(bad, "w");
    ASSERT_FALSE(n.ok());
    EXPECT_TRUE(Contains(n.status().message(), "w has a negative size or too many elements"));
  }
  // An empty parameter group: the universal view has no element to find a rank for.
  const Model empty = {{{{"a", {3}}}, {{"z", {0}}}}};
  const auto view = Plan(Build(2, {}, empty), "universal");
  EXPECT_TRUE(view.count("global_step10/zero/z/fp32.pt"));
}

TEST(DeepSpeedSpec, Names) {
  DsSpec s;
  EXPECT_TRUE(ParseDsSpec("dp8", &s));
  EXPECT_EQ(s.D, 8u);
  EXPECT_TRUE(ParseDsSpec("universal", &s));
  EXPECT_EQ(s.kind, DsSpec::kUniversal);
  EXPECT_TRUE(ParseDsSpec("tp2-dp4", &s));
  EXPECT_EQ(s.kind, DsSpec::kTpDp);
  EXPECT_EQ(s.T, 2u);
  EXPECT_EQ(s.D, 4u);
  for (const char* bad : {"dp0", "dp08", "dp", "dp2x", "tp2-dp0", "tp02-dp2", "tp2", "Universal"}) {
    EXPECT_FALSE(ParseDsSpec(bad, &s)) << bad;
  }
  EXPECT_TRUE(IsDeepSpeedSourceName("mp_rank_00_model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedSourceName("zero_pp_rank_3_mp_rank_00_model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("zero_pp_rank_3_mp_rank_0_model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedSourceName("bf16_zero_pp_rank_12_mp_rank_03_optim_states.pt"));
  EXPECT_TRUE(IsDeepSpeedSourceName("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("zero_pp_rank_00_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("mp_rank_0_model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("zero_to_fp32.py"));
  EXPECT_TRUE(IsDeepSpeedLayerName("layer_01-model_00-model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedLayerName("layer_12-model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedLayerName("layer_-model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedLayerName("mp_rank_00_model_states.pt"));
}

}  // namespace
}  // namespace ckptfs::reshard
