// The fixtures in tests/formats/data/safetensors were written by make_safetensors_fixtures.py,
// which follows the safetensors specification and the reference writer's layout byte for byte,
// because the reference library is not packaged for Debian 12 (no python3-safetensors). Tensor
// bytes in them come from Debian's torch and numpy.
#include "formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace ckptfs::safetensors {
namespace {

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(CKPTFS_TEST_DATA) + "/safetensors/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Header MustParse(const std::string& file) {
  auto r = ParseHeader(file, file.size());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : Header();
}

const TensorInfo* FindTensor(const Header& h, std::string_view name) {
  for (const TensorInfo& t : h.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string Bytes(const std::string& file, const TensorInfo& t) {
  return file.substr(t.offset, t.length);
}

std::string Le32Floats(std::initializer_list<float> fs) {
  std::string out;
  for (float f : fs) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(u >> (8 * i)));
  }
  return out;
}

// A file made of an explicit header text and `data_len` zero bytes.
std::string Craft(std::string_view json, size_t data_len = 0) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out.append(json);
  out.append(data_len, '\0');
  return out;
}

// Parsing must fail with kCorrupt, and the message must mention `needle`.
void ExpectCorrupt(const std::string& file, std::string_view needle) {
  auto r = ParseHeader(file, file.size());
  ASSERT_FALSE(r.ok()) << "accepted a file that should fail with: " << needle;
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

TEST(SafetensorsTest, BasicFixture) {
  const std::string file = ReadFixture("basic.safetensors");
  Header h = MustParse(file);
  ASSERT_TRUE(h.metadata.has_value());
  ASSERT_EQ(h.metadata->size(), 1u);
  EXPECT_EQ((*h.metadata)[0], (std::pair<std::string, std::string>("format", "pt")));
  EXPECT_EQ(h.header_len % 8, 0u);  // the reference writer's padding
  EXPECT_EQ(h.file_size(), file.size());
  ASSERT_EQ(h.tensors.size(), 8u);
  // The reference layout: descending dtype, then name; here the header lists them in that order.
  const char* order[] = {"step",   "scale",         "freqs", "embed.weight",
                         "counts", "layers.0.bias", "empty", "mask"};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(h.tensors[i].name, order[i]);

  const TensorInfo* w = FindTensor(h, "embed.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, Dtype::kF32);
  EXPECT_EQ(w->shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(w->length, 48u);
  EXPECT_EQ(Bytes(file, *w), Le32Floats({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));

  const TensorInfo* step = FindTensor(h, "step");
  EXPECT_TRUE(step->shape.empty());  // a scalar
  EXPECT_EQ(step->offset, h.data_start());
  EXPECT_EQ(Bytes(file, *step), std::string("\xe8\x03\0\0\0\0\0\0", 8));  // 1000

  EXPECT_EQ(Bytes(file, *FindTensor(h, "layers.0.bias")),
            std::string("\x80\x3f\x00\xc0\x00\x3f", 6));
  EXPECT_EQ(Bytes(file, *FindTensor(h, "mask")), std::string("\1\0\1\1\0", 5));
  EXPECT_EQ(Bytes(file, *FindTensor(h, "freqs")), Le32Floats({1, 2, -3, 0.5}));
  const TensorInfo* empty = FindTensor(h, "empty");
  EXPECT_EQ(empty->dtype, Dtype::kF16);
  EXPECT_EQ(empty->shape, (std::vector<uint64_t>{0, 4}));
  EXPECT_EQ(empty->length, 0u);
  // Offsets tile the buffer.
  uint64_t next = h.data_start();
  for (const TensorInfo& t : h.tensors) {
    EXPECT_EQ(t.offset, next) << t.name;
    next += t.length;
  }
  EXPECT_EQ(next, file.size());
}

TEST(SafetensorsTest, EveryDtypeOfTheSpec) {
  const std::string file = ReadFixture("all_dtypes.safetensors");
  Header h = MustParse(file);
  EXPECT_FALSE(h.metadata.has_value());
  ASSERT_EQ(h.tensors.size(), 22u);
  for (int i = 0; i <= static_cast<int>(Dtype::kU64); ++i) {
    const auto d = static_cast<Dtype>(i);
    EXPECT_EQ(DtypeFromName(DtypeName(d)), d);
    bool found = false;
    for (const TensorInfo& t : h.tensors) found |= t.dtype == d;
    EXPECT_TRUE(found) << DtypeName(d);
  }
  EXPECT_EQ(DtypeFromName("f32"), std::nullopt);  // names are case-sensitive
  EXPECT_EQ(DtypeBits(Dtype::kF4), 4u);
  EXPECT_EQ(DtypeBits(Dtype::kF6E3M2), 6u);
  EXPECT_EQ(DtypeBits(Dtype::kC64), 64u);
  EXPECT_EQ(FindTensor(h, "f4")->length, 2u);       // 4 elements of 4 bits
  EXPECT_EQ(FindTensor(h, "f6_e2m3")->length, 3u);  // 4 elements of 6 bits
  EXPECT_EQ(Bytes(file, *FindTensor(h, "f4")), "\x21\x43");
  EXPECT_EQ(Bytes(file, *FindTensor(h, "u64")),
            std::string("\1\0\0\0\0\0\0\0", 8) + std::string(8, '\xff'));
  EXPECT_EQ(Bytes(file, *FindTensor(h, "f8_e4m3")), "\x38\xb8");
}

TEST(SafetensorsTest, NamesWithEscapesAndUnicode) {
  Header h = MustParse(ReadFixture("odd_names.safetensors"));
  EXPECT_NE(FindTensor(h, "quote\"back\\slash"), nullptr);
  EXPECT_NE(FindTensor(h,
                       "new\nline\ttab\x01"
                       "ctl\x7f"),
            nullptr);
  EXPECT_NE(FindTensor(h, "caf\xc3\xa9.\xe6\x9d\x83\xe9\x87\x8d.\xf0\x9f\x98\x80"), nullptr);
  EXPECT_NE(FindTensor(h, "slash/ok"), nullptr);
}

TEST(SafetensorsTest, HeaderOrderIsKeptWhileOffsetsDecideValidity) {
  const std::string file = ReadFixture("header_order.safetensors");
  Header h = MustParse(file);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "b");
  EXPECT_EQ(h.tensors[1].name, "c");
  EXPECT_EQ(h.tensors[2].name, "a");
  EXPECT_EQ(h.tensors[1].offset, h.data_start());  // c holds the first bytes of the buffer
  EXPECT_EQ(Bytes(file, h.tensors[2]), Le32Floats({1, 2}));
  EXPECT_EQ(Bytes(file, h.tensors[0]), std::string("\3\0\4\0", 4));
  ASSERT_TRUE(h.metadata.has_value());
  ASSERT_EQ(h.metadata->size(), 2u);
  EXPECT_EQ((*h.metadata)[0].first, "z");
  EXPECT_EQ((*h.metadata)[1].second, "");
}

// The writer, given what the reader found and the reference order, reproduces the fixture's
// header byte for byte: same layout, same escapes, same padding.
TEST(SafetensorsTest, WriterReproducesFixturesByteForByte) {
  for (const char* name :
       {"basic.safetensors", "all_dtypes.safetensors", "odd_names.safetensors"}) {
    const std::string file = ReadFixture(name);
    Header h = MustParse(file);
    std::vector<TensorSpec> specs;
    for (const TensorInfo& t : h.tensors) specs.push_back({t.name, t.dtype, t.shape});
    std::reverse(specs.begin(), specs.end());  // the order given must not matter after sorting
    SortLikeReference(&specs);
    auto built = BuildHeader(specs, h.metadata);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_EQ(built->bytes, file.substr(0, h.data_start())) << name;
    EXPECT_EQ(built->file_size, file.size());
    ASSERT_EQ(built->tensors.size(), h.tensors.size());
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      EXPECT_EQ(built->tensors[i].name, h.tensors[i].name);
      EXPECT_EQ(built->tensors[i].offset, h.tensors[i].offset);
      EXPECT_EQ(built->tensors[i].length, h.tensors[i].length);
    }
  }
}

TEST(SafetensorsTest, HeaderBytesNeededForAStreamingCaller) {
  const std::string file = ReadFixture("basic.safetensors");
  const auto* p = reinterpret_cast<const uint8_t*>(file.data());
  for (size_t len = 0; len < 8; ++len) EXPECT_EQ(*HeaderBytesNeeded(p, len), 8u);
  const uint64_t need = *HeaderBytesNeeded(p, 8);
  EXPECT_EQ(need, 8 + 528u);
  EXPECT_EQ(*HeaderBytesNeeded(p, file.size()), need);
  // Exactly that many bytes parse (the file size left to the caller); one fewer does not.
  EXPECT_TRUE(ParseHeader(p, need).ok());
  EXPECT_EQ(ParseHeader(p, need - 1).status().code(), Code::kCorrupt);
  auto h = ParseHeader(p, need);
  EXPECT_EQ(h->file_size(), file.size());
  // The file-size check is there when asked for.
  EXPECT_FALSE(ParseHeader(p, need, file.size() - 1).ok());
  EXPECT_FALSE(ParseHeader(p, need, file.size() + 1).ok());
}

TEST(SafetensorsTest, EveryTruncationIsAnError) {
  for (const char* name : {"basic.safetensors", "all_dtypes.safetensors", "odd_names.safetensors",
                           "header_order.safetensors"}) {
    const std::string file = ReadFixture(name);
    for (size_t len = 0; len < file.size(); ++len) {
      auto r = ParseHeader(file.substr(0, len), len);
      ASSERT_FALSE(r.ok()) << name << " truncated to " << len;
      EXPECT_EQ(r.status().code(), Code::kCorrupt);
    }
  }
}

// Flipping any bit of the header either still parses or gives kCorrupt; it never crashes (the
// fuzzer covers this more broadly).
TEST(SafetensorsTest, BitFlipsNeverCrash) {
  const std::string file = ReadFixture("basic.safetensors");
  const size_t header_end = 8 + 528;
  for (size_t i = 0; i < header_end; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = file;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      auto r = ParseHeader(bad, bad.size());
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), Code::kCorrupt);
      }
    }
  }
}

TEST(SafetensorsTest, HeaderLengthLimits) {
  std::string file(8, '\0');
  const uint64_t too_big = kMaxHeaderLen + 1;
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(too_big >> (8 * i));
  file += "{}";
  EXPECT_EQ(HeaderBytesNeeded(reinterpret_cast<const uint8_t*>(file.data()), 8).status().code(),
            Code::kCorrupt);
  ExpectCorrupt(file, "exceeds the limit");
  std::string huge(8, '\xff');  // N = 2^64 - 1 must not overflow 8 + N
  ExpectCorrupt(huge, "exceeds the limit");
  ExpectCorrupt(Craft("{}").substr(0, 9), "truncated");
  ExpectCorrupt(std::string(7, '\0'), "truncated");
}

TEST(SafetensorsTest, WhitespaceAroundTheObjectIsAccepted) {
  // The reference's own test: leading tab and newline, trailing CR and space.
  auto r = ParseHeader(Craft("\t\n{}\r "), 8 + 6);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tensors.empty());
  EXPECT_EQ(r->data_len, 0u);
  EXPECT_TRUE(ParseHeader(Craft("{}      "), 16).ok());
}

TEST(SafetensorsTest, MalformedHeadersAreCorrupt) {
  ExpectCorrupt(Craft(""), "json");
  ExpectCorrupt(Craft("[]"), "not a JSON object");
  ExpectCorrupt(Craft("{\"a\":1"), "at byte");
  ExpectCorrupt(Craft("{\"\xff\":1}"), "invalid UTF-8");
  ExpectCorrupt(Craft(R"({"t":5})"), "not an object");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":[1]}})", 4), "needs");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", 4),
                "unknown dtype");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4),
                "unknown dtype");
  ExpectCorrupt(Craft(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4), "not a string");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                "dimension");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4),
                "dimension");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4),
                "not an array");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", 4),
                "data_offsets");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})", 4),
                "data_offsets");
  ExpectCorrupt(Craft(R"({"__metadata__":{"k":1}})"), "not a string");
  ExpectCorrupt(Craft(R"({"__metadata__":["k"]})"), "not an object");
  ExpectCorrupt(Craft(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                      R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                      2),
                "duplicate");
}

TEST(SafetensorsTest, OffsetsMustTileTheBuffer) {
  const std::string two = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"I16","shape":[2],"data_offsets":[8,12]}})";
  EXPECT_TRUE(ParseHeader(Craft(two, 12), 8 + two.size() + 12).ok());
  ExpectCorrupt(Craft(two, 13), "its header describes");  // trailing bytes
  ExpectCorrupt(Craft(two, 11), "its header describes");  // missing bytes
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"I16","shape":[2],"data_offsets":[6,10]}})",
                      10),
                "overlaps");
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"I16","shape":[2],"data_offsets":[10,14]}})",
                      14),
                "hole");
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "hole");
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4),
                "ends before it begins");
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                "its dtype and shape need 12");
  // Sub-byte dtypes must fill whole bytes.
  ExpectCorrupt(Craft(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
                "whole number of bytes");
  const std::string f6 = Craft(R"({"a":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}})", 3);
  EXPECT_TRUE(ParseHeader(f6, f6.size()).ok());
  // Element and bit counts that overflow 64 bits.
  ExpectCorrupt(Craft(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],)"
                      R"("data_offsets":[0,0]}})"),
                "overflows");
  ExpectCorrupt(Craft(R"({"a":{"dtype":"U64","shape":[4611686018427387904],)"
                      R"("data_offsets":[0,0]}})"),
                "overflows");
}

TEST(SafetensorsTest, ReferencePolyglotExampleIsRejected) {
  // The reference's test_polyglot: valid header and data followed by extra bytes.
  std::string file = Craft(R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  ASSERT_EQ(file.size(), 8u + 60 + 16);
  EXPECT_TRUE(ParseHeader(file, file.size()).ok());
  file += "extra_bogus_data_for_polyglot_file";
  ExpectCorrupt(file, "describes");
}

TEST(SafetensorsTest, EdgeCasesTheReferenceAccepts) {
  // Zero-sized tensors share an offset; unknown fields are ignored; null metadata is none.
  const std::string json =
      R"({"__metadata__":null,"e1":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
      R"("e2":{"dtype":"BF16","shape":[5,0],"data_offsets":[0,0],"extra":[1,{"x":2}]},)"
      R"("s":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})";
  auto r = ParseHeader(Craft(json, 1), 8 + json.size() + 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->metadata.has_value());
  ASSERT_EQ(r->tensors.size(), 3u);
  EXPECT_EQ(r->tensors[2].length, 1u);
  EXPECT_EQ(r->tensors[2].offset, 8 + json.size());
  EXPECT_EQ(r->tensors[0].offset, 8 + json.size());
}

TEST(SafetensorsTest, WriterPadsAndRoundTrips) {
  for (size_t name_len = 1; name_len <= 16; ++name_len) {
    std::vector<TensorSpec> specs = {{std::string(name_len, 'x'), Dtype::kBF16, {2, 3}},
                                     {"y", Dtype::kF4, {2}}};
    auto built = BuildHeader(specs, Metadata{{"format", "pt"}});
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_EQ(built->bytes.size() % 8, 0u);
    std::string file = built->bytes + std::string(built->file_size - built->bytes.size(), '\7');
    Header h = MustParse(file);
    ASSERT_EQ(h.tensors.size(), 2u);
    EXPECT_EQ(h.tensors[0].name, specs[0].name);
    EXPECT_EQ(h.tensors[0].length, 12u);
    EXPECT_EQ(h.tensors[1].length, 1u);
    EXPECT_EQ(h.tensors[1].offset, built->tensors[1].offset);
  }
  // No metadata: no "__metadata__"; empty metadata: an empty object, as the reference writes it.
  auto none = BuildHeader({{"a", Dtype::kU8, {1}}}, std::nullopt);
  EXPECT_EQ(none->bytes.substr(8), R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})"
                                   "   ");
  auto empty = BuildHeader({}, Metadata{});
  EXPECT_EQ(empty->bytes.substr(8), R"({"__metadata__":{}})"
                                    "     ");
  EXPECT_EQ(empty->file_size, 8u + 24);
}

TEST(SafetensorsTest, WriterRejectsWhatTheFormatCannotHold) {
  EXPECT_EQ(BuildHeader({{"a", Dtype::kU8, {1}}, {"a", Dtype::kU8, {1}}}, {}).status().code(),
            Code::kInvalid);
  EXPECT_EQ(BuildHeader({{"__metadata__", Dtype::kU8, {1}}}, {}).status().code(), Code::kInvalid);
  EXPECT_EQ(BuildHeader({{"f4", Dtype::kF4, {3}}}, {}).status().code(), Code::kInvalid);
  EXPECT_EQ(BuildHeader({{"\xc3", Dtype::kU8, {1}}}, {}).status().code(), Code::kInvalid);
  EXPECT_EQ(BuildHeader({}, Metadata{{"k", "\xff"}}).status().code(), Code::kInvalid);
  EXPECT_EQ(BuildHeader({{"a", Dtype::kU64, {1ull << 62}}}, {}).status().code(), Code::kInvalid);
  EXPECT_EQ(BuildHeader({{"a", Dtype::kU8, {1ull << 63}}, {"b", Dtype::kU8, {1ull << 63}}}, {})
                .status()
                .code(),
            Code::kInvalid);
}

// A header the size of a large model's (10^5 tensors, about 8 MB of JSON) builds and parses.
TEST(SafetensorsTest, LargeHeader) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 100000; ++i) {
    specs.push_back({"model.layers." + std::to_string(i) + ".mlp.weight", Dtype::kBF16, {64, 8}});
  }
  auto built = BuildHeader(specs, Metadata{{"format", "pt"}});
  ASSERT_TRUE(built.ok());
  EXPECT_GT(built->bytes.size(), 8'000'000u);
  // The data is not needed to parse the header; the file size is checked all the same.
  auto h = ParseHeader(built->bytes, built->file_size);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors.size(), 100000u);
  EXPECT_EQ(h->tensors.back().offset + h->tensors.back().length, built->file_size);
}

}  // namespace
}  // namespace ckptfs::safetensors
