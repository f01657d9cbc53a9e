// Reference tensors for the reshard/ tests: dense row-major uint32 tensors and the shards the
// rules of docs/views.md cut from them, computed by plain index math.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formats/pickle.h"
#include "formats/torch_file.h"
#include "reshard/rules.h"
#include "reshard/view_file.h"

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

// a and b one after the other along dimension d.
inline T32 Cat(const T32& a, const T32& b, size_t d) {
  int64_t outer = 1, ia = 1, ib = 1;
  for (size_t i = 0; i < d; ++i) outer *= a.shape[i];
  for (size_t i = d; i < a.shape.size(); ++i) {
    ia *= a.shape[i];
    ib *= b.shape[i];
  }
  T32 out{a.shape, {}};
  out.shape[d] += b.shape[d];
  for (int64_t o = 0; o < outer; ++o) {
    out.v.insert(out.v.end(), a.v.begin() + o * ia, a.v.begin() + (o + 1) * ia);
    out.v.insert(out.v.end(), b.v.begin() + o * ib, b.v.begin() + (o + 1) * ib);
  }
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

// ---- building torch files ----

inline pickle::ValuePtr OrderedDict() {
  return pickle::MakeCall(pickle::MakeGlobal("collections", "OrderedDict"), pickle::MakeTuple({}));
}
inline pickle::ValuePtr IntTuple(const std::vector<int64_t>& xs) {
  std::vector<pickle::ValuePtr> items;
  for (int64_t x : xs) items.push_back(pickle::MakeInt(x));
  return pickle::MakeTuple(std::move(items));
}

// The storages and tensors of a torch file being built (4-byte elements, torch.FloatStorage).
struct FileBuilder {
  std::vector<std::string> storages;
  pickle::ValuePtr Tensor(const T32& t, bool parameter = false) {
    storages.push_back(t.Bytes());
    return View(storages.size() - 1, 0, t.shape, parameter);
  }
  // A contiguous tensor of `shape` at element `offset` of storage `key`.
  pickle::ValuePtr View(size_t key, int64_t offset, const std::vector<int64_t>& shape,
                        bool parameter = false) {
    std::vector<int64_t> stride(shape.size());
    int64_t acc = 1;
    for (size_t i = shape.size(); i-- > 0;) {
      stride[i] = acc;
      acc *= shape[i];
    }
    auto pid = pickle::MakePersId(pickle::MakeTuple(
        {pickle::MakeStr("storage"), pickle::MakeGlobal("torch", "FloatStorage"),
         pickle::MakeStr(std::to_string(key)), pickle::MakeStr("cpu"),
         pickle::MakeInt(static_cast<int64_t>(storages[key].size() / 4))}));
    pickle::ValuePtr call = pickle::MakeCall(
        pickle::MakeGlobal("torch._utils", "_rebuild_tensor_v2"),
        pickle::MakeTuple({pid, pickle::MakeInt(offset), IntTuple(shape), IntTuple(stride),
                           pickle::MakeBool(false), OrderedDict()}));
    if (!parameter) return call;
    return pickle::MakeCall(pickle::MakeGlobal("torch._utils", "_rebuild_parameter"),
                            pickle::MakeTuple({call, pickle::MakeBool(true), OrderedDict()}));
  }
  // The file: data.pkl of `root`, the storages, then `extra` records; every CRC in place.
  std::string Write(const pickle::ValuePtr& root, const std::string& prefix,
                    const std::vector<std::pair<std::string, std::string>>& extra = {}) const;
};

// Bytes [offset, offset + len) of recipe r over in-memory sources.
inline std::string ReadView(const Recipe& r, const std::vector<std::string>& src, uint64_t offset,
                            uint64_t len) {
  std::string out;
  Status st = r.Walk(offset, len, [&](const Piece& p) {
    if (p.literal) {
      out.append(reinterpret_cast<const char*>(p.literal), p.len);
    } else if (p.mean) {
      SourceReadFn read = [&](uint32_t s, uint64_t off, uint64_t n,
                              const std::function<void(const uint8_t*, size_t)>& sink) {
        sink(reinterpret_cast<const uint8_t*>(src[s].data()) + off, n);
        return Status::Ok();
      };
      std::string bytes(p.len, '\0');
      RETURN_IF_ERROR(MeanBytes(p, read, reinterpret_cast<uint8_t*>(bytes.data())));
      out += bytes;
    } else {
      out += src[p.source].substr(p.offset, p.len);
    }
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}
inline std::string Materialize(const Recipe& r, const std::vector<std::string>& src) {
  return ReadView(r, src, 0, r.size());
}

inline Result<TorchFile> Parse(const std::string& bytes) {
  return ReadTorchFile(bytes.size(), [&bytes](uint64_t off, size_t len) -> Result<std::string> {
    if (off > bytes.size() || len > bytes.size() - off) return IoError("past the end");
    return bytes.substr(off, len);
  });
}

inline std::string FileBuilder::Write(
    const pickle::ValuePtr& root, const std::string& prefix,
    const std::vector<std::pair<std::string, std::string>>& extra) const {
  auto pkl = pickle::Write(root, 2);
  EXPECT_TRUE(pkl.ok()) << pkl.status().ToString();
  TorchZipWriter w(prefix);
  w.AddBytes("data.pkl", pkl.ok() ? *pkl : "");
  for (size_t i = 0; i < storages.size(); ++i) w.AddBytes("data/" + std::to_string(i), storages[i]);
  for (const auto& [n, b] : extra) w.AddBytes(n, b);
  ViewFile f = w.Finish();
  EXPECT_TRUE(f.crc_tasks.empty());
  return Materialize(f.recipe, {});
}

}  // namespace ckptfs::reshard::testref
