#include "gpu/loader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/ckptfs_gpu.h"
#include "gpu/extent_reader.h"
#include "tests/test_util.h"

namespace ckptfs::gpu {
namespace {

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// --- the index ---

TEST(ParseTensorIndex, Contiguous) {
  auto r = ParseTensorIndex(
      R"([{"name":"model.w","dtype":"bfloat16","shape":[2,3],"offset":64,"length":12},)"
      R"({"name":"step","dtype":"int64","shape":[],"offset":128,"length":8}])",
      "f.pt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  const TensorInfo& w = (*r)[0];
  EXPECT_EQ(w.name, "model.w");
  EXPECT_EQ(w.dtype, "bfloat16");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(w.stride.empty());
  EXPECT_EQ(w.offset, 64u);
  EXPECT_EQ(w.length, 12u);
  EXPECT_TRUE((*r)[1].shape.empty());
  EXPECT_EQ((*r)[1].offset, 128u);
}

TEST(ParseTensorIndex, StridedAndDcpChunk) {
  auto r = ParseTensorIndex(
      R"([{"name":"t","dtype":"float32","shape":[3,2],"stride":[1,3],"offset":0,"length":24,)"
      R"("global_shape":[6,2],"global_offset":[3,0]}])",
      "f.pt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[0].stride, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ((*r)[0].global_shape, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ((*r)[0].global_offset, (std::vector<int64_t>{3, 0}));
  // Back to JSON and parsed again: the same tensors.
  const std::string text = TensorIndexJson(*r);
  auto again = ParseTensorIndex(text, "again");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)[0].stride, (*r)[0].stride);
  EXPECT_EQ((*again)[0].global_offset, (*r)[0].global_offset);
  EXPECT_EQ((*again)[0].length, 24u);
}

TEST(ParseTensorIndex, EmptyListIsNoTensors) {
  auto r = ParseTensorIndex("[]", "f.pt");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(ParseTensorIndex, MalformedIsCorruptNamingTheFile) {
  const char* bad[] = {
      "",
      "[",
      "{}",
      "[1]",
      R"([{"dtype":"float32","shape":[1],"offset":0,"length":4}])",
      R"([{"name":"a","shape":[1],"offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[-1],"offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[1.5],"offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[2,2],"stride":[1],"offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[1],"offset":-4,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[1],"offset":0}])",
      R"([{"name":5,"dtype":"float32","shape":[1],"offset":0,"length":4}])",
      R"([{"name":"a","dtype":"float32","shape":[1],"offset":0,"length":4.0}])",
  };
  for (const char* text : bad) {
    auto r = ParseTensorIndex(text, "/mnt/x.pt");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << text;
    EXPECT_TRUE(Contains(r.status().message(), "/mnt/x.pt")) << r.status().message();
  }
}

TEST(SelectTensors, KeepsTheCallersOrderAndListsUnknownNames) {
  auto index = ParseTensorIndex(
      R"([{"name":"a","dtype":"int8","shape":[1],"offset":0,"length":1},)"
      R"({"name":"b","dtype":"int8","shape":[1],"offset":1,"length":1},)"
      R"({"name":"c","dtype":"int8","shape":[1],"offset":2,"length":1}])",
      "f");
  ASSERT_TRUE(index.ok());
  std::vector<std::string> names = {"c", "a"};
  auto r = SelectTensors(*index, names, "f");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].name, "c");
  EXPECT_EQ((*r)[1].offset, 0u);

  names = {"a", "nope", "zzz", "nope"};
  r = SelectTensors(*index, names, "f.pt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "'nope', 'zzz'")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "f.pt"));
  EXPECT_FALSE(Contains(r.status().message(), "'a'"));
}

TEST(ReadTensorIndex, MissingFileAndNoIndex) {
  test::TempDir dir;
  auto r = ReadTensorIndex(dir.Sub("missing.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "missing.pt"));

  // A plain file off the mount has no such attribute (ENODATA, or ENOTSUP where the filesystem
  // has no user attributes): the same error either way.
  const std::string plain = dir.Sub("plain.pt");
  std::ofstream(plain) << "not a checkpoint";
  r = ReadTensorIndex(plain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNoData) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status().message(), "not on a ckptfs mount")) << r.status().message();
}

// --- reads into host memory ---

struct File {
  test::TempDir dir;
  std::string path;
  std::vector<uint8_t> bytes;
  explicit File(size_t n, uint64_t seed = 1) : path(dir.Sub("data.bin")) {
    bytes = test::RandomBytes(n, seed);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
  }
};

// Extents covering varied ranges of a file (overlapping in the file, never in memory): empty,
// one byte, odd sizes, the very end, a large one. Destinations are slices of *mem.
std::vector<Extent> ManyExtents(size_t file_size, size_t count, std::vector<uint8_t>* mem) {
  test::SplitMix64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, 0}, {0, 1}, {file_size - 1, 1}, {0, file_size}, {13, 4099}};
  while (ranges.size() < count) {
    uint64_t off = rng.Below(file_size);
    uint64_t len = rng.Below(std::min<uint64_t>(file_size - off, 70000) + 1);
    ranges.emplace_back(off, len);
  }
  size_t total = 0;
  for (auto& [off, len] : ranges) total += len;
  mem->assign(total, 0xEE);
  std::vector<Extent> out;
  size_t at = 0;
  for (auto& [off, len] : ranges) {
    out.push_back(Extent{off, len, mem->data() + at, "t" + std::to_string(out.size())});
    at += len;
  }
  return out;
}

void ExpectFilled(const File& f, const std::vector<Extent>& extents) {
  for (const Extent& e : extents) {
    ASSERT_EQ(std::memcmp(e.dst, f.bytes.data() + e.offset, e.length), 0) << e.name;
  }
}

// (engine, max_op_bytes, piece_bytes)
class HostReadTest
    : public ::testing::TestWithParam<std::tuple<std::string, size_t, size_t>> {
 protected:
  LoadOptions Options() const {
    LoadOptions o;
    o.engine = std::get<0>(GetParam());
    o.max_op_bytes = std::get<1>(GetParam());
    o.piece_bytes = std::get<2>(GetParam());
    o.queue_depth = 8;
    return o;
  }
};

TEST_P(HostReadTest, ManyExtentsLandWhereTheyBelong) {
  File f(1 << 20);
  std::vector<uint8_t> mem;
  std::vector<Extent> extents = ManyExtents(f.bytes.size(), 300, &mem);
  Status st = ReadToHost(f.path, extents, Options());
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectFilled(f, extents);
}

TEST_P(HostReadTest, PastTheEndIsAnErrorNamingTheTensor) {
  File f(10000);
  std::vector<uint8_t> mem(20000);
  std::vector<Extent> extents = {{0, 100, mem.data(), "ok"},
                                 {9000, 1001, mem.data() + 100, "model.layers.3.weight"}};
  Status st = ReadToHost(f.path, extents, Options());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_TRUE(Contains(st.message(), "file is shorter than its tensor index says"))
      << st.message();
  EXPECT_TRUE(Contains(st.message(), "'model.layers.3.weight'")) << st.message();
  EXPECT_TRUE(Contains(st.message(), f.path)) << st.message();
}

TEST_P(HostReadTest, StagedThroughSmallBuffers) {
  File f(300000, 3);
  std::vector<uint8_t> mem;
  std::vector<Extent> extents = ManyExtents(f.bytes.size(), 120, &mem);
  // Three buffers of an odd size: large extents are cut, small ones share a buffer, and the host
  // twin copies only when a buffer is waited for, so refilling one early would show in the bytes.
  auto stager = NewHostStager(3, 10007);
  Status st = ReadStaged(f.path, extents, *stager, Options());
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectFilled(f, extents);
}

INSTANTIATE_TEST_SUITE_P(
    Engines, HostReadTest,
    ::testing::Combine(::testing::Values("uring", "pread"), ::testing::Values(0, 4097),
                       ::testing::Values(0, 65536)));

// A stager that records what the reader asks of it, over the host twin.
class RecordingStager final : public Stager {
 public:
  RecordingStager(size_t buffers, size_t bytes) : inner_(NewHostStager(buffers, bytes)) {}
  size_t buffer_count() const override { return inner_->buffer_count(); }
  size_t buffer_bytes() const override { return inner_->buffer_bytes(); }
  char* buffer(size_t i) override { return inner_->buffer(i); }
  Status Wait(size_t i) override {
    waited_.push_back(i);
    return inner_->Wait(i);
  }
  Status CopyOut(size_t i, std::span<const Copy> copies) override {
    size_t bytes = 0;
    for (const Copy& c : copies) bytes += c.len;
    batches_.push_back({i, copies.size(), bytes});
    // The buffer about to be copied was waited for since its last copy.
    EXPECT_FALSE(waited_.empty());
    return inner_->CopyOut(i, copies);
  }
  Status Finish() override {
    finished_ = true;
    return inner_->Finish();
  }
  struct Batch {
    size_t buffer, copies, bytes;
  };
  std::vector<Batch> batches_;
  std::vector<size_t> waited_;
  bool finished_ = false;

 private:
  std::unique_ptr<Stager> inner_;
};

TEST(ReadStaged, CutsLargeTensorsAndBatchesSmallOnes) {
  File f(64 * 1024, 5);
  std::vector<uint8_t> mem(200 * 1024);
  std::vector<Extent> extents;
  size_t at = 0;
  for (int i = 0; i < 40; ++i) {  // 40 small tensors of 100 bytes
    extents.push_back({static_cast<uint64_t>(i) * 100, 100, mem.data() + at, "s"});
    at += 100;
  }
  extents.push_back({1000, 50000, mem.data() + at, "big"});  // one tensor of 50000 bytes
  RecordingStager stager(2, 4096);
  Status st = ReadStaged(f.path, extents, stager);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectFilled(f, extents);
  EXPECT_TRUE(stager.finished_);
  size_t total = 0;
  for (const auto& b : stager.batches_) {
    EXPECT_LE(b.bytes, 4096u);
    total += b.bytes;
  }
  EXPECT_EQ(total, 40u * 100 + 50000);
  // The 4000 bytes of small tensors fit one buffer; the big one needs ceil(50000/4096) pieces
  // (the first shares the small tensors' buffer).
  EXPECT_EQ(stager.batches_[0].copies, 41u);
  EXPECT_EQ(stager.batches_.size(), (4000 + 50000 + 4095) / 4096);
  // Buffers alternate, and each is waited for before it is filled again.
  for (size_t i = 0; i < stager.batches_.size(); ++i) EXPECT_EQ(stager.batches_[i].buffer, i % 2);
}

TEST(ReadStaged, ErrorsStillFinishTheCopiesInFlight) {
  File f(10000);
  std::vector<uint8_t> mem(20000);
  std::vector<Extent> extents = {{0, 5000, mem.data(), "a"},
                                 {9999, 2, mem.data() + 5000, "b"}};
  RecordingStager stager(2, 1024);
  Status st = ReadStaged(f.path, extents, stager);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "tensor 'b'")) << st.message();
  EXPECT_TRUE(stager.finished_);
}

TEST(ExtentReader, EndOfFileFailsTheOpThatReachedIt) {
  File f(5000);
  for (const char* engine : {"uring", "pread"}) {
    LoadOptions o;
    o.engine = engine;
    o.max_op_bytes = 1000;  // several requests per op, the last one short
    auto reader = NewExtentReader(o);
    ASSERT_TRUE(reader.ok());
    std::vector<char> a(3000), b(3000);
    std::vector<ReadOp> ops = {{a.data(), 0, 3000, 0}, {b.data(), 4000, 3000, 1}};
    size_t failed = 99;
    Status st = (*reader)->ReadAll(-1, ops, &failed);
    EXPECT_FALSE(st.ok()) << engine;  // a bad fd
    int fd = ::open(f.path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    st = (*reader)->ReadAll(fd, ops, &failed);
    ::close(fd);
    ASSERT_FALSE(st.ok()) << engine;
    EXPECT_EQ(st.code(), Code::kCorrupt) << engine;
    EXPECT_EQ(failed, 1u) << engine;
    EXPECT_EQ(ops[1].done, 1000u) << engine;  // what there was, requeued in 1000-byte requests
    EXPECT_EQ(std::memcmp(b.data(), f.bytes.data() + 4000, 1000), 0) << engine;
  }
}

TEST(ReadToHost, MissingFileAndNullDestination) {
  test::TempDir dir;
  std::vector<uint8_t> mem(10);
  std::vector<Extent> extents = {{0, 10, mem.data(), "a"}};
  Status st = ReadToHost(dir.Sub("nope.pt"), extents);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  File f(100);
  extents = {{0, 0, nullptr, "empty is fine"}};
  EXPECT_TRUE(ReadToHost(f.path, extents).ok());
  extents = {{0, 10, nullptr, "a"}};
  st = ReadToHost(f.path, extents);
  EXPECT_EQ(st.code(), Code::kInvalid) << st.ToString();
}

// The VmFlags of the mapping holding `addr`, from /proc/self/smaps.
std::string VmFlagsAt(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= from && a < to;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(ReadToHost, AdvisesHugePagesOverTheAlignedPartOfEachDestination) {
  constexpr size_t kHuge = size_t{2} << 20;
  File f(5 * kHuge);
  for (bool huge : {true, false}) {
    SCOPED_TRACE(huge ? "huge_pages" : "no huge_pages");
    // Anonymous memory with room for a destination that starts 4 KiB past a 2 MiB boundary.
    const size_t map_len = 8 * kHuge;
    void* map = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    const auto base = (reinterpret_cast<uintptr_t>(map) + kHuge - 1) & ~(kHuge - 1);
    auto* dst = reinterpret_cast<uint8_t*>(base + 4096);
    std::vector<Extent> extents = {{0, 4 * kHuge, dst, "big"}, {100, 4096, reinterpret_cast<uint8_t*>(map), "small"}};
    LoadOptions o;
    o.huge_pages = huge;
    ASSERT_TRUE(ReadToHost(f.path, extents, o).ok());
    EXPECT_EQ(std::memcmp(dst, f.bytes.data(), 4 * kHuge), 0);
    EXPECT_EQ(std::memcmp(map, f.bytes.data() + 100, 4096), 0);
    // The advice covers [next 2 MiB boundary, last one) of the big destination, nothing else.
    EXPECT_EQ(Contains(VmFlagsAt(reinterpret_cast<void*>(base + kHuge)), " hg"), huge);
    EXPECT_EQ(Contains(VmFlagsAt(reinterpret_cast<void*>(base + 4 * kHuge - 1)), " hg"), huge);
    EXPECT_FALSE(Contains(VmFlagsAt(dst), " hg"));
    EXPECT_FALSE(Contains(VmFlagsAt(reinterpret_cast<void*>(base + 4 * kHuge)), " hg"));
    ::munmap(map, map_len);
  }
}

TEST(ReadToDevice, WithoutHipIsAClearError) {
  if (HaveHip()) GTEST_SKIP() << "this build has HIP";
  File f(100);
  std::vector<uint8_t> mem(10);
  std::vector<Extent> extents = {{0, 10, mem.data(), "a"}};
  Status st = ReadToDevice(f.path, extents, 0);
  EXPECT_EQ(st.code(), Code::kUnsupported);
  EXPECT_TRUE(Contains(st.message(), "ckptfs_gpu was built without HIP")) << st.message();
  EXPECT_EQ(DeviceCount(), 0);
}

// --- the C ABI ---

TEST(CApi, ReadsAndReportsErrors) {
  File f(100000, 9);
  std::vector<uint8_t> a(1000), b(5000);
  ckptfs_gpu_extent extents[] = {{10, 1000, a.data(), "a"}, {90000, 5000, b.data(), nullptr}};
  ckptfs_gpu_options opts{};
  opts.max_op_bytes = 333;
  ASSERT_EQ(ckptfs_gpu_read(f.path.c_str(), extents, 2, -1, &opts), 0) << ckptfs_gpu_last_error();
  EXPECT_EQ(std::memcmp(a.data(), f.bytes.data() + 10, 1000), 0);
  EXPECT_EQ(std::memcmp(b.data(), f.bytes.data() + 90000, 5000), 0);
  EXPECT_STREQ(ckptfs_gpu_last_error(), "");

  extents[1].offset = 99000;  // runs 4000 bytes past the end
  EXPECT_EQ(ckptfs_gpu_read(f.path.c_str(), extents, 2, -1, nullptr), -EIO);
  EXPECT_TRUE(Contains(ckptfs_gpu_last_error(), "file is shorter than its tensor index says"));
  EXPECT_TRUE(Contains(ckptfs_gpu_last_error(), "extent 1")) << ckptfs_gpu_last_error();

  char* json = nullptr;
  size_t len = 0;
  EXPECT_EQ(ckptfs_gpu_index(f.path.c_str(), nullptr, 0, &json, &len), -ENODATA);
  EXPECT_EQ(json, nullptr);
  EXPECT_TRUE(Contains(ckptfs_gpu_last_error(), f.path));
  ckptfs_gpu_free(nullptr);

  EXPECT_EQ(ckptfs_gpu_abi_version(), CKPTFS_GPU_ABI_VERSION);
  if (!ckptfs_gpu_has_hip()) {
    extents[1].offset = 0;
    EXPECT_EQ(ckptfs_gpu_read(f.path.c_str(), extents, 2, 0, nullptr), -EOPNOTSUPP);
    EXPECT_TRUE(Contains(ckptfs_gpu_last_error(), "built without HIP"));
  }
}

}  // namespace
}  // namespace ckptfs::gpu
