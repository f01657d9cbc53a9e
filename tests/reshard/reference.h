// Reference tensors for the reshard/ tests: dense row-major uint32 tensors and the shards the
// rules of docs/views.md cut from them, computed by plain index math.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reshard/rules.h"

namespace ckptfs::reshard::testref {

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// A dense row-major tensor of distinct uint32 values.
struct T32 {
  std::vector<int64_t> shape;
  std::vector<uint32_t> v;
  std::string Bytes() const {
    std::string b(v.size() * 4, '\0');
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
  }
};

inline T32 Iota(std::vector<int64_t> shape, uint32_t base) {
  T32 t{std::move(shape), {}};
  int64_t n = 1;
  for (int64_t x : t.shape) n *= x;
  for (int64_t i = 0; i < n; ++i) t.v.push_back(base + static_cast<uint32_t>(i));
  return t;
}

// Indices [from, to) of dimension d.
inline T32 Slice(const T32& x, size_t d, int64_t from, int64_t to) {
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < d; ++i) outer *= x.shape[i];
  for (size_t i = d + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
  T32 out{x.shape, {}};
  out.shape[d] = to - from;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = from; i < to; ++i) {
      for (int64_t k = 0; k < inner; ++k) out.v.push_back(x.v[(o * x.shape[d] + i) * inner + k]);
    }
  }
  return out;
}

inline T32 Cat0(const T32& a, const T32& b) {
  T32 out = a;
  out.shape[0] += b.shape[0];
  out.v.insert(out.v.end(), b.v.begin(), b.v.end());
  return out;
}

inline T32 Chunk(const T32& x, size_t d, int64_t n, int64_t i) {
  const int64_t k = x.shape[d] / n;
  return Slice(x, d, i * k, (i + 1) * k);
}

// The vocabulary table cut to, or padded with copies of its last row to, `rows` rows.
inline T32 PadRows(const T32& x, int64_t rows) {
  if (rows <= x.shape[0]) return Slice(x, 0, 0, rows);
  T32 out = x;
  const T32 last = Slice(x, 0, x.shape[0] - 1, x.shape[0]);
  while (out.shape[0] < rows) out = Cat0(out, last);
  return out;
}

// Shard i of n of the full tensor x under rule r. For kVocab x is the whole table already cut or
// padded to its rows.
inline T32 RefShard(Rule r, const T32& x, int64_t n, int64_t i) {
  switch (r) {
    case Rule::kColumn:
    case Rule::kVocab:
      return Chunk(x, 0, n, i);
    case Rule::kRow:
      return Chunk(x, 1, n, i);
    case Rule::kSwiglu: {
      const int64_t f = x.shape[0] / 2;
      return Cat0(Chunk(Slice(x, 0, 0, f), 0, n, i), Chunk(Slice(x, 0, f, 2 * f), 0, n, i));
    }
    default:
      return x;
  }
}

// The bytes gathers make over in-memory sources, by the definition in recipe.h.
inline std::string Expand(const std::vector<std::string>& src, const std::vector<Gather>& gathers) {
  std::string out;
  for (const Gather& g : gathers) {
    for (uint64_t r = 0; r < g.rows; ++r) {
      for (const Part& p : g.parts) {
        EXPECT_LE(p.offset + r * p.stride + p.len, src[p.source].size());
        out += src[p.source].substr(p.offset + r * p.stride, p.len);
      }
    }
  }
  return out;
}

}  // namespace ckptfs::reshard::testref
