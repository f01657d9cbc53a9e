// PlanDeepSpeed end to end on tiny ZeRO stage 1/2 checkpoints built in memory in DeepSpeed's
// layout (docs/views.md; tests/reshard/deepspeed_fixture.py is the full-size Python twin):
// a view for a new data-parallel size must equal, value for value, the files the same model
// saved at that size has; the universal view must hold every parameter's full state. Also the
// refusals: a missing optimizer file, ZeRO-3, elastic checkpoints, inconsistent partitions.
#include "reshard/deepspeed.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: tensors, file builders and their helpers

using pickle::Kind;
using pickle::ValuePtr;

struct P {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    return n;
  }
};

// Two groups whose sizes are not multiples of 2 * dp: padding on the last rank(s), and at
// dp 4 a whole trailing rank of group 1 is padding.
const std::vector<std::vector<P>> kGroups = {
    {{"embed.weight", {3, 5}}, {"layers.0.w", {7}}},
    {{"layers.0.norm", {4}}, {"head.bias", {1}}},
};

int64_t Total(size_t g) {
  int64_t n = 0;
  for (const P& p : kGroups[g]) n += p.numel();
  return n;
}

// The full value of state `key` of group g: distinct per key, group and element.
uint32_t Value(const std::string& key, size_t g, int64_t e) {
  const uint32_t k = key == "fp32" ? 1 : key == "exp_avg" ? 2 : 3;
  return k * 1000000 + static_cast<uint32_t>(g) * 10000 + static_cast<uint32_t>(e);
}

struct Options {
  bool missing_optim = false, zero3 = false, elastic = false, short_fp32 = false;
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

Source Build(int64_t D, Options o = {}) {
  Source s;
  s.src.tag = "global_step10";
  // Model states: the module's tensors view one flat buffer per group.
  {
    FileBuilder fb;
    auto module = OrderedDict();
    std::vector<ValuePtr> shapes;
    for (size_t g = 0; g < kGroups.size(); ++g) {
      const int64_t align = 2 * D, padded = (Total(g) + align - 1) / align * align;
      T32 flat = Iota({padded}, 7000 + 100 * static_cast<uint32_t>(g));
      fb.storages.push_back(flat.Bytes());
      auto shape_map = OrderedDict();
      int64_t off = 0;
      for (const P& p : kGroups[g]) {
        module->dict_items.push_back({S(p.name), fb.View(fb.storages.size() - 1, off, p.shape)});
        shape_map->dict_items.push_back({S(p.name), Size(p.shape)});
        off += p.numel();
      }
      shapes.push_back(shape_map);
    }
    auto root = pickle::MakeDict({{S("module"), module},
                                  {S("optimizer"), pickle::MakeNone()},
                                  {S("param_shapes"), pickle::MakeList(shapes)},
                                  {S("dp_world_size"), I(D)},
                                  {S("mp_world_size"), I(1)},
                                  {S("ds_version"), S("0.16.5")}});
    s.Add("mp_rank_00_model_states.pt", fb.Write(root, "mp_rank_00_model_states"));
  }
  for (int64_t d = 0; d < D; ++d) {
    if (o.missing_optim && d == D - 1) continue;
    FileBuilder fb;
    std::vector<ValuePtr> fp32, paddings, counts, mappings, groups;
    auto state = pickle::MakeDict({});
    for (size_t g = 0; g < kGroups.size(); ++g) {
      const int64_t align = 2 * D, psize = (Total(g) + align - 1) / align * align / D;
      const int64_t lo = d * psize, real = std::max<int64_t>(0, std::min(Total(g), lo + psize) - lo);
      auto partition = [&](const std::string& key) {
        T32 t{{psize}, std::vector<uint32_t>(static_cast<size_t>(psize), 0)};
        for (int64_t i = 0; i < real; ++i) t.v[static_cast<size_t>(i)] = Value(key, g, lo + i);
        return t;
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
      auto m = OrderedDict();
      int64_t off = 0;
      for (const P& p : kGroups[g]) {
        const int64_t a = std::max(off, lo), b = std::min(off + p.numel(), lo + psize);
        if (a < b) {
          m->dict_items.push_back(
              {S(p.name), Obj("deepspeed.utils.tensor_fragment", "fragment_address",
                              {{S("numel"), I(b - a)}, {S("start"), I(a - lo)}})});
        }
        off += p.numel();
      }
      mappings.push_back(m);
      groups.push_back(pickle::MakeDict({{S("lr"), pickle::MakeFloat(0.001)},
                                         {S("weight_decay"), pickle::MakeFloat(g ? 0.0 : 0.1)},
                                         {S("params"), pickle::MakeList({I(int64_t(g))})}}));
    }
    ValuePtr base = o.elastic ? pickle::MakeList({})
                              : pickle::MakeDict({{S("state"), state},
                                                  {S("param_groups"), pickle::MakeList(groups)}});
    auto stage = pickle::MakeCall(pickle::MakeGlobal("deepspeed.runtime.zero.config",
                                                     "ZeroStageEnum"),
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
    auto root = pickle::MakeDict({{S("optimizer_state_dict"), osd},
                                  {S("ds_config"), pickle::MakeDict({{S("train_batch_size"), I(8)}})},
                                  {S("ds_version"), S("0.16.5")}});
    const std::string name = "bf16_zero_pp_rank_" + std::to_string(d) + "_mp_rank_00_optim_states";
    s.Add(name + ".pt", fb.Write(root, name, kExtra));
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
// storage: two files that load to equal objects render equally.
std::string Canon(const std::string& bytes, const TorchFile& f, const ValuePtr& v) {
  if (!v) return "null";
  for (const TorchTensor& t : f.pickle.tensors) {
    if (t.node == v.get()) {
      std::string s = "T" + pickle::Debug(IntTuple(t.shape)) + t.dtype + "[";
      for (uint64_t i = 0; i < t.length; i += 4) {
        uint32_t x;
        std::memcpy(&x, bytes.data() + t.offset + i, 4);
        s += std::to_string(x) + ",";
      }
      return s + "]";
    }
  }
  std::string s = std::to_string(static_cast<int>(v->kind)) + "(";
  switch (v->kind) {
    case Kind::kDict:
      for (const auto& [k, x] : v->pairs) s += Canon(bytes, f, k) + ":" + Canon(bytes, f, x) + ",";
      break;
    case Kind::kTuple:
    case Kind::kList:
      for (const auto& x : v->items) s += Canon(bytes, f, x) + ",";
      break;
    case Kind::kObject:
      s += Canon(bytes, f, v->callable) + Canon(bytes, f, v->args) + "|";
      for (const auto& [k, x] : v->dict_items) s += Canon(bytes, f, k) + ":" + Canon(bytes, f, x) + ",";
      s += "|" + Canon(bytes, f, v->state);
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
  return Canon(bytes, *f, f->root);
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

void CheckDp(int64_t from, int64_t to) {
  SCOPED_TRACE("dp " + std::to_string(from) + " -> " + std::to_string(to));
  const Source src = Build(from), want = Build(to);
  const auto view = Plan(src, "dp" + std::to_string(to));
  ASSERT_EQ(view.size(), want.src.files.size() + 1);  // + latest
  EXPECT_EQ(view.at("latest"), "global_step10");
  for (size_t i = 0; i < want.src.files.size(); ++i) {
    const std::string path = "global_step10/" + want.src.files[i].name;
    ASSERT_TRUE(view.count(path)) << path;
    if (path.ends_with("model_states.pt")) {
      // Equal to the source's but for dp_world_size; the flat buffers keep the source's padding.
      std::string expect = CanonFile(src.bytes[0]);
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
  }
}

TEST(DeepSpeedDp, SameSizeIsTheSourceValueForValue) {
  const Source src = Build(2);
  const auto view = Plan(src, "dp2");
  for (size_t i = 1; i < src.src.files.size(); ++i) {
    EXPECT_EQ(CanonFile(view.at("global_step10/" + src.src.files[i].name)), CanonFile(src.bytes[i]));
  }
}

TEST(DeepSpeedDp, Deterministic) {
  const Source src = Build(4);
  EXPECT_EQ(Plan(src, "dp3"), Plan(src, "dp3"));
}

TEST(DeepSpeedUniversal, EveryParameterWhole) {
  for (int64_t D : {1, 2, 4}) {
    SCOPED_TRACE("dp " + std::to_string(D));
    const Source src = Build(D);
    const auto view = Plan(src, "universal");
    EXPECT_EQ(view.at("latest_universal"), "global_step10");
    EXPECT_EQ(view.at("global_step10/mp_rank_00_model_states.pt"), src.bytes[0]);
    size_t files = 3;
    for (size_t g = 0; g < kGroups.size(); ++g) {
      int64_t off = 0;
      for (const P& p : kGroups[g]) {
        for (const std::string key : {"fp32", "exp_avg", "exp_avg_sq"}) {
          const std::string path = "global_step10/zero/" + p.name + "/" + key + ".pt";
          ASSERT_TRUE(view.count(path)) << path;
          T32 want{p.shape, {}};
          for (int64_t i = 0; i < p.numel(); ++i) want.v.push_back(Value(key, g, off + i));
          FileBuilder fb;
          auto root = pickle::MakeDict({{S("cat_dim"), I(0)}, {S("param"), fb.Tensor(want)}});
          EXPECT_EQ(CanonFile(view.at(path)), CanonFile(fb.Write(root, key))) << path;
          ++files;
        }
        const std::string step = "global_step10/zero/" + p.name + "/step.pt";
        ASSERT_TRUE(view.count(step));
        EXPECT_EQ(CanonFile(view.at(step)), CanonFile(FileBuilder().Write(I(10), "step")));
        ++files;
        off += p.numel();
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

TEST(DeepSpeedSpec, Names) {
  DsSpec s;
  EXPECT_TRUE(ParseDsSpec("dp8", &s));
  EXPECT_EQ(s.D, 8u);
  EXPECT_TRUE(ParseDsSpec("universal", &s));
  EXPECT_EQ(s.kind, DsSpec::kUniversal);
  for (const char* bad : {"dp0", "dp08", "dp", "dp2x", "tp2-dp2", "Universal"}) {
    EXPECT_FALSE(ParseDsSpec(bad, &s)) << bad;
  }
  EXPECT_TRUE(IsDeepSpeedSourceName("mp_rank_00_model_states.pt"));
  EXPECT_TRUE(IsDeepSpeedSourceName("bf16_zero_pp_rank_12_mp_rank_03_optim_states.pt"));
  EXPECT_TRUE(IsDeepSpeedSourceName("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("zero_pp_rank_00_mp_rank_00_optim_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("mp_rank_0_model_states.pt"));
  EXPECT_FALSE(IsDeepSpeedSourceName("zero_to_fp32.py"));
}

}  // namespace
}  // namespace ckptfs::reshard
