#include "store/file_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/store/file_writer_util.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

using namespace fwtest;  // NOLINT: the sink, scanners and helpers shared with cut_ahead_test

// A FileWriter next to a plain byte-string model of what the file should hold.
class FileWriterTest : public ::testing::Test {
 protected:
  void Start(Manifest base = {}, uint64_t reorder = 1 << 20, PayloadScannerFactory scanners = {}) {
    model_ = sink_.Reassemble(base);
    base_ids_.clear();
    for (const Extent& e : base.extents()) base_ids_.insert(e.id);
    w_ = std::make_unique<FileWriter>(std::move(base), &sink_, Small(), reorder, &metrics_,
                                      std::move(scanners));
  }

  void Write(uint64_t off, const Bytes& data) {
    ASSERT_TRUE(w_->Write(off, data.data(), data.size()).ok()) << "write at " << off;
    if (model_.size() < off + data.size()) model_.resize(off + data.size(), 0);
    std::copy(data.begin(), data.end(), model_.begin() + off);
    ASSERT_EQ(w_->size(), model_.size());
  }
  void Truncate(uint64_t size) {
    ASSERT_TRUE(w_->Truncate(size).ok()) << "truncate to " << size;
    model_.resize(size, 0);
    ASSERT_EQ(w_->size(), model_.size());
  }

  Bytes Read(uint64_t off, size_t len) {
    std::vector<ReadSlice> slices;
    Status st = w_->Read(off, len, &slices);
    EXPECT_TRUE(st.ok()) << st.ToString();
    Bytes out;
    for (const ReadSlice& s : slices) out.insert(out.end(), s.data, s.data + s.len);
    return out;
  }
  // Reads at many offsets (chunk edges included) must equal the model.
  void CheckReads(uint64_t seed) {
    ASSERT_TRUE(SameBytes(Read(0, model_.size() + 100), model_)) << "whole-file read";
    test::SplitMix64 rng(seed);
    for (int i = 0; i < 40; ++i) {
      uint64_t off = rng.Below(model_.size() + 10);
      size_t len = 1 + rng.Below(i % 4 == 0 ? 200000 : 5000);
      uint64_t end = std::min<uint64_t>(off + len, model_.size());
      Bytes want = off < end ? Bytes(model_.begin() + off, model_.begin() + end) : Bytes();
      ASSERT_TRUE(SameBytes(Read(off, len), want)) << "read of " << len << " at " << off;
    }
  }

  // Finishes the writer and checks the manifest holds exactly the model's bytes.
  Manifest Finish() {
    auto m = w_->Finish();
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    EXPECT_EQ(m->size(), model_.size());
    EXPECT_TRUE(SameBytes(sink_.Reassemble(*m), model_)) << "committed bytes differ from the model";
    // Every chunk new to this manifest is held by the writer until the store commits it.
    std::set<ChunkId> held(w_->held().begin(), w_->held().end());
    for (const Extent& e : m->extents()) {
      if (e.hole()) continue;
      EXPECT_TRUE(held.count(e.id) || base_ids_.count(e.id)) << "new chunk not held by the writer";
      EXPECT_LE(e.len, Small().max_bytes);
    }
    return std::move(*m);
  }

  test::TempDir dir_;
  MemSink sink_{dir_.path()};
  Metrics metrics_;
  std::unique_ptr<FileWriter> w_;
  Bytes model_;
  std::set<ChunkId> base_ids_;
};

TEST(TailBufferTest, ConsumeAppendGrowResizeKeepTheBytes) {
  TailBuffer b;
  EXPECT_TRUE(b.empty());
  Bytes model;
  test::SplitMix64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    switch (rng.Below(5)) {
      case 0:
      case 1: {
        Bytes more = test::RandomBytes(1 + rng.Below(5000), rng.Next());
        b.Append(more.data(), more.size());
        model.insert(model.end(), more.begin(), more.end());
        break;
      }
      case 3: {  // grown unset, then filled (a read into the buffer)
        Bytes more = test::RandomBytes(1 + rng.Below(5000), rng.Next());
        const size_t at = b.size();
        b.Grow(at + more.size());
        std::memcpy(b.data() + at, more.data(), more.size());
        model.insert(model.end(), more.begin(), more.end());
        break;
      }
      case 2: {
        size_t n = rng.Below(model.size() + 1);
        b.Consume(n);
        model.erase(model.begin(), model.begin() + n);
        break;
      }
      default: {
        size_t n = rng.Below(model.size() + 3000);
        b.Resize(n);
        model.resize(n, 0);  // growing adds zeros
        break;
      }
    }
    ASSERT_EQ(b.size(), model.size());
    ASSERT_TRUE(SameBytes(Bytes(b.data(), b.data() + b.size()), model)) << "step " << i;
  }
  const Bytes fresh = test::RandomBytes(100, 2);
  b.Assign(fresh.data(), fresh.size());
  EXPECT_TRUE(SameBytes(Bytes(b.data(), b.data() + b.size()), fresh));
  b.Release();
  EXPECT_TRUE(b.empty());
}

TEST_F(FileWriterTest, SequentialAppendsStream) {
  Start();
  const Bytes data = test::RandomBytes(1 << 20, 1);
  test::SplitMix64 rng(2);
  for (size_t off = 0; off < data.size();) {
    size_t n = std::min<size_t>(data.size() - off, 1 + rng.Below(20000));
    Write(off, Bytes(data.begin() + off, data.begin() + off + n));
    off += n;
    if (rng.Below(8) == 0) CheckReads(off);
  }
  EXPECT_FALSE(w_->staging());
  CheckReads(3);
  Manifest m = Finish();
  EXPECT_EQ(Holes(m), 0u);
  EXPECT_GT(m.extents().size(), 10u);
  for (size_t i = 0; i + 1 < m.extents().size(); ++i)
    EXPECT_GE(m.extents()[i].len, Small().min_bytes);
  EXPECT_EQ(metrics_.staging_switches.Get(), 0u);
}

TEST_F(FileWriterTest, SameDataTwiceGivesTheSameManifest) {
  const Bytes data = test::RandomBytes(600000, 4);
  Start();
  Write(0, data);
  Manifest first = Finish();
  const size_t distinct = sink_.distinct();
  // Streamed in different pieces the second time: the cuts depend on the content only.
  Start();
  for (size_t off = 0; off < data.size(); off += 7000) {
    size_t n = std::min<size_t>(7000, data.size() - off);
    Write(off, Bytes(data.begin() + off, data.begin() + off + n));
  }
  Manifest second = Finish();
  EXPECT_EQ(first, second);
  EXPECT_EQ(sink_.distinct(), distinct) << "the second copy must add no new chunks";
}

TEST_F(FileWriterTest, OutOfOrderWritesWithinTheWindowStream) {
  const Bytes data = test::RandomBytes(512 << 10, 5);
  Start();
  Write(0, data);
  Manifest in_order = Finish();

  Start();
  // Pieces of 8 KiB, each group of four written back to front, as reordered writeback does.
  constexpr size_t kPiece = 8 << 10;
  test::SplitMix64 rng(6);
  for (size_t group = 0; group < data.size(); group += 4 * kPiece) {
    for (int k = 3; k >= 0; --k) {
      size_t off = group + k * kPiece;
      if (off >= data.size()) continue;
      Write(off, Bytes(data.begin() + off, data.begin() + off + kPiece));
      if (rng.Below(3) == 0) CheckReads(off);  // gaps read as zeros meanwhile
    }
  }
  EXPECT_FALSE(w_->staging());
  Manifest m = Finish();
  EXPECT_EQ(m, in_order);
}

TEST_F(FileWriterTest, PatchingTheUncutTailStaysStreaming) {
  const Bytes data = test::RandomBytes(100000, 7);
  Start();
  Write(0, data);
  // Where the stream stands: the bytes after the last cut of what was written are still buffered.
  Chunker c(Small());
  size_t last_cut = 0;
  while (size_t cut = c.FindCut(data.data() + last_cut, data.size() - last_cut)) last_cut += cut;
  ASSERT_LT(last_cut + 200, data.size());
  Write(data.size() - 150, test::RandomBytes(100, 8));
  Write(last_cut + 10, test::RandomBytes(50, 9));
  EXPECT_FALSE(w_->staging());
  CheckReads(10);
  Finish();
}

TEST_F(FileWriterTest, OverwritingCutBytesSwitchesToStaging) {
  const Bytes data = test::RandomBytes(300000, 11);
  Start();
  Write(0, data);
  EXPECT_FALSE(w_->staging());
  Write(1000, test::RandomBytes(5000, 12));  // inside the first chunk, long since cut
  EXPECT_TRUE(w_->staging());
  EXPECT_EQ(metrics_.staging_switches.Get(), 1u);
  CheckReads(13);
  // The file keeps changing in staging mode: overwrite, append, a hole, a shrink.
  Write(150000, test::RandomBytes(70000, 14));
  Write(300000, test::RandomBytes(1000, 15));
  Write(500000, test::RandomBytes(1000, 16));
  CheckReads(17);
  Truncate(450000);
  CheckReads(18);
  Finish();
}

TEST_F(FileWriterTest, WritesPastTheEndLeaveHoles) {
  Start();
  Write(0, test::RandomBytes(10000, 20));
  Write(100000, test::RandomBytes(10000, 21));
  Write(300000, test::RandomBytes(20000, 22));
  CheckReads(23);
  Truncate(400000);  // and a hole at the end
  CheckReads(24);
  EXPECT_FALSE(w_->staging());
  Manifest m = Finish();
  // The gaps are hole extents exactly where nothing was written, not chunks of zeros.
  std::vector<std::pair<uint64_t, uint64_t>> holes;  // start, len
  for (size_t i = 0; i < m.extents().size(); ++i) {
    if (m.extents()[i].hole()) holes.emplace_back(m.StartOf(i), m.extents()[i].len);
  }
  EXPECT_EQ(holes, (std::vector<std::pair<uint64_t, uint64_t>>{
                       {10000, 90000}, {110000, 190000}, {320000, 80000}}));
}

TEST_F(FileWriterTest, OverflowingTheReorderWindowKeepsEveryByte) {
  Start({}, /*reorder=*/64 << 10);
  Write(0, test::RandomBytes(8000, 30));
  // Ahead of the stream end, each beyond the file's current size: past 64 KiB they cannot wait.
  for (int i = 0; i < 12; ++i) Write(20000 + i * 10000, test::RandomBytes(10000, 31 + i));
  EXPECT_TRUE(w_->staging());
  CheckReads(50);
  Write(8000, test::RandomBytes(12000, 51));  // fills the gap
  CheckReads(52);
  Finish();
}

TEST_F(FileWriterTest, TruncateShrinksAndGrows) {
  Start();
  Write(0, test::RandomBytes(300000, 60));
  Truncate(299000);  // inside the buffered tail
  CheckReads(61);
  Truncate(50000);  // inside chunks already cut
  CheckReads(62);
  EXPECT_FALSE(w_->staging());
  Write(50000, test::RandomBytes(30000, 63));  // appends continue from the new end
  CheckReads(64);
  Truncate(200000);  // grows with zeros
  CheckReads(65);
  Write(250000, test::RandomBytes(100, 66));
  Truncate(190000);  // drops the write waiting past the end, keeps the zeros
  CheckReads(67);
  Truncate(0);
  CheckReads(68);
  Write(0, test::RandomBytes(70000, 69));
  EXPECT_FALSE(w_->staging());
  Finish();
}

TEST_F(FileWriterTest, TruncateIntoAHole) {
  Start();
  Write(0, test::RandomBytes(20000, 70));
  Truncate(100000);
  Write(100000, test::RandomBytes(20000, 71));
  Manifest base = Finish();
  ASSERT_EQ(Holes(base), 1u);
  Start(base);
  Truncate(60000);  // the cut lands inside the hole
  CheckReads(72);
  Write(60000, test::RandomBytes(5000, 73));
  CheckReads(74);
  Finish();
}

TEST_F(FileWriterTest, ContinuesFromABaseManifest) {
  Start();
  Write(0, test::RandomBytes(200000, 80));
  Manifest base = Finish();

  Start(base);  // reopened for append
  EXPECT_EQ(w_->size(), 200000u);
  CheckReads(81);
  Write(200000, test::RandomBytes(100000, 82));
  EXPECT_FALSE(w_->staging());
  CheckReads(83);
  Manifest appended = Finish();
  // Appending re-cuts the old last chunk; the earlier chunks are shared.
  size_t shared = 0;
  for (size_t i = 0; i + 1 < base.extents().size(); ++i) {
    shared += base.extents()[i] == appended.extents()[i];
  }
  EXPECT_EQ(shared, base.extents().size() - 1);

  Start(appended);  // reopened for a rewrite in the middle
  Write(10, test::RandomBytes(10, 84));
  EXPECT_TRUE(w_->staging());
  CheckReads(85);
  Finish();
}

// Model-based: random mixes of appends, writes ahead of the end, patches, rewrites and truncates,
// over several commit rounds (each round starts from the manifest the previous one committed, as
// the store does on every reopen), checked against the model after every few operations.
TEST_F(FileWriterTest, RandomOperationsMatchTheModel) {
  for (uint64_t seed = 100; seed < 140; ++seed) {
    test::SplitMix64 rng(seed);
    Manifest base;
    for (int round = 0; round < 3; ++round) {
      Start(base, /*reorder=*/(seed % 2) ? (256 << 10) : (24 << 10));
      for (int op = 0; op < 60; ++op) {
        const uint64_t size = model_.size();
        const uint64_t r = rng.Below(100);
        if (r < 55) {  // append
          Write(size, test::RandomBytes(1 + rng.Below(30000), rng.Next()));
        } else if (r < 70) {  // a little ahead of the end
          Write(size + rng.Below(40000), test::RandomBytes(1 + rng.Below(10000), rng.Next()));
        } else if (r < 85 && size > 0) {  // near the end (often the uncut tail)
          uint64_t off = size - std::min<uint64_t>(size, rng.Below(20000));
          Write(off, test::RandomBytes(1 + rng.Below(3000), rng.Next()));
        } else if (r < 90 && size > 0) {  // anywhere
          Write(rng.Below(size), test::RandomBytes(1 + rng.Below(3000), rng.Next()));
        } else if (r < 97) {
          Truncate(rng.Below(size + 30000));
        } else {
          Truncate(size + rng.Below(50000));
        }
        if (HasFatalFailure()) return;
        if (op % 10 == 0) CheckReads(seed * 1000 + op);
      }
      CheckReads(seed);
      base = Finish();
      if (HasFailure()) return;
    }
  }
}

TEST_F(FileWriterTest, NoSpaceIsSticky) {
  Start();
  sink_.set_space(2);
  const Bytes data = test::RandomBytes(1 << 20, 90);
  Status failed;
  for (size_t off = 0; off < data.size() && failed.ok(); off += 32 << 10) {
    failed = w_->Write(off, data.data() + off, 32 << 10);
  }
  ASSERT_FALSE(failed.ok()) << "three chunks' worth of data fit in a sink with room for two";
  EXPECT_EQ(failed.code(), Code::kNoSpace);
  EXPECT_EQ(sink_.puts(), 2);
  // Everything after the failure reports it, even once space comes back.
  sink_.set_space(-1);
  EXPECT_EQ(w_->Write(0, data.data(), 10).code(), Code::kNoSpace);
  EXPECT_EQ(w_->Truncate(10).code(), Code::kNoSpace);
  // Reads still work: readers of the file see the bytes applied before the failure.
  std::vector<ReadSlice> slices;
  ASSERT_TRUE(w_->Read(0, 10, &slices).ok());
  Bytes got;
  for (const ReadSlice& sl : slices) got.insert(got.end(), sl.data, sl.data + sl.len);
  EXPECT_TRUE(got == Bytes(data.begin(), data.begin() + 10));
  auto m = w_->Finish();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNoSpace);
}

TEST_F(FileWriterTest, NoSpaceAtFinish) {
  Start();
  sink_.set_space(0);
  Write(0, test::RandomBytes(3000, 91));  // below the minimum chunk: nothing is cut yet
  auto m = w_->Finish();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNoSpace);
}

TEST_F(FileWriterTest, NoSpaceInStagingFinish) {
  Start();
  Write(0, test::RandomBytes(200000, 92));
  Write(0, test::RandomBytes(10, 93));
  ASSERT_TRUE(w_->staging());
  sink_.set_space(1);
  auto m = w_->Finish();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNoSpace);
}

// A MemSink whose PutChunkAsync stores each chunk on a thread of its own, a little later, as the
// store's put pool does; put number `fail_at` (from 1) fails with kNoSpace.
class AsyncSink : public MemSink {
 public:
  using MemSink::MemSink;
  ~AsyncSink() override {
    for (std::thread& t : threads_) t.join();
  }
  Status PutChunk(const ChunkId& id, const uint8_t* data, size_t len) override {
    std::lock_guard lock(mu_);
    return MemSink::PutChunk(id, data, len);
  }
  void PutChunkAsync(const ChunkId& id, const uint8_t* data, size_t len,
                     const std::atomic<bool>* cancelled, std::function<void(Status)> done) override {
    auto copy = std::make_shared<Bytes>(data, data + len);  // data is the caller's on return
    const uint64_t cost = ChunkCache::CopyFootprint(len);  // what the store's copy would hold
    std::lock_guard lock(mu_);
    const int n = ++submitted_;
    inflight_ += cost;
    max_inflight_ = std::max(max_inflight_, inflight_);
    max_running_ = std::max(max_running_, ++running_);
    threads_.emplace_back([this, id, copy, n, cost, cancelled, done = std::move(done)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + 10 * (n % 5)));
      Status st;
      if (cancelled->load()) {
        st = Status(Code::kIo, "cancelled");
      } else {
        st = n == fail_at_ ? Status(Code::kNoSpace, "test sink is full")
                           : PutChunk(id, copy->data(), copy->size());
      }
      {
        std::lock_guard l(mu_);
        if (st.ok()) stored_.push_back(id);
        if (st.code() == Code::kIo) ++skipped_;
        inflight_ -= cost;
        --running_;
      }
      done(st);
    });
  }
  std::mutex mu_;
  int fail_at_ = 0;
  int submitted_ = 0, skipped_ = 0;
  int running_ = 0, max_running_ = 0;
  uint64_t inflight_ = 0, max_inflight_ = 0;
  std::vector<ChunkId> stored_;
  std::vector<std::thread> threads_;
};

// 48 MiB of random bytes in a staging file (some 190 chunks, 3 windows' worth), cut by a
// FileWriter into the AsyncSink.
class FileWriterAsyncTest : public ::testing::Test {
 protected:
  Result<Manifest> CutStaged(uint64_t seed) {
    ChunkingOptions big = Small();
    big.max_bytes = 1 << 20;
    big.avg_bytes = 256 << 10;
    big.min_bytes = 64 << 10;
    data_ = test::RandomBytes(48 << 20, seed);
    const std::string path = dir_.Sub("file");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::pwrite(fd, data_.data(), data_.size(), 0), static_cast<ssize_t>(data_.size()));
    w_ = std::make_unique<FileWriter>(Manifest(), &sink_, big, 1 << 20, &metrics_);
    EXPECT_TRUE(w_->AdoptFile(fd, data_.size()).ok());
    ::close(fd);
    return w_->Finish();
  }
  std::multiset<ChunkId> Held() const { return {w_->held().begin(), w_->held().end()}; }

  test::TempDir dir_;
  AsyncSink sink_{dir_.path()};
  Metrics metrics_;
  Bytes data_;
  std::unique_ptr<FileWriter> w_;
};

// A staging file is cut with its chunks put asynchronously, a bounded number of bytes at a time;
// Finish returns once every put has, with the manifest in file order and every stored chunk held.
TEST_F(FileWriterAsyncTest, StagingFileChunksArePutAsynchronouslyWithinTheWindow) {
  auto m = CutStaged(95);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::lock_guard lock(sink_.mu_);
  EXPECT_EQ(sink_.running_, 0) << "Finish returned with puts still running";
  EXPECT_TRUE(SameBytes(sink_.Reassemble(*m), data_));
  EXPECT_GT(sink_.max_running_, 1) << "the puts overlapped nothing";
  EXPECT_LE(sink_.max_inflight_, FileWriter::kPutWindow);
  EXPECT_EQ(sink_.skipped_, 0);
  EXPECT_EQ(Held(), std::multiset<ChunkId>(sink_.stored_.begin(), sink_.stored_.end()));
  EXPECT_EQ(Held().size(), m->extents().size());
}

// A put that fails fails the cut, once every other put is done: no more are submitted, those not
// yet begun are skipped, and only chunks stored are held.
TEST_F(FileWriterAsyncTest, AFailedAsynchronousPutFailsFinish) {
  sink_.fail_at_ = 7;
  auto m = CutStaged(96);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNoSpace);
  std::lock_guard lock(sink_.mu_);
  EXPECT_EQ(sink_.running_, 0) << "Finish returned with puts still running";
  EXPECT_GE(sink_.submitted_, 7);
  EXPECT_LT(sink_.submitted_, 60) << "puts went on being submitted after one failed";
  EXPECT_EQ(Held(), std::multiset<ChunkId>(sink_.stored_.begin(), sink_.stored_.end()));
  EXPECT_EQ(Held().size(), static_cast<size_t>(sink_.submitted_ - 1 - sink_.skipped_));
}

// A file of structure and tensor bytes: `layout` alternates structure and tensor lengths,
// starting with structure. Returns the bytes and the tensors' ranges.
Bytes Layout(const std::vector<size_t>& layout, uint64_t seed, std::vector<ByteRange>* tensors,
             const std::vector<Bytes>& tensor_bytes = {}) {
  Bytes out;
  for (size_t i = 0; i < layout.size(); ++i) {
    Bytes part = test::RandomBytes(layout[i], seed + i);
    if (i % 2 == 1) {
      if (i / 2 < tensor_bytes.size()) part = tensor_bytes[i / 2];
      tensors->push_back({out.size(), out.size() + part.size()});
    }
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

TEST_F(FileWriterTest, CutsAtTensorBoundariesWithFixedPieces) {
  std::vector<ByteRange> tensors;
  const Bytes data = Layout({10000, 300000, 5000, 100000, 3000}, 1, &tensors);
  Start({}, 1 << 20, FakeScanners(tensors));
  test::SplitMix64 rng(7);
  for (size_t off = 0; off < data.size();) {
    size_t n = std::min<size_t>(data.size() - off, 1 + rng.Below(70000));
    Write(off, Bytes(data.begin() + off, data.begin() + off + n));
    off += n;
  }
  const Manifest m = Finish();
  const std::set<uint64_t> cuts = Cuts(m);
  const uint64_t piece = Small().piece_bytes;
  for (const ByteRange& r : tensors) {
    EXPECT_TRUE(cuts.count(r.begin)) << "no cut where the tensor at " << r.begin << " starts";
    EXPECT_TRUE(cuts.count(r.end)) << "no cut where the tensor at " << r.begin << " ends";
    for (uint64_t p = r.begin + piece; p < r.end; p += piece) {
      EXPECT_TRUE(cuts.count(p)) << "no piece cut at " << p;
    }
    // Nothing else inside the tensor.
    for (auto it = cuts.upper_bound(r.begin); it != cuts.end() && *it < r.end; ++it) {
      EXPECT_EQ((*it - r.begin) % piece, 0u) << "a stray cut inside a tensor at " << *it;
    }
  }
  EXPECT_EQ(metrics_.tensor_chunk_bytes.Get(), 400000u);
}

TEST_F(FileWriterTest, SameTensorDedupsAtAnyOffset) {
  const Bytes tensor = test::RandomBytes(200000, 99);
  std::vector<ByteRange> t1, t2;
  const Bytes f1 = Layout({777, 0, 1234, 200000, 50}, 10, &t1, {Bytes(), tensor});
  const Bytes f2 = Layout({40000, 200000, 333}, 20, &t2, {tensor});
  Start({}, 1 << 20, FakeScanners(t1));
  Write(0, f1);
  Finish();
  const int puts_before = sink_.puts();
  const size_t distinct_before = sink_.distinct();
  Start({}, 1 << 20, FakeScanners(t2));
  Write(0, f2);
  const Manifest m2 = Finish();
  // Every piece of the tensor in the second file was already stored by the first.
  size_t tensor_pieces = 0;
  uint64_t pos = 0;
  size_t new_chunks = sink_.distinct() - distinct_before;
  for (const Extent& e : m2.extents()) {
    if (pos >= t2[0].begin && pos + e.len <= t2[0].end) ++tensor_pieces;
    pos += e.len;
  }
  EXPECT_EQ(tensor_pieces, (200000 + Small().piece_bytes - 1) / Small().piece_bytes);
  EXPECT_EQ(new_chunks, m2.extents().size() - tensor_pieces) << "only the structure is new";
  EXPECT_GT(sink_.puts(), puts_before);
}

TEST_F(FileWriterTest, RewriteInTailDropsHintsKeepsBytes) {
  std::vector<ByteRange> tensors;
  const Bytes data = Layout({3000, 150000, 2000}, 3, &tensors);
  Start({}, 1 << 20, FakeScanners(tensors));
  Write(0, Bytes(data.begin(), data.begin() + 2000));
  Write(100, test::RandomBytes(500, 4));  // rewrites bytes the scanner has seen
  Write(2000, Bytes(data.begin() + 2000, data.end()));
  Finish();
}

TEST_F(FileWriterTest, StagingFileGetsTensorBoundariesToo) {
  std::vector<ByteRange> tensors;
  const Bytes data = Layout({5000, 200000, 7000, 90000, 100}, 5, &tensors);
  Start({}, /*reorder=*/64 << 10, FakeScanners(tensors));
  // Back to front: overflows the reorder window, so the file is chunked from its staging file.
  const size_t step = 50000;
  for (size_t end = data.size(); end > 0;) {
    size_t begin = end > step ? end - step : 0;
    Write(begin, Bytes(data.begin() + begin, data.begin() + end));
    end = begin;
  }
  ASSERT_TRUE(w_->staging());
  const std::set<uint64_t> cuts = Cuts(Finish());
  for (const ByteRange& r : tensors) {
    EXPECT_TRUE(cuts.count(r.begin) && cuts.count(r.end)) << "tensor at " << r.begin;
  }
}

}  // namespace
}  // namespace ckptfs
