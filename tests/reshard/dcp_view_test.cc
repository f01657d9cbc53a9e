// The DCP consolidated view: planned over the fixtures of tests/formats/data (make_dcp_fixtures.py)
// and over hand-made chunk layouts, materialized by walking the recipes over the source bytes,
// and read back with ckptfs's own parsers, with Python's zipfile and with Debian's torch.
#include "reshard/dcp_view.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"
#include "formats/zip.h"
#include "tests/test_util.h"

namespace ckptfs::reshard {
namespace {

using pickle::Kind;
using pickle::ValuePtr;

std::string DataDir() { return std::string(CKPTFS_SOURCE_DIR) + "/tests/formats/data"; }

zip::ReadAtFn Reader(const std::string& bytes) {
  return [&bytes](uint64_t off, size_t len) -> Result<std::string> {
    if (off > bytes.size() || len > bytes.size() - off) return Corrupt("read past the end");
    return bytes.substr(off, len);
  };
}

// A checkpoint in memory: its metadata, its data files as sources, the non-tensor items.
struct Checkpoint {
  dcp::Metadata md;
  std::vector<std::string> sources;  // bytes, by source index
  std::vector<DcpDataFile> files;
  std::map<std::string, std::string> items;
};

Checkpoint LoadFixture(const std::string& name) {
  Checkpoint c;
  const std::string dir = DataDir() + "/" + name;
  auto md = dcp::ParseMetadata(test::ReadFileBytes(dir + "/.metadata"));
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  c.md = *md;
  for (const std::string& rel : c.md.Files()) {
    c.sources.push_back(test::ReadFileBytes(dir + "/" + rel));
  }
  // Described only once every source is in place: Reader keeps a reference.
  const std::vector<std::string> rels = c.md.Files();
  for (size_t i = 0; i < rels.size(); ++i) {
    auto d = dcp::DescribeDataFile(c.md, rels[i], c.sources[i].size(), Reader(c.sources[i]));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    c.files.push_back({rels[i], static_cast<uint32_t>(i), *d});
  }
  for (const dcp::BytesEntry& b : c.md.bytes) {
    const size_t i = std::find(rels.begin(), rels.end(), b.storage.relative_path) - rels.begin();
    c.items[b.fqn] = c.sources[i].substr(b.storage.offset, b.storage.length);
  }
  return c;
}

// The view file's bytes, CRCs computed first, read by walking its recipe.
std::string Materialize(ViewFile f, const std::vector<std::string>& sources) {
  auto read = [&](uint32_t src, uint64_t off, uint64_t len,
                  const std::function<void(const uint8_t*, size_t)>& sink) -> Status {
    const std::string& s = sources.at(src);
    if (off > s.size() || len > s.size() - off) return Corrupt("read past a source");
    sink(reinterpret_cast<const uint8_t*>(s.data()) + off, len);
    return Status::Ok();
  };
  Status st = ComputeCrcs(&f, read, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(f.crc_tasks.empty());
  std::string out;
  st = f.recipe.Walk(0, f.recipe.size(), [&](const Piece& p) -> Status {
    if (p.literal) {
      out.append(reinterpret_cast<const char*>(p.literal), p.len);
      return Status::Ok();
    }
    return read(p.source, p.offset, p.len, [&](const uint8_t* b, size_t n) {
      out.append(reinterpret_cast<const char*>(b), n);
    });
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(out.size(), f.recipe.size());
  return out;
}

// Each tensor's global bytes, row-major, assembled element by element from its chunks as the
// descriptions place them: an independent account of what the view must hold.
std::map<std::string, std::string> ExpectedTensors(const Checkpoint& c) {
  std::map<std::string, std::string> out;
  for (const dcp::TensorEntry& t : c.md.tensors) {
    const uint64_t e = DtypeSize(t.dtype);
    const size_t n = t.size.size();
    uint64_t numel = 1;
    for (int64_t d : t.size) numel *= d;
    std::string g(numel * e, '\xEE');
    for (const dcp::Chunk& ch : t.chunks) {
      const DcpDataFile* f = nullptr;
      for (const DcpDataFile& x : c.files) {
        if (x.relative_path == ch.storage.relative_path) f = &x;
      }
      const TensorInfo* info = nullptr;
      for (const TensorInfo& ti : f->desc.tensors) {
        if (ti.name == t.fqn && ti.shape == ch.sizes &&
            (ti.global_offset == ch.offsets || ti.global_offset.empty())) {
          info = &ti;
        }
      }
      EXPECT_NE(info, nullptr) << t.fqn;
      if (!info) continue;
      std::vector<int64_t> stride = info->stride;
      if (stride.empty()) {
        stride.assign(n, 1);
        for (size_t j = n; j-- > 1;) stride[j - 1] = stride[j] * ch.sizes[j];
      }
      uint64_t count = 1;
      for (int64_t s : ch.sizes) count *= s;
      std::vector<int64_t> idx(n, 0);
      for (uint64_t k = 0; k < count; ++k) {
        uint64_t src = info->offset, dst = 0;
        for (size_t j = 0; j < n; ++j) {
          src += idx[j] * stride[j] * e;
          dst = dst * t.size[j] + ch.offsets[j] + idx[j];
        }
        g.replace(dst * e, e, c.sources[f->source].substr(src, e));
        for (size_t j = n; j-- > 0;) {
          if (++idx[j] < ch.sizes[j]) break;
          idx[j] = 0;
        }
      }
    }
    out[t.fqn] = g;
  }
  return out;
}

// Every record's CRC-32, recomputed, matches its central-directory and local-header entries.
void CheckZipCrcs(const std::string& file) {
  auto dir = zip::ReadDirectory(file.size(), Reader(file));
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  for (const zip::Entry& e : dir->entries) {
    const uint32_t crc = static_cast<uint32_t>(crc32_z(
        crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(file.data() + e.data_offset), e.size));
    EXPECT_EQ(crc, e.crc32) << e.name;
    EXPECT_EQ(zip::Le32(reinterpret_cast<const uint8_t*>(file.data() + e.header_offset + 14)), crc)
        << e.name;
    EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
  }
}

ValuePtr Get(const ValuePtr& dict, const std::string& key) {
  if (!dict || dict->kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict->pairs) {
    if (k->kind == Kind::kStr && k->str == key) return v;
  }
  return nullptr;
}

// model.pt through ckptfs's own readers: the tensors, named by their key paths, hold `want`.
TorchFile CheckModelPt(const std::string& file, const std::map<std::string, std::string>& want,
                       const dcp::Metadata& md) {
  CheckZipCrcs(file);
  auto tf = ReadTorchFile(file.size(), Reader(file));
  EXPECT_TRUE(tf.ok()) << tf.status().ToString();
  if (!tf.ok()) return {};
  EXPECT_EQ(tf->prefix, "model");
  EXPECT_EQ(tf->dir.entries.front().name, "model/data.pkl");
  EXPECT_EQ(tf->dir.entries.back().name, "model/version");
  EXPECT_EQ(tf->pickle.tensors.size(), want.size());
  for (const TorchTensor& t : tf->pickle.tensors) {
    auto it = want.find(t.name);
    EXPECT_NE(it, want.end()) << t.name;
    if (it == want.end()) continue;
    EXPECT_TRUE(IsContiguous(t.shape, t.stride)) << t.name;
    EXPECT_EQ(t.storage_offset, 0u);
    EXPECT_EQ(t.length, it->second.size()) << t.name;
    EXPECT_EQ(file.substr(t.offset, t.length), it->second) << t.name;
    for (const dcp::TensorEntry& e : md.tensors) {
      if (e.fqn != t.name) continue;
      EXPECT_EQ(t.dtype, e.dtype);
      EXPECT_EQ(t.shape, e.size);
      EXPECT_EQ(t.requires_grad, e.requires_grad);
      EXPECT_EQ(tf->pickle.storages.at(t.storage_key).location, "cpu");
    }
  }
  return std::move(*tf);
}

// model.safetensors through ParseHeader: `want` (by safetensors name), sorted, format pt.
void CheckSafetensors(const std::string& file, const std::map<std::string, std::string>& want) {
  auto h = safetensors::ParseHeader(file, file.size());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->metadata.has_value());
  EXPECT_EQ(*h->metadata, (safetensors::Metadata{{"format", "pt"}}));
  ASSERT_EQ(h->tensors.size(), want.size());
  uint64_t last = 0;
  std::vector<std::string> names;
  for (const safetensors::TensorInfo& t : h->tensors) {
    names.push_back(t.name);
    auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << t.name;
    EXPECT_EQ(file.substr(t.offset, t.length), it->second) << t.name;
    EXPECT_GE(t.offset, last);
    last = t.offset;
  }
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

std::map<std::string, std::string> UnderModel(const std::map<std::string, std::string>& all) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : all) {
    if (k.starts_with("model.")) out[k.substr(6)] = v;
  }
  return out;
}

class DcpViewFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DcpViewFixture, BothFilesHoldTheAssembledTensors) {
  const Checkpoint c = LoadFixture(GetParam());
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_TRUE(view->model_safetensors.crc_tasks.empty());
  const auto want = ExpectedTensors(c);
  const std::string pt = Materialize(view->model_pt, c.sources);
  const TorchFile tf = CheckModelPt(pt, want, c.md);
  CheckSafetensors(Materialize(view->model_safetensors, c.sources), UnderModel(want));

  // The non-tensor entries, embedded at their key paths.
  ASSERT_TRUE(tf.root);
  ValuePtr step = Get(Get(Get(Get(tf.root, "optim"), "state"), "0"), "step");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->kind, Kind::kInt);
  EXPECT_EQ(step->i, 7);
  ValuePtr groups = Get(Get(tf.root, "optim"), "param_groups");
  ASSERT_TRUE(groups);
  EXPECT_EQ(pickle::Debug(groups), "[{'lr': 0.01, 'params': ['model.w']}]");
  // Keys in state_dict_metadata order, tensors and other values interleaved, as torch's
  // dcp_to_torch_save sets them: these fixtures' metadata lists rank 0's bytes items first.
  ASSERT_EQ(tf.root->pairs.size(), 2u);
  EXPECT_EQ(tf.root->pairs[0].first->str, "optim");
  EXPECT_EQ(tf.root->pairs[1].first->str, "model");
}

TEST_P(DcpViewFixture, PlansAreDeterministic) {
  const Checkpoint c = LoadFixture(GetParam());
  auto a = PlanDcpConsolidated(c.md, c.files, c.items);
  auto b = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Materialize(a->model_pt, c.sources), Materialize(b->model_pt, c.sources));
  EXPECT_EQ(Materialize(a->model_safetensors, c.sources),
            Materialize(b->model_safetensors, c.sources));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DcpViewFixture,
                         ::testing::Values("dcp_torch_save", "dcp_torch22", "dcp_safetensors"));

// The same model.pt through Debian's torch and Python's zipfile (tests/reshard/dcp_view_check.py).
TEST(DcpView, TorchLoadsModelPt) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  }
  for (const std::string name : {"dcp_torch_save", "dcp_safetensors"}) {
    const Checkpoint c = LoadFixture(name);
    auto view = PlanDcpConsolidated(c.md, c.files, c.items);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    test::TempDir tmp;
    const std::string pt = tmp.Sub("model.pt");
    std::ofstream(pt, std::ios::binary) << Materialize(view->model_pt, c.sources);
    const std::string log = tmp.Sub("log");
    const std::string cmd = "/usr/bin/python3 " + std::string(CKPTFS_SOURCE_DIR) +
                            "/tests/reshard/dcp_view_check.py " + pt + " " + DataDir() + " >" +
                            log + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << name << ":\n" << test::ReadFileBytes(log);
  }
}

TEST(DcpView, NonTensorItemHoldingATensorIsEmbeddedWithItsStorage) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  }
  Checkpoint c = LoadFixture("dcp_torch_save");
  // A tensor chunk's own item is a torch.save archive of a tensor (as an RNG state or Transformer
  // Engine's extra state holds tensors): model.pt holds it under the item's key, bytes and all.
  const dcp::StorageRef& s = c.md.tensors[0].chunks[0].storage;
  c.items["optim.param_groups"] = c.sources[0].substr(s.offset, s.length);
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  test::TempDir tmp;
  const std::string pt = tmp.Sub("model.pt"), item = tmp.Sub("item.pt");
  std::ofstream(pt, std::ios::binary) << Materialize(view->model_pt, c.sources);
  std::ofstream(item, std::ios::binary) << c.items["optim.param_groups"];
  const std::string cmd = "/usr/bin/python3 -c 'import sys, torch; m = torch.load(sys.argv[1]); "
                          "t = torch.load(sys.argv[2]); g = m[\"optim\"][\"param_groups\"]; "
                          "assert torch.equal(g, t) and g.dtype == t.dtype, (g, t); "
                          "assert t.numel() > 0' " + pt + " " + item;
  EXPECT_EQ(std::system(cmd.c_str()), 0);

  c.items.erase("optim.param_groups");
  view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.status().message().find("optim.param_groups"), std::string::npos);

  c.items["optim.param_groups"] = "not an archive";
  view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), Code::kInvalid);
}

TEST(DcpView, MissingChunkFailsNamingTheTensor) {
  Checkpoint c = LoadFixture("dcp_torch_save");
  for (dcp::TensorEntry& t : c.md.tensors) {
    if (t.fqn == "model.w") t.chunks.pop_back();
  }
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), Code::kInvalid);
  EXPECT_EQ(view.status().message(),
            "dcp view: the chunks of tensor 'model.w' leave element [4, 0] uncovered");
}

TEST(DcpView, WithoutPlannerDataModelPrefixDecides) {
  Checkpoint c = LoadFixture("dcp_torch_save");
  c.md.key_paths.clear();
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const auto want = ExpectedTensors(c);
  const TorchFile tf = CheckModelPt(Materialize(view->model_pt, c.sources), want, c.md);
  // Flat keys at the top level, as _EmptyStateDictLoadPlanner sets them.
  ASSERT_TRUE(Get(tf.root, "model.w"));
  ASSERT_TRUE(Get(tf.root, "optim.state.0.step"));
  CheckSafetensors(Materialize(view->model_safetensors, c.sources), UnderModel(want));
}

// ---------------------------------------------------------------------------------------------
// Hand-made layouts: an int32 tensor whose element i holds i, saved in chunks.

struct ChunkSpec {
  std::vector<int64_t> offsets, sizes;
  bool transposed = false;  // stored with its dimensions reversed (a .t() view torch.save kept)
};

// One data file holding every chunk back to back; the tensor is "model.x" of `shape`.
Checkpoint MakeSharded(const std::vector<int64_t>& shape, const std::vector<ChunkSpec>& specs) {
  Checkpoint c;
  c.sources.emplace_back();
  std::string& file = c.sources[0];
  dcp::TensorEntry t{"model.x", "int32", shape, false, {}};
  FileDescription desc;
  const size_t n = shape.size();
  for (const ChunkSpec& s : specs) {
    TensorInfo info{"model.x", "int32", s.sizes, {}, file.size(), 0, {}, {}};
    if (s.sizes != shape) {
      info.global_shape = shape;
      info.global_offset = s.offsets;
    }
    uint64_t count = 1;
    for (int64_t x : s.sizes) count *= x;
    // Strides in elements of the stored layout.
    std::vector<int64_t> stride(n, 1);
    if (s.transposed) {
      for (size_t j = 1; j < n; ++j) stride[j] = stride[j - 1] * s.sizes[j - 1];
      info.stride = stride;
    } else {
      for (size_t j = n; j-- > 1;) stride[j - 1] = stride[j] * s.sizes[j];
    }
    std::string data(count * 4, '\0');
    std::vector<int64_t> idx(n, 0);
    for (uint64_t k = 0; k < count; ++k) {
      int64_t global = 0, at = 0;
      for (size_t j = 0; j < n; ++j) {
        global = global * shape[j] + s.offsets[j] + idx[j];
        at += idx[j] * stride[j];
      }
      const auto v = static_cast<int32_t>(global);
      std::memcpy(&data[at * 4], &v, 4);
      for (size_t j = n; j-- > 0;) {
        if (++idx[j] < s.sizes[j]) break;
        idx[j] = 0;
      }
    }
    info.length = data.size();
    file += data;
    desc.tensors.push_back(info);
    t.chunks.push_back({s.offsets, s.sizes, {"__0_0.distcp", info.offset, info.length, {}}});
  }
  c.md.order.emplace_back(true, c.md.tensors.size());
  c.md.tensors.push_back(t);
  c.md.key_paths["model.x"] = {"model", "x"};
  c.files.push_back({"__0_0.distcp", 0, desc});
  return c;
}

std::string Iota(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

void CheckLayout(const std::vector<int64_t>& shape, const std::vector<ChunkSpec>& specs) {
  const Checkpoint c = MakeSharded(shape, specs);
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const std::string want = Iota(shape);
  CheckModelPt(Materialize(view->model_pt, c.sources), {{"model.x", want}}, c.md);
  CheckSafetensors(Materialize(view->model_safetensors, c.sources), {{"x", want}});
}

TEST(DcpViewLayout, TwoDimsSplitAlongDimOneIsOneGather) {
  const Checkpoint c = MakeSharded({4, 10}, {{{0, 0}, {4, 3}}, {{0, 3}, {4, 5}}, {{0, 8}, {4, 2}}});
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  // The safetensors file: the header, then one gather of 4 rows and 3 parts, one per chunk.
  const auto& segs = view->model_safetensors.recipe.segments();
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[1].rows, 4u);
  ASSERT_EQ(segs[1].parts.size(), 3u);
  EXPECT_EQ(segs[1].parts[1].len, 5u * 4);
  EXPECT_EQ(segs[1].parts[1].stride, 5u * 4);
  CheckLayout({4, 10}, {{{0, 0}, {4, 3}}, {{0, 3}, {4, 5}}, {{0, 8}, {4, 2}}});
}

TEST(DcpViewLayout, NDimensionalSplits) {
  CheckLayout({6}, {{{4}, {2}}, {{0}, {4}}});                                // 1-D, out of order
  CheckLayout({5, 3}, {{{0, 0}, {2, 3}}, {{2, 0}, {3, 3}}});                 // rows
  CheckLayout({3, 4, 6}, {{{0, 0, 0}, {3, 4, 2}}, {{0, 0, 2}, {3, 4, 4}}});  // last dim
  CheckLayout({2, 3, 4}, {{{0, 0, 0}, {2, 3, 1}}, {{0, 0, 1}, {2, 3, 3}}});
  // Blocks: dims 0 and 2 of a 3-D tensor, uneven.
  CheckLayout({5, 2, 6}, {{{0, 0, 0}, {2, 2, 4}},
                          {{0, 0, 4}, {2, 2, 2}},
                          {{2, 0, 0}, {3, 2, 1}},
                          {{2, 0, 1}, {3, 2, 5}}});
  // 4-D split along dims 1 and 3.
  CheckLayout(
      {2, 4, 3, 4},
      {{{0, 0, 0, 0}, {2, 1, 3, 4}}, {{0, 1, 0, 0}, {2, 3, 3, 2}}, {{0, 1, 0, 2}, {2, 3, 3, 2}}});
  // A 2-D grid of 2x2 blocks.
  CheckLayout({4, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {2, 2}}, {{2, 2}, {2, 2}}});
  // Transposed chunks (stored column-major), alone and beside contiguous ones.
  CheckLayout({4, 3}, {{{0, 0}, {4, 3}, true}});
  CheckLayout({4, 3}, {{{0, 0}, {1, 3}, true}, {{1, 0}, {3, 3}}});
  CheckLayout({2, 3, 4}, {{{0, 0, 0}, {2, 3, 2}, true}, {{0, 0, 2}, {2, 3, 2}}});
  // Size-1 and 0-d tensors, and an empty chunk.
  CheckLayout({1, 5}, {{{0, 0}, {1, 2}}, {{0, 2}, {1, 3}}, {{0, 5}, {1, 0}}});
  CheckLayout({}, {{{}, {}}});
  CheckLayout({0, 3}, {{{0, 0}, {0, 3}}});
}

TEST(DcpViewLayout, GapsAndOverlapsFailNamingTheElement) {
  auto fails = [](const std::vector<int64_t>& shape, const std::vector<ChunkSpec>& specs) {
    const Checkpoint c = MakeSharded(shape, specs);
    auto view = PlanDcpConsolidated(c.md, c.files, c.items);
    EXPECT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), Code::kInvalid);
    return view.status().message();
  };
  EXPECT_EQ(fails({4, 10}, {{{0, 0}, {4, 3}}, {{0, 4}, {4, 6}}}),
            "dcp view: the chunks of tensor 'model.x' leave element [0, 3] uncovered");
  EXPECT_EQ(fails({4, 10}, {{{0, 0}, {4, 5}}, {{0, 4}, {4, 6}}}),
            "dcp view: the chunks of tensor 'model.x' overlap at element [0, 4]");
  EXPECT_EQ(fails({4, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {2, 2}}}),
            "dcp view: the chunks of tensor 'model.x' leave element [2, 2] uncovered");
  EXPECT_EQ(fails({6}, {{{0}, {4}}, {{0}, {6}}}),
            "dcp view: the chunks of tensor 'model.x' overlap at element [0]");
  EXPECT_EQ(fails({3, 2, 4}, {{{0, 0, 0}, {3, 2, 4}}, {{1, 0, 0}, {1, 2, 4}}}),
            "dcp view: the chunks of tensor 'model.x' overlap at element [1, 0, 0]");
  EXPECT_EQ(fails({3, 2, 4}, {{{0, 0, 0}, {1, 2, 4}}, {{2, 0, 0}, {1, 2, 4}}}),
            "dcp view: the chunks of tensor 'model.x' leave element [1, 0, 0] uncovered");
}

TEST(DcpViewLayout, ChunkMissingFromTheDescriptionFails) {
  Checkpoint c = MakeSharded({4, 10}, {{{0, 0}, {4, 3}}, {{0, 3}, {4, 7}}});
  c.files[0].desc.tensors.pop_back();
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().message(),
            "dcp view: the chunk at [0, 3] of tensor 'model.x' is not in the description of "
            "__0_0.distcp");
}

TEST(DcpViewLayout, ListIndicesBuildLists) {
  // planner_data holds ints for the items of a list (torch's traverse_state_dict numbers them);
  // set_element rebuilds a list there, None in the holes.
  Checkpoint c = MakeSharded({2, 2}, {{{0, 0}, {2, 2}}});
  c.md.order.emplace_back(true, c.md.tensors.size());
  c.md.tensors.push_back(c.md.tensors[0]);
  c.md.tensors[0].fqn = "opt.bufs.2";
  c.md.tensors[1].fqn = "model.x";
  c.md.tensors[1].requires_grad = true;
  c.files[0].desc.tensors.push_back(c.files[0].desc.tensors[0]);
  c.files[0].desc.tensors[0].name = "opt.bufs.2";
  DcpKeyPaths paths{{"opt.bufs.2", {{"opt"}, {"bufs"}, {"2", true}}},
                    {"model.x", {{"model"}, {"x"}}}};
  auto view = PlanDcpConsolidated(c.md, paths, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  const std::string want = Iota({2, 2});
  // The list's tensor is named by its path (opt.bufs.2) and comes first in pickle order.
  const TorchFile tf = CheckModelPt(Materialize(view->model_pt, c.sources),
                                    {{"opt.bufs.2", want}, {"model.x", want}}, c.md);
  ValuePtr bufs = Get(Get(tf.root, "opt"), "bufs");
  ASSERT_TRUE(bufs);
  ASSERT_EQ(bufs->kind, Kind::kList);
  ASSERT_EQ(bufs->items.size(), 3u);
  EXPECT_EQ(bufs->items[0]->kind, Kind::kNone);
  EXPECT_EQ(bufs->items[1]->kind, Kind::kNone);
  EXPECT_EQ(tf.pickle.tensors[0].storage_key, "0");
  EXPECT_TRUE(tf.pickle.tensors[1].requires_grad);
  CheckSafetensors(Materialize(view->model_safetensors, c.sources), {{"x", want}});

  // A dict key into a list fails, as it does in torch's set_element.
  paths["model.x"] = {{"opt"}, {"bufs"}, {"x"}};
  view = PlanDcpConsolidated(c.md, paths, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.status().message().find("'model.x'"), std::string::npos)
      << view.status().message();
}

TEST(DcpViewLayout, NoModelKeyPutsEveryTensorInSafetensors) {
  Checkpoint c = MakeSharded({3}, {{{0}, {3}}});
  c.md.tensors[0].fqn = "net.x";
  c.md.key_paths = {{"net.x", {"net", "x"}}};
  c.files[0].desc.tensors[0].name = "net.x";
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  CheckSafetensors(Materialize(view->model_safetensors, c.sources), {{"net.x", Iota({3})}});
}

TEST(DcpViewLayout, ModelTensorSafetensorsCannotHoldFails) {
  Checkpoint c = MakeSharded({2}, {{{0}, {2}}});
  c.md.tensors[0].dtype = "complex128";  // 16 bytes: the int32 data no longer fits
  c.files[0].desc.tensors[0].dtype = "complex128";
  c.files[0].desc.tensors[0].length = 32;
  c.sources[0].resize(32);
  auto view = PlanDcpConsolidated(c.md, c.files, c.items);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().message(),
            "dcp view: tensor 'model.x' is complex128, which safetensors cannot hold");
}

}  // namespace
}  // namespace ckptfs::reshard
