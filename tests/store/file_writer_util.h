// What the FileWriter tests share: an in-memory chunk sink, a scanner that knows where the tensors
// are, and helpers that compare bytes and read a manifest's shape.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/file_writer.h"

namespace ckptfs::fwtest {

using Bytes = std::vector<uint8_t>;

// An in-memory chunk store; optionally runs out of space after `space` puts.
class MemSink : public ChunkSink {
 public:
  explicit MemSink(std::string dir) : dir_(std::move(dir)) {}

  Status PutChunk(const ChunkId& id, const uint8_t* data, size_t len) override {
    EXPECT_EQ(id, ChunkId::Of(data, len)) << "a chunk's id must be the hash of its bytes";
    if (space_ == 0) return Status(Code::kNoSpace, "test sink is full");
    if (space_ > 0) --space_;
    ++puts_;
    chunks_.emplace(id, Bytes(data, data + len));
    return Status::Ok();
  }
  Result<ChunkRef> GetChunk(const ChunkId& id, size_t len) override {
    auto it = chunks_.find(id);
    if (it == chunks_.end()) return NotFound("no chunk " + id.Hex());
    EXPECT_EQ(it->second.size(), len);
    auto d = ChunkData::Allocate(len);
    std::memcpy(d->bytes.get(), it->second.data(), len);
    return ChunkRef(std::move(d));
  }
  std::string NewStagingPath() override { return dir_ + "/staging." + std::to_string(++seq_); }

  // The bytes a manifest names, holes as zeros.
  Bytes Reassemble(const Manifest& m) const {
    Bytes out;
    for (const Extent& e : m.extents()) {
      if (e.hole()) {
        out.resize(out.size() + e.len, 0);
        continue;
      }
      auto it = chunks_.find(e.id);
      EXPECT_NE(it, chunks_.end()) << "manifest names a chunk that was never put";
      if (it == chunks_.end()) return {};
      EXPECT_EQ(it->second.size(), e.len);
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }

  size_t distinct() const { return chunks_.size(); }
  int puts() const { return puts_; }
  void set_space(int puts_left) { space_ = puts_left; }

 private:
  std::string dir_;
  std::map<ChunkId, Bytes> chunks_;
  int puts_ = 0;
  int space_ = -1;  // -1: unlimited
  int seq_ = 0;
};

// Equal bytes, or a short message naming the first difference (not two megabyte-long dumps).
inline ::testing::AssertionResult SameBytes(const Bytes& got, const Bytes& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return ::testing::AssertionFailure() << "got " << got.size() << " bytes, want " << want.size()
                                       << "; first difference at offset " << i;
}

inline ChunkingOptions Small() {
  ChunkingOptions o;
  o.min_bytes = 4 << 10;
  o.avg_bytes = 16 << 10;
  o.max_bytes = 64 << 10;
  o.piece_bytes = 32 << 10;
  return o;
}

// A scanner that knows where the tensors are in advance and reveals each one only once the bytes
// up to its start have been fed, as a real scanner learns of a tensor from the header before it.
class FakeScanner : public PayloadScanner {
 public:
  explicit FakeScanner(std::vector<ByteRange> ranges) : ranges_(std::move(ranges)) {}
  void Feed(const uint8_t*, size_t len) override { fed_ += len; }
  std::optional<ByteRange> NextPayload(uint64_t pos) override {
    for (const ByteRange& r : ranges_) {
      if (r.begin > fed_) break;
      if (r.end > pos) return r;
    }
    return std::nullopt;
  }
  std::string_view format() const override { return "fake"; }

 private:
  std::vector<ByteRange> ranges_;
  uint64_t fed_ = 0;
};

inline PayloadScannerFactory FakeScanners(std::vector<ByteRange> ranges) {
  return [ranges] { return std::make_unique<FakeScanner>(ranges); };
}

inline size_t Holes(const Manifest& m) {
  return std::count_if(m.extents().begin(), m.extents().end(), [](auto& e) { return e.hole(); });
}

// The chunk boundaries of a manifest, as file offsets.
inline std::set<uint64_t> Cuts(const Manifest& m) {
  std::set<uint64_t> cuts;
  uint64_t pos = 0;
  for (const Extent& e : m.extents()) cuts.insert(pos += e.len);
  return cuts;
}

}  // namespace ckptfs::fwtest
