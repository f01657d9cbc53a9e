// TorchZipWriter and ComputeCrcs: a view file materialized from in-memory sources is a zip that
// formats/zip.h reads back record for record, with data aligned to 64 bytes and CRC-32s that zlib
// agrees with, whether they came from reading the sources or from known whole-record CRCs.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "formats/zip.h"
#include "reshard/half.h"
#include "reshard/view_file.h"
#include "tests/test_util.h"
#include "tests/reshard/reference.h"

namespace ckptfs::reshard {
namespace {

using namespace testref;  // NOLINT: the reference tensors and their helpers

std::string Source(size_t n, uint64_t seed) {
  auto b = test::RandomBytes(n, seed);
  return std::string(b.begin(), b.end());
}

uint32_t Crc(const std::string& b) {
  return static_cast<uint32_t>(
      crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(b.data()), b.size()));
}


// In-memory sources that count their reads; the sink gets the bytes in small pieces, as a
// chunked reader would hand them over.
struct MemSources {
  std::vector<std::string> data;
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> reads;
  std::optional<std::pair<uint32_t, uint64_t>> fail_from;  // reads of (source, offset) fail
  // ComputeCrcs may call the reader from several threads at once.
  std::mutex mu;

  SourceReadFn Fn() {
    return [this](uint32_t source, uint64_t offset, uint64_t len,
                  const std::function<void(const uint8_t*, size_t)>& sink) -> Status {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (fail_from && *fail_from == std::pair{source, offset}) {
          return IoError("source read failed");
        }
        reads.emplace_back(source, offset, len);
      }
      EXPECT_LE(offset + len, data[source].size());
      const auto* p = reinterpret_cast<const uint8_t*>(data[source].data()) + offset;
      for (uint64_t done = 0; done < len; done += 7)
        sink(p + done, std::min<uint64_t>(7, len - done));
      return Status::Ok();
    };
  }
};

zip::ReadAtFn ReadAtOf(const Recipe& r, const std::vector<std::string>& src) {
  return [&r, &src](uint64_t offset, size_t len) -> Result<std::string> {
    if (offset > r.size() || len > r.size() - offset) return IoError("read past the end");
    return ReadView(r, src, offset, len);
  };
}

// One record as the test means it: name (after the prefix) and content.
struct Want {
  std::string name, bytes;
};

// Checks that `file` is a zip holding exactly `want`, in order, each record stored, aligned,
// contiguous, with the right CRC in both headers.
void ExpectArchive(const std::string& file, const std::string& prefix,
                   const std::vector<Want>& want) {
  auto read_at = [&](uint64_t offset, size_t len) -> Result<std::string> {
    if (offset > file.size() || len > file.size() - offset) return IoError("read past the end");
    return file.substr(offset, len);
  };
  auto dir = zip::ReadDirectory(file.size(), read_at);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(dir->archive_start, 0u);
  EXPECT_EQ(dir->archive_end, file.size());
  ASSERT_EQ(dir->entries.size(), want.size());
  uint64_t next_header = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const zip::Entry& e = dir->entries[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.name, prefix + "/" + want[i].name);
    EXPECT_EQ(e.method, 0);
    EXPECT_EQ(e.size, want[i].bytes.size());
    EXPECT_EQ(e.compressed_size, want[i].bytes.size());
    EXPECT_EQ(e.header_offset, next_header) << "records are back to back";
    EXPECT_EQ(e.data_offset % 64, 0u);
    EXPECT_EQ(file.substr(e.data_offset, e.size), want[i].bytes);
    EXPECT_EQ(e.crc32, Crc(want[i].bytes)) << "central directory CRC";
    size_t need = 0;
    auto lh = zip::ParseLocalHeader(reinterpret_cast<const uint8_t*>(file.data()) + e.header_offset,
                                    file.size() - e.header_offset, &need);
    ASSERT_TRUE(lh.ok()) << lh.status().ToString();
    ASSERT_TRUE(lh->has_value());
    const zip::LocalHeader& h = **lh;
    EXPECT_EQ(h.name, e.name);
    EXPECT_FALSE(h.has_descriptor());
    EXPECT_EQ(h.method, 0);
    EXPECT_EQ(h.crc32, Crc(want[i].bytes)) << "local header CRC";
    EXPECT_EQ(h.known_size(), std::optional<uint64_t>(want[i].bytes.size()));
    EXPECT_EQ(e.header_offset + h.header_len, e.data_offset);
    next_header = e.data_offset + e.size;
  }
}

// A writer fed with literal and gather records of several shapes, and what each record holds.
struct Sample {
  std::vector<std::string> src{Source(1000, 1), Source(500, 2)};
  std::vector<Want> want;

  ViewFile Build() {
    want.clear();
    TorchZipWriter w("archive");
    auto bytes = [&](const std::string& name, const std::string& b) {
      w.AddBytes(name, b);
      want.push_back({name, b});
    };
    auto gathers = [&](const std::string& name, const std::vector<Gather>& g) {
      w.AddGathers(name, g);
      want.push_back({name, Expand(src, g)});
    };
    bytes("data.pkl", "\x80\x02}q.");
    // A dim-1 slice with a stride-0 column, then a plain range.
    gathers("data/0",
            {Gather{4, {Part{0, 10, 8, 32}, Part{1, 0, 4, 0}}}, Gather{1, {Part{1, 100, 50, 50}}}});
    gathers("data/1", {Gather{1, {Part{0, 0, 1000, 1000}}}});  // a whole source
    gathers("data/2", {});                                     // an empty tensor
    gathers("data/3", {Gather{3, {Part{0, 999, 1, 0}}}});      // a padding repeat
    bytes("version", "3\n");
    bytes(".data/serialization_id", "0123456789012345678901234567890123456789");
    return w.Finish();
  }
};

TEST(TorchZip, MaterializedFileReadsBack) {
  Sample s;
  ViewFile f = s.Build();
  EXPECT_EQ(f.crc_tasks.size(), 3u);  // data/0, data/1, data/3: data/2 is empty
  MemSources mem{s.src};
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), nullptr).ok());
  EXPECT_TRUE(f.crc_tasks.empty());
  const std::string file = ReadView(f.recipe, s.src, 0, f.recipe.size());
  ASSERT_EQ(file.size(), f.recipe.size());
  ExpectArchive(file, "archive", s.want);
}

// Two records past the 16 MiB unit, the second with a known whole source record (source 1,
// 20 MiB, itself past the unit) 15 MiB into its data.
struct LargeRecords {
  std::vector<std::string> src{Source(40 << 20, 11), Source(20 << 20, 12)};

  ViewFile Build() const {
    TorchZipWriter w("big");
    w.AddGathers("data/0", {Gather{1, {Part{0, 0, 40 << 20, 40 << 20}}}});
    w.AddGathers("data/1", {Gather{5, {Part{0, 7, 3 << 20, 5 << 20}}},
                            Gather{1, {Part{1, 0, 20 << 20, 20 << 20}}},
                            Gather{1, {}, 1000},
                            Gather{2, {Part{0, 1, 9 << 20, 11 << 20}}}});
    return w.Finish();
  }
  KnownCrcFn Known() const {
    const uint32_t crc = Crc(src[1]);
    const uint64_t len = src[1].size();
    return [crc, len](uint32_t s, uint64_t off, uint64_t n) -> std::optional<uint32_t> {
      if (s == 1 && off == 0 && n == len) return crc;
      return std::nullopt;
    };
  }
};

TEST(TorchZip, LargeRecordsChecksumInPiecesOnThreads) {
  // Records past the 16 MiB unit: their CRCs are combined from pieces computed on 4 threads,
  // with a known whole-record CRC in the middle of one of them.
  const LargeRecords big;
  const auto& src = big.src;
  ViewFile f = big.Build();
  MemSources mem{src};
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), big.Known(), 4).ok());
  const std::string file = ReadView(f.recipe, src, 0, f.recipe.size());
  auto dir = zip::ReadDirectory(file.size(), [&](uint64_t off, size_t len) -> Result<std::string> {
    return file.substr(off, len);
  });
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ASSERT_EQ(dir->entries.size(), 2u);
  for (const zip::Entry& e : dir->entries) {
    EXPECT_EQ(e.crc32, static_cast<uint32_t>(crc32_z(
                           0, reinterpret_cast<const Bytef*>(file.data() + e.data_offset), e.size)))
        << e.name;
  }
}

TEST(TorchZip, SeenGetsEveryRecordByteOnceInUnits) {
  // `seen` gets every byte of the records once, at its offset, in units cut at 16 MiB of the
  // file and around the known record in the middle of data/1, which is read for it (cut at 16 MiB
  // too, so that no thread holds more than a unit) but not checksummed (its CRC is still the
  // known one: without `seen` it is not read at all).
  const LargeRecords big;
  const auto& src = big.src;
  ViewFile f = big.Build();
  MemSources mem{src};
  std::mutex mu;
  std::map<uint64_t, std::string> pieces;
  ViewBytesFn seen = [&](uint64_t off, const uint8_t* data, size_t len) {
    std::lock_guard lock(mu);
    EXPECT_TRUE(pieces.emplace(off, std::string(reinterpret_cast<const char*>(data), len)).second)
        << "seen twice at " << off;
  };
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), big.Known(), 4, seen).ok());
  const std::string file = ReadView(f.recipe, src, 0, f.recipe.size());
  auto dir = zip::ReadDirectory(file.size(), [&](uint64_t off, size_t len) -> Result<std::string> {
    return file.substr(off, len);
  });
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ASSERT_EQ(dir->entries.size(), 2u);
  const uint64_t d0 = dir->entries[0].data_offset, d1 = dir->entries[1].data_offset;
  const uint64_t known_at = d1 + (15 << 20), known_end = known_at + (20 << 20);
  const uint64_t unit = 16 << 20;
  uint64_t end = 0, total = 0;
  bool known_seen = false;
  for (const auto& [off, bytes] : pieces) {
    SCOPED_TRACE(off);
    EXPECT_GE(off, end) << "pieces overlap";
    EXPECT_LE(bytes.size(), unit);
    EXPECT_TRUE(off % unit == 0 || off == d0 || off == d1 || off == known_at || off == known_end)
        << "a piece starts off a 16 MiB boundary inside a run";
    if (off == known_at) known_seen = true;
    EXPECT_TRUE(bytes == file.substr(off, bytes.size())) << "seen bytes differ from the file's";
    end = off + bytes.size();
    total += bytes.size();
  }
  EXPECT_TRUE(known_seen);
  EXPECT_EQ(total, dir->entries[0].size + dir->entries[1].size);
  EXPECT_EQ(dir->entries[1].crc32,
            static_cast<uint32_t>(crc32_z(
                0, reinterpret_cast<const Bytef*>(file.data() + d1), dir->entries[1].size)));
  // Without `seen`, the known record is not read.
  ViewFile g = big.Build();
  MemSources quiet{src};
  ASSERT_TRUE(ComputeCrcs(&g, quiet.Fn(), big.Known(), 4).ok());
  for (const auto& [source, offset, len] : quiet.reads) EXPECT_NE(source, 1u) << offset << len;
}

TEST(TorchZip, DirectoryReadsThroughTheRecipe) {
  Sample s;
  ViewFile f = s.Build();
  MemSources mem{s.src};
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), nullptr).ok());
  auto dir = zip::ReadDirectory(f.recipe.size(), ReadAtOf(f.recipe, s.src));
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const zip::Entry* e = dir->Find("archive/data/1");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(ReadView(f.recipe, s.src, e->data_offset, e->size), s.src[0]);
}

TEST(TorchZip, SameInputsSameBytes) {
  Sample a, b;
  ViewFile fa = a.Build(), fb = b.Build();
  MemSources ma{a.src}, mb{b.src};
  ASSERT_TRUE(ComputeCrcs(&fa, ma.Fn(), nullptr).ok());
  ASSERT_TRUE(ComputeCrcs(&fb, mb.Fn(), nullptr).ok());
  EXPECT_EQ(ReadView(fa.recipe, a.src, 0, fa.recipe.size()),
            ReadView(fb.recipe, b.src, 0, fb.recipe.size()));
}

TEST(TorchZip, EveryNameLengthAligns) {
  // Header lengths of every residue mod 64 (the alignment padding's short cases included).
  std::vector<std::string> src{Source(300, 3)};
  TorchZipWriter w("m");
  std::vector<Want> want;
  for (size_t n = 1; n <= 140; ++n) {
    const std::string name = "r" + std::string(n - 1, 'a' + static_cast<char>(n % 26));
    if (n % 2) {
      const std::string b = src[0].substr(n, (n * 7) % 13);
      w.AddBytes(name, b);
      want.push_back({name, b});
    } else {
      const std::vector<Gather> g{Gather{1, {Part{0, n, n % 17 + 1, n % 17 + 1}}}};
      w.AddGathers(name, g);
      want.push_back({name, Expand(src, g)});
    }
  }
  ViewFile f = w.Finish();
  MemSources mem{src};
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), nullptr).ok());
  ExpectArchive(ReadView(f.recipe, src, 0, f.recipe.size()), "m", want);
}

TEST(TorchZip, KnownCrcsSkipReadsAndAgreeWithReading) {
  // The sources' "records": src0 whole, src1 [1000, 3000).
  std::vector<std::string> src{Source(4096, 4), Source(3000, 5)};
  auto build = [&] {
    TorchZipWriter w("model_optim_rng");
    w.AddBytes("data.pkl", "pkl");
    w.AddGathers("data/0", {Gather{1, {Part{0, 0, 4096, 4096}}}});
    // Two known records concatenated: the CRC is combined, nothing is read.
    w.AddGathers("data/1",
                 {Gather{1, {Part{1, 1000, 2000, 2000}}}, Gather{1, {Part{0, 0, 4096, 4096}}}});
    w.AddGathers("data/2", {Gather{1, {Part{1, 0, 100, 100}}}});  // part of a record: read
    w.AddGathers("data/3", {Gather{4, {Part{0, 8, 16, 0}}}});     // rows: read
    // A known record then an unknown range of another source: one known, one read.
    w.AddGathers("data/4", {Gather{1, {Part{1, 1000, 2000, 2000}}}, Gather{1, {Part{0, 5, 3, 3}}}});
    return w.Finish();
  };
  int known_calls = 0;
  KnownCrcFn known = [&](uint32_t source, uint64_t offset,
                         uint64_t len) -> std::optional<uint32_t> {
    ++known_calls;
    if (source == 0 && offset == 0 && len == 4096) return Crc(src[0]);
    if (source == 1 && offset == 1000 && len == 2000) return Crc(src[1].substr(1000, 2000));
    return std::nullopt;
  };

  ViewFile slow = build();
  MemSources slow_mem{src};
  ASSERT_TRUE(ComputeCrcs(&slow, slow_mem.Fn(), nullptr).ok());

  ViewFile fast = build();
  MemSources fast_mem{src};
  ASSERT_TRUE(ComputeCrcs(&fast, fast_mem.Fn(), known).ok());
  using R = std::tuple<uint32_t, uint64_t, uint64_t>;
  const std::vector<R> want_reads{R{1, 0, 100}, R{0, 8, 16}, R{0, 8, 16},
                                  R{0, 8, 16},  R{0, 8, 16}, R{0, 5, 3}};
  EXPECT_EQ(fast_mem.reads, want_reads);
  EXPECT_GT(known_calls, 0);
  EXPECT_GT(slow_mem.reads.size(), want_reads.size());

  const std::string fast_bytes = ReadView(fast.recipe, src, 0, fast.recipe.size());
  EXPECT_EQ(fast_bytes, ReadView(slow.recipe, src, 0, slow.recipe.size()));
  const std::string a = src[0], b = src[1].substr(1000, 2000);
  ExpectArchive(fast_bytes, "model_optim_rng",
                {{"data.pkl", "pkl"},
                 {"data/0", a},
                 {"data/1", b + a},
                 {"data/2", src[1].substr(0, 100)},
                 {"data/3", std::string(src[0].substr(8, 16)) + src[0].substr(8, 16) +
                                src[0].substr(8, 16) + src[0].substr(8, 16)},
                 {"data/4", b + src[0].substr(5, 3)}});
}

std::string Floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

TEST(TorchZip, MeanIsPythonsSumOverLen) {
  // Three float32 arrays. Element 0: the order of the additions shows ((0 + 1e8) + 1) - 1e8 is
  // 0, not 1; element 1: 0 + (-0.0) is +0.0; element 2: 10 / 3 divides (no reciprocal).
  const std::vector<std::string> src{Floats({1e8f, -0.0f, 1.0f, 7.5f}),
                                     Floats({1.0f, -0.0f, 2.0f, 0.25f}),
                                     Floats({-1e8f, -0.0f, 7.0f, -1.5f})};
  std::vector<float> want(4);
  for (size_t i = 0; i < 4; ++i) {
    volatile float acc = 0.0f;  // as torch adds, one rounding per step
    for (const std::string& a : src) acc = acc + reinterpret_cast<const float*>(a.data())[i];
    want[i] = acc / 3.0f;
  }
  EXPECT_EQ(want[0], 0.0f);
  EXPECT_FALSE(std::signbit(want[1]));
  EXPECT_EQ(want[2], 10.0f / 3.0f);
  Recipe r;
  r.AddLiteral("hdr");
  r.AddMean({Part{0, 0, 16, 16}, Part{1, 0, 16, 16}, Part{2, 0, 16, 16}});
  r.AddLiteral("end");
  ASSERT_EQ(r.size(), 22u);
  EXPECT_EQ(ReadView(r, src, 0, r.size()), "hdr" + Floats(want) + "end");
  // Reads that start and end inside a float.
  for (uint64_t from = 0; from < r.size(); ++from) {
    for (uint64_t len : {1u, 3u, 5u, 9u}) {
      EXPECT_EQ(ReadView(r, src, from, len), ("hdr" + Floats(want) + "end").substr(from, len))
          << from << "+" << len;
    }
  }
  // Ranges inside the sources: elements 1..2 of each.
  Recipe part;
  part.AddMean({Part{0, 4, 8, 8}, Part{1, 4, 8, 8}, Part{2, 4, 8, 8}});
  EXPECT_EQ(ReadView(part, src, 0, 8), Floats({want[1], want[2]}));
}

TEST(TorchZip, MeanRoundsToSixteenBitsAsTorchDoes) {
  // One array (its mean is itself): 1, two bfloat16 ties (1 + 2^-8 to 1, 1 + 3 * 2^-8 to
  // 1 + 2^-6: nearest even; float16 holds both), 1/3, -0.0 (+0.0 after the 0 + a0), NaN. The
  // expected halves are what torch's .to(bfloat16 / float16) gives (NaN: the quiet NaN).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::string> src{
      Floats({1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f / 3, -0.0f, nan})};
  auto halves = [](const std::vector<uint16_t>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
  };
  Recipe bf, fp;
  bf.AddMean({Part{0, 0, 24, 24}}, MeanOut::kBFloat16);
  fp.AddMean({Part{0, 0, 24, 24}}, MeanOut::kFloat16);
  ASSERT_EQ(bf.size(), 12u);
  EXPECT_EQ(ReadView(bf, src, 0, 12),
            halves({0x3f80, 0x3f80, 0x3f82, 0x3eab, 0x0000, 0x7fc0}));
  EXPECT_EQ(ReadView(fp, src, 0, 12),
            halves({0x3c00, 0x3c04, 0x3c0c, 0x3555, 0x0000, 0x7e00}));
  EXPECT_EQ(ReadView(bf, src, 5, 4),
            halves({0x3f80, 0x3f80, 0x3f82, 0x3eab, 0x0000, 0x7fc0}).substr(5, 4));
}

TEST(TorchZip, MeanRecordIsComputedNotTakenFromAKnownCrc) {
  // A mean of one array (a parameter averaged at TP 1) is the array with -0.0 made +0.0, so a
  // whole-record CRC of the source does not hold for it.
  const std::vector<std::string> src{Floats({-0.0f, 1.5f, -2.0f})};
  TorchZipWriter w("fp32");
  w.AddGathers("data/0", {Gather{1, {Part{0, 0, 12, 12}}, 0, true}});
  ViewFile f = w.Finish();
  MemSources mem{src};
  KnownCrcFn known = [&](uint32_t, uint64_t, uint64_t) -> std::optional<uint32_t> {
    return Crc(src[0]);
  };
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), known).ok());
  EXPECT_FALSE(mem.reads.empty());
  ExpectArchive(ReadView(f.recipe, src, 0, f.recipe.size()), "fp32",
                {{"data/0", Floats({0.0f, 1.5f, -2.0f})}});
}

TEST(TorchZip, CrcsOnSeveralThreadsEqualOneThread) {
  std::vector<std::string> src{Source(1 << 16, 9), Source(1 << 15, 10)};
  auto build = [&] {
    TorchZipWriter w("archive");
    w.AddBytes("data.pkl", "pkl");
    for (uint64_t i = 0; i < 40; ++i) {
      w.AddGathers("data/" + std::to_string(i),
                   {Gather{3 + i % 5, {Part{0, i * 100, 50 + i, 700}, Part{1, i * 7, 9, 11}}}});
    }
    return w.Finish();
  };
  std::mutex mu;
  auto read = [&](uint32_t s, uint64_t off, uint64_t len,
                  const std::function<void(const uint8_t*, size_t)>& sink) {
    std::lock_guard lock(mu);  // the reader only needs to be thread-safe
    sink(reinterpret_cast<const uint8_t*>(src[s].data() + off), len);
    return Status::Ok();
  };
  ViewFile one = build();
  ViewFile four = build();
  ASSERT_TRUE(ComputeCrcs(&one, read, nullptr, 1).ok());
  ASSERT_TRUE(ComputeCrcs(&four, read, nullptr, 4).ok());
  EXPECT_TRUE(four.crc_tasks.empty());
  EXPECT_EQ(ReadView(four.recipe, src, 0, four.recipe.size()),
            ReadView(one.recipe, src, 0, one.recipe.size()));
}

TEST(TorchZip, ReadErrorLeavesTheFileUnchanged) {
  Sample s;
  ViewFile f = s.Build();
  const std::string before = ReadView(f.recipe, s.src, 0, f.recipe.size());
  const size_t tasks = f.crc_tasks.size();
  MemSources mem{s.src};
  mem.fail_from = {0, 999};  // the reads of the third pending record (data/3)
  Status st = ComputeCrcs(&f, mem.Fn(), nullptr);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_EQ(f.crc_tasks.size(), tasks);
  EXPECT_EQ(ReadView(f.recipe, s.src, 0, f.recipe.size()), before);
  // A later try that succeeds fills everything in.
  MemSources ok{s.src};
  ASSERT_TRUE(ComputeCrcs(&f, ok.Fn(), nullptr).ok());
  ExpectArchive(ReadView(f.recipe, s.src, 0, f.recipe.size()), "archive", s.want);
}

// Rows of two shards side by side (a row-parallel weight joined) are read in one read per shard,
// not one per row, and checksum the same as read row by row; rows far apart are read as they come.
TEST(TorchZip, SmallRowsAreReadInFewReads) {
  const std::vector<std::string> src{Source(64 * 48, 3), Source(64 * 48, 4), Source(40000, 5)};
  const std::vector<Gather> joined{Gather{64, {Part{0, 0, 48, 48}, Part{1, 0, 48, 48}}}};
  const std::vector<Gather> sparse{Gather{8, {Part{2, 0, 16, 4096}}}};  // gaps past the rows
  TorchZipWriter w("archive");
  w.AddBytes("data.pkl", "pkl");
  w.AddGathers("data/0", joined);
  w.AddGathers("data/1", sparse);
  w.AddBytes("version", "3\n");
  ViewFile f = w.Finish();
  MemSources mem{src};
  ASSERT_TRUE(ComputeCrcs(&f, mem.Fn(), nullptr).ok());
  std::vector<size_t> per_source(3, 0);
  for (const auto& [source, offset, len] : mem.reads) ++per_source[source];
  EXPECT_EQ(per_source[0], 1u);
  EXPECT_EQ(per_source[1], 1u);
  EXPECT_EQ(per_source[2], 8u);
  ExpectArchive(ReadView(f.recipe, src, 0, f.recipe.size()), "archive",
                {{"data.pkl", "pkl"},
                 {"data/0", Expand(src, joined)},
                 {"data/1", Expand(src, sparse)},
                 {"version", "3\n"}});
}

// A record of 4.1 GiB (a stride-0 repeat of one 4 KiB source row) is never materialized: only
// the headers and the directory are read, through the recipe.
TEST(TorchZip, Zip64WhenARecordPassesFourGiB) {
  const std::vector<std::string> src{Source(4096, 6)};
  const uint64_t rows = (uint64_t{41} << 30) / 10 / 4096 + 1;
  const uint64_t big = rows * 4096;
  ASSERT_GE(big, uint64_t{1} << 32);
  TorchZipWriter w("archive");
  w.AddBytes("data.pkl", "pkl");
  w.AddGathers("data/0", {Gather{rows, {Part{0, 0, 4096, 0}}}});
  w.AddGathers("data/1", {Gather{1, {Part{0, 100, 64, 64}}}});
  w.AddBytes("version", "3\n");
  ViewFile f = w.Finish();
  ASSERT_GT(f.recipe.size(), big);

  auto dir = zip::ReadDirectory(f.recipe.size(), ReadAtOf(f.recipe, src));
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ASSERT_EQ(dir->entries.size(), 4u);
  const auto& e = dir->entries;
  EXPECT_EQ(e[1].name, "archive/data/0");
  EXPECT_EQ(e[1].size, big);
  EXPECT_EQ(e[1].compressed_size, big);
  EXPECT_EQ(e[1].data_offset % 64, 0u);
  EXPECT_EQ(e[2].name, "archive/data/1");
  EXPECT_EQ(e[2].header_offset, e[1].data_offset + big);
  EXPECT_GT(e[2].header_offset, uint64_t{1} << 32);  // needs the zip64 offset field
  EXPECT_EQ(e[2].size, 64u);
  EXPECT_EQ(e[2].data_offset % 64, 0u);
  EXPECT_EQ(ReadView(f.recipe, src, e[2].data_offset, 64), src[0].substr(100, 64));
  EXPECT_EQ(e[3].name, "archive/version");
  EXPECT_EQ(ReadView(f.recipe, src, e[3].data_offset, e[3].size), "3\n");
  EXPECT_EQ(e[3].crc32, Crc("3\n"));
  // The big record's local header carries its sizes in a zip64 extra field.
  const std::string lh_bytes = ReadView(f.recipe, src, e[1].header_offset, 256);
  size_t need = 0;
  auto lh = zip::ParseLocalHeader(reinterpret_cast<const uint8_t*>(lh_bytes.data()),
                                  lh_bytes.size(), &need);
  ASSERT_TRUE(lh.ok()) << lh.status().ToString();
  ASSERT_TRUE(lh->has_value());
  EXPECT_TRUE((*lh)->zip64);
  EXPECT_EQ((*lh)->known_size(), std::optional<uint64_t>(big));
  EXPECT_EQ(e[1].header_offset + (*lh)->header_len, e[1].data_offset);
  // Its data near the end is the repeated row.
  EXPECT_EQ(ReadView(f.recipe, src, e[1].data_offset + big - 4096 - 10, 20),
            src[0].substr(4086, 10) + src[0].substr(0, 10));
}

TEST(TorchZip, SixteenBitRoundingAtTheEdges) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  // float16: the largest finite value, the ties around it (65520 is the tie, to even: infinity),
  // the smallest normal and the subnormals below it (2^-25 is a tie, to even: zero), signs.
  EXPECT_EQ(ToFloat16(65504.0f), 0x7bff);
  EXPECT_EQ(ToFloat16(65519.996f), 0x7bff);
  EXPECT_EQ(ToFloat16(65520.0f), 0x7c00);
  EXPECT_EQ(ToFloat16(-1e9f), 0xfc00);
  EXPECT_EQ(ToFloat16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(ToFloat16(0x1p-14f), 0x0400);
  EXPECT_EQ(ToFloat16(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(ToFloat16(0x1p-24f), 0x0001);
  EXPECT_EQ(ToFloat16(0x1p-25f), 0x0000);
  EXPECT_EQ(ToFloat16(0x1.8p-25f), 0x0001);
  EXPECT_EQ(ToFloat16(3 * 0x1p-25f), 0x0002);          // 1.5 units: to even
  EXPECT_EQ(ToFloat16(5 * 0x1p-25f), 0x0002);          // 2.5 units: to even
  EXPECT_EQ(ToFloat16(-0x1p-30f), 0x8000);
  EXPECT_EQ(ToFloat16(bits(0x00000001)), 0x0000);      // a float subnormal
  EXPECT_EQ(ToFloat16(bits(0xffc00001)), 0xfe00);      // NaN keeps its sign, quiet
  EXPECT_EQ(ToBFloat16(bits(0x3f808000)), 0x3f80);     // a tie: to even
  EXPECT_EQ(ToBFloat16(bits(0x3f818000)), 0x3f82);
#ifdef __FLT16_MANT_DIG__
  // Where the compiler has _Float16, the two agree on every sign, exponent and leading mantissa
  // bits, with the low bits set to each rounding case (below, at and above a tie, odd and even).
  const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : lows) {
      for (uint32_t low_half : {0u, 0x8000u}) {
        const uint32_t u = hi << 16 | low_half | lo;
        const float f = bits(u);
        if (f != f) continue;  // NaN payloads: the quiet NaN by design, checked above
        const _Float16 h = static_cast<_Float16>(f);
        uint16_t want;
        std::memcpy(&want, &h, 2);
        ASSERT_EQ(ToFloat16(f), want) << std::hex << "float bits 0x" << u;
      }
    }
  }
#endif
}

}  // namespace
}  // namespace ckptfs::reshard
