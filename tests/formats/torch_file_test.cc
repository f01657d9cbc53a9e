// The torch zip reader and the payload scanner against real torch.save output: the fixtures in
// tests/formats/data were written by Debian's torch, and their .expect files hold what Python's
// zipfile and torch itself report (see make_torch_fixtures.py).
#include "formats/torch_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "formats/describe.h"
#include "formats/payload_scan.h"
#include "formats/safetensors.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

std::string DataPath(const std::string& name) {
  return std::string(CKPTFS_SOURCE_DIR) + "/tests/formats/data/" + name;
}

std::string ReadAll(const std::string& path) { return test::ReadFileBytes(path); }

using test::Fnv1a64;

struct Expected {
  struct Record {
    uint64_t offset, size;
  };
  struct Tensor {
    std::string name, dtype, shape;
    uint64_t offset, length, hash;
  };
  std::map<std::string, Record> records;
  std::vector<Tensor> tensors;
};

Expected LoadExpected(const std::string& name) {
  Expected e;
  std::istringstream in(ReadAll(DataPath(name + ".expect")));
  std::string kind;
  while (in >> kind) {
    if (kind == "record") {
      std::string n;
      Expected::Record r;
      in >> n >> r.offset >> r.size;
      e.records[n] = r;
    } else {
      Expected::Tensor t;
      std::string hash;
      in >> t.name >> t.dtype >> t.shape >> t.offset >> t.length >> hash;
      t.hash = std::stoull(hash, nullptr, 16);
      e.tensors.push_back(t);
    }
  }
  return e;
}

zip::ReadAtFn ReaderOf(const std::string& bytes) {
  return [&bytes](uint64_t off, size_t len) -> Result<std::string> {
    if (off > bytes.size() || len > bytes.size() - off) return Corrupt("read past the end");
    return bytes.substr(off, len);
  };
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

// Every range the scanner announced, in order.
std::vector<ByteRange> AllRanges(PayloadScanner& s) {
  std::vector<ByteRange> out;
  uint64_t pos = 0;
  while (std::optional<ByteRange> r = s.NextPayload(pos)) {
    out.push_back(*r);
    pos = r->end;
  }
  return out;
}

class TorchFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchFixture, DirectoryMatchesPythonZipfile) {
  const std::string bytes = ReadAll(DataPath(std::string(GetParam()) + ".pt"));
  const Expected want = LoadExpected(GetParam());
  auto dir = zip::ReadDirectory(bytes.size(), ReaderOf(bytes));
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ASSERT_EQ(dir->entries.size(), want.records.size());
  for (const zip::Entry& e : dir->entries) {
    auto it = want.records.find(e.name);
    ASSERT_NE(it, want.records.end()) << e.name;
    EXPECT_EQ(e.data_offset, it->second.offset) << e.name;
    EXPECT_EQ(e.size, it->second.size) << e.name;
    EXPECT_EQ(e.data_offset % 64, 0u) << "torch aligns record data to 64 bytes: " << e.name;
  }
}

TEST_P(TorchFixture, TensorsMatchTorch) {
  const std::string bytes = ReadAll(DataPath(std::string(GetParam()) + ".pt"));
  const Expected want = LoadExpected(GetParam());
  auto f = ReadTorchFile(bytes.size(), ReaderOf(bytes));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->pickle.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const TorchTensor& t = f->pickle.tensors[i];
    const Expected::Tensor& w = want.tensors[i];
    EXPECT_EQ(t.name, w.name);
    EXPECT_EQ(t.dtype, w.dtype) << w.name;
    EXPECT_EQ(ShapeText(t.shape), w.shape) << w.name;
    EXPECT_EQ(t.offset, w.offset) << w.name;
    EXPECT_EQ(t.length, w.length) << w.name;
    // The range holds exactly the bytes torch has for the tensor.
    ASSERT_LE(t.offset + t.length, bytes.size());
    EXPECT_EQ(Fnv1a64(bytes, t.offset, t.length), w.hash) << w.name;
  }
}

// The scanner sees the file as a writer produces it, in pieces of any size, and must find every
// storage record exactly, before its first byte arrives.
TEST_P(TorchFixture, ScannerFindsEveryStorageRecord) {
  const std::string bytes = ReadAll(DataPath(std::string(GetParam()) + ".pt"));
  const Expected want = LoadExpected(GetParam());
  std::vector<ByteRange> expect;
  for (const auto& [name, r] : want.records) {
    if (name.find("/data/") != std::string::npos && r.size > 0) {
      expect.push_back({r.offset, r.offset + r.size});
    }
  }
  std::sort(expect.begin(), expect.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  for (uint64_t seed : {1, 2, 3, 4}) {
    PayloadScanOptions opts;
    opts.min_payload_bytes = 1;
    auto scanner = NewPayloadScanner(opts);
    test::SplitMix64 rng(seed);
    std::vector<ByteRange> found;
    uint64_t fed = 0;
    while (fed < bytes.size()) {
      const size_t n = std::min<size_t>(bytes.size() - fed, 1 + rng.Below(seed == 1 ? 7 : 70000));
      scanner->Feed(reinterpret_cast<const uint8_t*>(bytes.data()) + fed, n);
      fed += n;
      // Everything announced so far, taken as a writer takes it (in order, never going back).
      uint64_t pos = found.empty() ? 0 : found.back().end;
      while (auto r = scanner->NextPayload(pos)) {
        if (found.empty() || found.back().begin != r->begin) {
          EXPECT_LE(r->begin, fed) << "a range must not be announced ahead of its header";
          found.push_back(*r);
        }
        if (r->end > fed) break;
        pos = r->end;
      }
    }
    EXPECT_EQ(scanner->format(), "torch-zip");
    ASSERT_EQ(found.size(), expect.size()) << "seed " << seed;
    for (size_t i = 0; i < expect.size(); ++i) {
      EXPECT_EQ(found[i].begin, expect[i].begin) << i;
      EXPECT_EQ(found[i].end, expect[i].end) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Real, TorchFixture, ::testing::Values("torch_nested", "torch_two_big"));

TEST(TorchFile, SmallTensorsAreLeftToContentChunking) {
  const std::string bytes = ReadAll(DataPath("torch_nested.pt"));
  auto scanner = NewPayloadScanner(PayloadScanOptions{});  // 64 KiB minimum
  scanner->Feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  std::vector<uint64_t> sizes;
  for (const ByteRange& r : AllRanges(*scanner)) sizes.push_back(r.size());
  EXPECT_EQ(sizes, (std::vector<uint64_t>{131072, 102400}));
}

// DCP's .distcp files hold torch.save archives back to back.
TEST(TorchFile, ScannerFollowsArchivesBackToBack) {
  const std::string a = ReadAll(DataPath("torch_two_big.pt"));
  const std::string both = a + a;
  PayloadScanOptions opts;
  opts.min_payload_bytes = 1;  // tensor "b" is 60000 bytes
  auto scanner = NewPayloadScanner(opts);
  scanner->Feed(reinterpret_cast<const uint8_t*>(both.data()), both.size());
  const std::vector<ByteRange> found = AllRanges(*scanner);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[2].begin, found[0].begin + a.size());
  EXPECT_EQ(found[3].end, found[1].end + a.size());
}

TEST(TorchFile, ScannerGivesUpOnDamageWithoutHarm) {
  std::string bytes = ReadAll(DataPath("torch_two_big.pt"));
  const Expected want = LoadExpected("torch_two_big");
  // Damage the data descriptor after the first storage: the scanner must stop hinting there.
  const auto& first = want.records.at("torch_two_big/data/0");
  bytes[first.offset + first.size + 8] ^= 0x55;
  auto scanner = NewPayloadScanner(PayloadScanOptions{});
  scanner->Feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const std::vector<ByteRange> found = AllRanges(*scanner);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].begin, first.offset);
  // Random bytes, and random bytes after a zip signature: nothing, and no crash.
  for (uint64_t seed = 1; seed < 50; ++seed) {
    std::vector<uint8_t> junk = test::RandomBytes(5000, seed);
    if (seed % 2) std::memcpy(junk.data(), "PK\x03\x04", 4);
    auto s = NewPayloadScanner(PayloadScanOptions{});
    s->Feed(junk.data(), junk.size());
    EXPECT_FALSE(s->NextPayload(0).has_value());
  }
}

TEST(TorchFile, EveryTruncationIsAnError) {
  const std::string bytes = ReadAll(DataPath("torch_nested.pt"));
  for (size_t len = 0; len < bytes.size(); len += (len + 200 > bytes.size() ? 1 : 997)) {
    const std::string cut = bytes.substr(0, len);
    auto f = ReadTorchFile(cut.size(), ReaderOf(cut));
    ASSERT_FALSE(f.ok()) << "a file cut to " << len << " bytes parsed";
    EXPECT_EQ(f.status().code(), Code::kCorrupt) << f.status().ToString();
  }
}

TEST(TorchFile, DamagedPickleIsAnErrorNotACrash) {
  const std::string bytes = ReadAll(DataPath("torch_nested.pt"));
  const Expected want = LoadExpected("torch_nested");
  const auto& pkl = want.records.at("torch_nested/data.pkl");
  int errors = 0;
  for (uint64_t i = pkl.offset; i < pkl.offset + pkl.size; ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0xff);
    auto f = ReadTorchFile(bad.size(), ReaderOf(bad));
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), Code::kCorrupt) << f.status().ToString();
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(TorchFile, LegacyFormatIsRecognizedAndStoredGenerically) {
  const std::string bytes = ReadAll(DataPath("torch_legacy.pt"));
  auto d = DescribeFile("torch_legacy.pt", bytes.size(), ReaderOf(bytes));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->format, FileFormat::kTorchLegacy);
  EXPECT_TRUE(d->tensors.empty());
  auto scanner = NewPayloadScanner(PayloadScanOptions{});
  scanner->Feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  EXPECT_FALSE(scanner->NextPayload(0).has_value());
}

TEST(TorchFile, DescribeAndJsonPages) {
  const std::string bytes = ReadAll(DataPath("torch_nested.pt"));
  auto d = DescribeFile("x.pt", bytes.size(), ReaderOf(bytes));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->format, FileFormat::kTorchZip);
  ASSERT_EQ(d->tensors.size(), 18u);
  size_t next = 0;
  const std::string all = TensorsJson(d->tensors, 0, SIZE_MAX, &next);
  EXPECT_EQ(next, d->tensors.size());
  EXPECT_NE(all.find("{\"name\":\"model.view.cols\",\"dtype\":\"float32\",\"shape\":[64,4],"
                     "\"stride\":[400,1],\"offset\":206484,\"length\":100816}"),
            std::string::npos)
      << all;
  // Pages: each within the limit, together all tensors once.
  size_t count = 0;
  for (size_t i = 0; i < d->tensors.size();) {
    const size_t first = i;
    const std::string page = TensorsJson(d->tensors, i, 400, &i);
    EXPECT_TRUE(page.size() <= 400 || i == first + 1) << page.size();
    count += i - first;
  }
  EXPECT_EQ(count, d->tensors.size());
}

// safetensors: the header announces every tensor; the scanner must report exactly those ranges
// (in file order), however the bytes arrive, and DescribeFile the same tensors.
TEST(SafetensorsScan, RangesComeFromTheHeader) {
  for (const char* name : {"basic", "all_dtypes", "header_order", "odd_names"}) {
    const std::string bytes =
        ReadAll(DataPath(std::string("safetensors/") + name + ".safetensors"));
    auto header = safetensors::ParseHeader(bytes, bytes.size());
    ASSERT_TRUE(header.ok()) << name << ": " << header.status().ToString();
    std::vector<ByteRange> want;
    for (const auto& t : header->tensors) {
      if (t.length > 0) want.push_back({t.offset, t.offset + t.length});
    }
    std::sort(want.begin(), want.end(),
              [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
    PayloadScanOptions opts;
    opts.min_payload_bytes = 1;
    auto scanner = NewPayloadScanner(opts);
    for (size_t off = 0; off < bytes.size(); off += 5) {
      scanner->Feed(reinterpret_cast<const uint8_t*>(bytes.data()) + off,
                    std::min<size_t>(5, bytes.size() - off));
    }
    EXPECT_EQ(scanner->format(), "safetensors") << name;
    const std::vector<ByteRange> got = AllRanges(*scanner);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].begin, want[i].begin) << name;
      EXPECT_EQ(got[i].end, want[i].end) << name;
    }
    auto d = DescribeFile(name, bytes.size(), ReaderOf(bytes));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->format, FileFormat::kSafetensors);
    EXPECT_EQ(d->tensors.size(), header->tensors.size());
  }
  // A truncated header is a clear error for DescribeFile and no hints for the scanner.
  const std::string bytes = ReadAll(DataPath("safetensors/basic.safetensors"));
  const std::string cut = bytes.substr(0, 20);
  auto d = DescribeFile("x", cut.size(), ReaderOf(cut));
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace ckptfs
