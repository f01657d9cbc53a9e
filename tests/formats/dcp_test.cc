// The DCP metadata parser and data-file describer against the fixtures written by
// tests/formats/data/make_dcp_fixtures.py (FileSystemWriter's layout with real torch.save items;
// the .expect files hold where Python's zipfile and the safetensors header put each chunk's data).
#include "formats/dcp.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "formats/describe.h"
#include "formats/pickle.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

std::string Data(const std::string& name) {
  return std::string(CKPTFS_SOURCE_DIR) + "/tests/formats/data/" + name;
}

using test::Fnv1a64;

std::string ReadAll(const std::string& path) { return test::ReadFileBytes(path); }

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> out;
  if (s == "-") return out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) out.push_back(std::stoll(part));
  return out;
}

struct ExpectedChunk {
  std::string fqn, dtype;
  std::vector<int64_t> size, offsets, sizes;
  std::string file;
  uint64_t raw_offset, raw_length, hash;
};
struct ExpectedBytes {
  std::string fqn, file;
  uint64_t offset, length;
};

void LoadExpect(const std::string& name, std::vector<ExpectedChunk>* chunks,
                std::vector<ExpectedBytes>* bytes) {
  std::istringstream in(ReadAll(Data(name + ".expect")));
  std::string kind;
  while (in >> kind) {
    if (kind == "bytes") {
      ExpectedBytes b;
      in >> b.fqn >> b.file >> b.offset >> b.length;
      bytes->push_back(b);
    } else {
      ExpectedChunk c;
      std::string size, offsets, sizes;
      in >> c.fqn >> c.dtype >> size >> offsets >> sizes >> c.file >> c.raw_offset >>
          c.raw_length >> c.hash;
      c.size = Ints(size);
      c.offsets = Ints(offsets);
      c.sizes = Ints(sizes);
      chunks->push_back(c);
    }
  }
}

zip::ReadAtFn Reader(const std::string& bytes) {
  return [&bytes](uint64_t off, size_t len) -> Result<std::string> {
    if (off > bytes.size() || len > bytes.size() - off) return Corrupt("read past the end");
    return bytes.substr(off, len);
  };
}

class DcpFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DcpFixture, MetadataAndDataFilesMatchWhatTorchWrote) {
  const std::string dir = GetParam();
  std::vector<ExpectedChunk> want;
  std::vector<ExpectedBytes> want_bytes;
  LoadExpect(dir, &want, &want_bytes);
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(want_bytes.size(), 2u);

  auto md = dcp::ParseMetadata(ReadAll(Data(dir + "/.metadata")));
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->tensors.size(), 5u);  // model.w is one tensor in two chunks
  EXPECT_EQ(md->Files(), (std::vector<std::string>{"__0_0.distcp", "__1_0.distcp"}));
  EXPECT_EQ(md->version, dir == "dcp_torch22" ? "" : "1.0.0");
  EXPECT_EQ(md->key_paths.at("optim.state.0.step"),
            (std::vector<std::string>{"optim", "state", "0", "step"}));

  ASSERT_EQ(md->bytes.size(), want_bytes.size());
  for (size_t i = 0; i < want_bytes.size(); ++i) {
    EXPECT_EQ(md->bytes[i].fqn, want_bytes[i].fqn);
    EXPECT_EQ(md->bytes[i].storage.relative_path, want_bytes[i].file);
    EXPECT_EQ(md->bytes[i].storage.offset, want_bytes[i].offset);
    EXPECT_EQ(md->bytes[i].storage.length, want_bytes[i].length);
  }
  for (const ExpectedChunk& c : want) {
    const dcp::TensorEntry* t = nullptr;
    for (const auto& e : md->tensors) {
      if (e.fqn == c.fqn) t = &e;
    }
    ASSERT_NE(t, nullptr) << c.fqn;
    EXPECT_EQ(t->dtype, c.dtype);
    EXPECT_EQ(t->size, c.size);
    bool found = false;
    for (const dcp::Chunk& ch : t->chunks) {
      if (ch.offsets == c.offsets) {
        found = true;
        EXPECT_EQ(ch.sizes, c.sizes);
        EXPECT_EQ(ch.storage.relative_path, c.file);
      }
    }
    EXPECT_TRUE(found) << c.fqn;
  }

  // Each data file: the raw bytes of every chunk, named by fqn, with its place in the tensor.
  for (const std::string file : {"__0_0.distcp", "__1_0.distcp"}) {
    const std::string bytes = ReadAll(Data(dir + "/" + file));
    auto d = dcp::DescribeDataFile(*md, file, bytes.size(), Reader(bytes));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    size_t n = 0;
    for (const ExpectedChunk& c : want) {
      if (c.file != file) continue;
      ASSERT_LT(n, d->tensors.size());
      const TensorInfo& got = d->tensors[n++];
      EXPECT_EQ(got.name, c.fqn);
      EXPECT_EQ(got.dtype, c.dtype);
      EXPECT_EQ(got.shape, c.sizes);
      EXPECT_EQ(got.offset, c.raw_offset) << c.fqn;
      EXPECT_EQ(got.length, c.raw_length) << c.fqn;
      EXPECT_EQ(Fnv1a64(bytes, got.offset, got.length), c.hash) << c.fqn;
      if (c.sizes != c.size) {
        EXPECT_EQ(got.global_shape, c.size);
        EXPECT_EQ(got.global_offset, c.offsets);
      } else {
        EXPECT_TRUE(got.global_shape.empty());
      }
      // The transposed view is saved as it is, with its strides.
      EXPECT_EQ(got.stride.empty(), c.fqn != "model.t" || dir == "dcp_safetensors") << c.fqn;
    }
    EXPECT_EQ(n, d->tensors.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DcpFixture,
                         ::testing::Values("dcp_torch_save", "dcp_torch22", "dcp_safetensors"));

TEST(Dcp, MetadataIsRecognizedByContentAndDescribed) {
  const std::string bytes = ReadAll(Data("dcp_torch_save/.metadata"));
  auto d = DescribeFile("", bytes.size(), Reader(bytes));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->format, FileFormat::kDcpMetadata);
}

TEST(Dcp, DataFileWithoutMetadataListsItsArchives) {
  // Read by content alone (the mount has no file name): every archive, in file order.
  const std::string bytes = ReadAll(Data("dcp_torch_save/__1_0.distcp"));
  auto d = DescribeFile("", bytes.size(), Reader(bytes));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->format, FileFormat::kDcpData);
  std::vector<ExpectedChunk> want;
  std::vector<ExpectedBytes> want_bytes;
  LoadExpect("dcp_torch_save", &want, &want_bytes);
  std::vector<const ExpectedChunk*> rank1;
  for (const auto& c : want) {
    if (c.file == "__1_0.distcp") rank1.push_back(&c);
  }
  ASSERT_EQ(d->tensors.size(), rank1.size());
  for (size_t i = 0; i < rank1.size(); ++i) {
    EXPECT_EQ(d->tensors[i].name, std::to_string(i));
    EXPECT_EQ(d->tensors[i].offset, rank1[i]->raw_offset);
    EXPECT_EQ(d->tensors[i].length, rank1[i]->raw_length);
  }
}

TEST(Dcp, EveryTruncationOfMetadataIsAnError) {
  const std::string bytes = ReadAll(Data("dcp_torch_save/.metadata"));
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto md = dcp::ParseMetadata(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(md.ok()) << n;
    EXPECT_EQ(md.status().code(), Code::kCorrupt);
  }
}

// Rewrites one piece of the metadata tree and expects the parser to name the problem.
void ExpectRejected(const std::function<void(pickle::Value&)>& damage, const std::string& why) {
  auto tree = pickle::Read(ReadAll(Data("dcp_torch_save/.metadata")));
  ASSERT_TRUE(tree.ok());
  damage(**tree);
  auto bytes = pickle::Write(*tree, 4);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto md = dcp::ParseMetadata(*bytes);
  ASSERT_FALSE(md.ok()) << why;
  EXPECT_EQ(md.status().code(), Code::kCorrupt);
  EXPECT_NE(md.status().message().find(why), std::string::npos) << md.status().message();
}

pickle::Value& Field(pickle::Value& obj, const std::string& name) {
  for (auto& [k, v] : obj.state->pairs) {
    if (k->str == name) return *v;
  }
  throw std::runtime_error("no field " + name);
}

TEST(Dcp, DamagedMetadataIsRejectedWithAReason) {
  // model.w's first chunk made larger than the tensor.
  ExpectRejected(
      [](pickle::Value& root) {
        pickle::Value& sdm = Field(root, "state_dict_metadata");
        for (auto& [k, v] : sdm.pairs) {
          if (k->str != "model.w") continue;
          pickle::Value& chunk = *Field(*v, "chunks").items[0];
          Field(chunk, "sizes").args->items[0]->items[0]->i = 9;
        }
      },
      "outside the tensor");
  // A chunk's storage entry removed.
  ExpectRejected(
      [](pickle::Value& root) {
        pickle::Value& storage = Field(root, "storage_data");
        storage.pairs.erase(storage.pairs.begin() + 2);
      },
      "no storage entry");
  // Not Metadata at all.
  ExpectRejected([](pickle::Value& root) { root.callable->name = "NotMetadata"; },
                 "not a pickle of");
  // A dtype torch does not have.
  ExpectRejected(
      [](pickle::Value& root) {
        pickle::Value& sdm = Field(root, "state_dict_metadata");
        for (auto& [k, v] : sdm.pairs) {
          if (k->str == "model.b") Field(*v, "properties").state->items[0]->name = "float99";
        }
      },
      "unknown dtype");
}

TEST(Dcp, ItemsThatAreNotWhatTheMetadataSaysAreErrors) {
  auto md = dcp::ParseMetadata(ReadAll(Data("dcp_torch_save/.metadata")));
  ASSERT_TRUE(md.ok());
  std::string bytes = ReadAll(Data("dcp_torch_save/__0_0.distcp"));
  // Truncated data file: the last item lies past its end.
  const std::string cut = bytes.substr(0, bytes.size() - 10);
  auto d = dcp::DescribeDataFile(*md, "__0_0.distcp", cut.size(), Reader(cut));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("past the end"), std::string::npos);
  // A chunk whose storage points at the wrong archive: shapes disagree.
  for (auto& t : md->tensors) {
    if (t.fqn == "model.b") std::swap(t.chunks[0].storage, md->tensors[0].chunks[0].storage);
  }
  d = dcp::DescribeDataFile(*md, "__0_0.distcp", bytes.size(), Reader(bytes));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace ckptfs
