#include <libdeflate.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "reshard/half.h"
#include "reshard/view_file.h"

namespace ckptfs::reshard {
namespace {

constexpr uint64_t kAlign = 64;       // torch aligns every record's data to 64 bytes
constexpr uint32_t k32Max = 0xffffffffu;
constexpr uint16_t kDosDate = 0x21;  // 1980-01-01: fixed, so views are byte-identical everywhere

void Put16(std::string* s, uint16_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void Put64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// zlib's CRC-32 (the zip one), by libdeflate: folded with carry-less multiplies where the CPU has
// them, about twice zlib 1.2's speed, which matters in the CRC pass over a view file's records.
uint32_t Crc(uint32_t crc, const uint8_t* b, size_t n) { return libdeflate_crc32(crc, b, n); }
uint32_t Crc(const std::string& b) {
  return Crc(0, reinterpret_cast<const uint8_t*>(b.data()), b.size());
}

}  // namespace

void TorchZipWriter::AddHeader(Record* r) {
  const std::string name = prefix_ + "/" + r->name;
  r->header_offset = file_.recipe.size();
  const bool zip64 = r->size >= k32Max;
  std::string h;
  Put32(&h, 0x04034b50);
  Put16(&h, zip64 ? 45 : 20);
  Put16(&h, 0);  // flags: sizes and CRC are in this header
  Put16(&h, 0);  // stored
  Put16(&h, 0);
  Put16(&h, kDosDate);
  Put32(&h, r->crc);
  Put32(&h, zip64 ? k32Max : static_cast<uint32_t>(r->size));
  Put32(&h, zip64 ? k32Max : static_cast<uint32_t>(r->size));
  Put16(&h, static_cast<uint16_t>(name.size()));
  const size_t extra_len_pos = h.size();
  Put16(&h, 0);
  h += name;
  std::string extra;
  if (zip64) {
    Put16(&extra, 1);
    Put16(&extra, 16);
    Put64(&extra, r->size);
    Put64(&extra, r->size);
  }
  // Pad with an "FB" extra field so the data starts on a 64-byte boundary, as torch does.
  const uint64_t end = r->header_offset + h.size() + extra.size();
  uint64_t pad = (kAlign - end % kAlign) % kAlign;
  if (pad != 0 && pad < 4) pad += kAlign;
  if (pad != 0) {
    Put16(&extra, 0x4246);
    Put16(&extra, static_cast<uint16_t>(pad - 4));
    extra.append(pad - 4, 'Z');
  }
  h[extra_len_pos] = static_cast<char>(extra.size() & 0xff);
  h[extra_len_pos + 1] = static_cast<char>(extra.size() >> 8);
  h += extra;
  r->header_literal = file_.recipe.next_literal();
  file_.recipe.AddLiteral(std::move(h));
}

void TorchZipWriter::AddBytes(const std::string& name, std::string bytes) {
  Record r;
  r.name = name;
  r.size = bytes.size();
  r.crc = Crc(bytes);
  AddHeader(&r);
  file_.recipe.AddLiteral(std::move(bytes));
  records_.push_back(std::move(r));
}

uint64_t GatherBytes(const Gather& g) {
  if (g.mean) return g.parts.empty() ? 0 : g.parts[0].len / 4 * MeanOutSize(g.mean_out);
  if (g.parts.empty()) return g.zeros;
  uint64_t row = 0;
  for (const Part& p : g.parts) row += p.len;
  return g.rows * row;
}

void TorchZipWriter::AddGathers(const std::string& name, const std::vector<Gather>& gathers) {
  Record r;
  r.name = name;
  for (const Gather& g : gathers) r.size += GatherBytes(g);
  AddHeader(&r);
  CrcTask task;
  task.first_segment = file_.recipe.segment_count();
  for (const Gather& g : gathers) {
    if (g.mean) {
      file_.recipe.AddMean(g.parts, g.mean_out);
    } else if (g.parts.empty()) {
      file_.recipe.AddLiteral(std::string(g.zeros, '\0'));
    } else {
      file_.recipe.AddGather(g.rows, g.parts);
    }
  }
  task.last_segment = file_.recipe.segment_count();
  task.slots.push_back({r.header_literal, 14});
  if (r.size == 0) {
    r.crc = 0;
  } else {
    r.pending = true;
    r.pending_index = file_.crc_tasks.size();
    file_.crc_tasks.push_back(std::move(task));
  }
  records_.push_back(std::move(r));
}

ViewFile TorchZipWriter::Finish() {
  const uint64_t cd_offset = file_.recipe.size();
  const size_t cd_literal = file_.recipe.next_literal();
  std::string cd;
  for (const Record& r : records_) {
    const std::string name = prefix_ + "/" + r.name;
    const bool big = r.size >= k32Max;
    const bool far = r.header_offset >= k32Max;
    std::string extra;
    if (big || far) {
      Put16(&extra, 1);
      Put16(&extra, static_cast<uint16_t>((big ? 16 : 0) + (far ? 8 : 0)));
      if (big) {
        Put64(&extra, r.size);
        Put64(&extra, r.size);
      }
      if (far) Put64(&extra, r.header_offset);
    }
    if (r.pending) file_.crc_tasks[r.pending_index].slots.push_back({cd_literal, cd.size() + 16});
    Put32(&cd, 0x02014b50);
    Put16(&cd, (big || far) ? 45 : 20);  // made by: MS-DOS, spec version
    Put16(&cd, (big || far) ? 45 : 20);
    Put16(&cd, 0);
    Put16(&cd, 0);
    Put16(&cd, 0);
    Put16(&cd, kDosDate);
    Put32(&cd, r.crc);
    Put32(&cd, big ? k32Max : static_cast<uint32_t>(r.size));
    Put32(&cd, big ? k32Max : static_cast<uint32_t>(r.size));
    Put16(&cd, static_cast<uint16_t>(name.size()));
    Put16(&cd, static_cast<uint16_t>(extra.size()));
    Put16(&cd, 0);  // comment
    Put16(&cd, 0);  // disk
    Put16(&cd, 0);  // internal attributes
    Put32(&cd, 0);  // external attributes
    Put32(&cd, far ? k32Max : static_cast<uint32_t>(r.header_offset));
    cd += name;
    cd += extra;
  }
  const uint64_t cd_size = cd.size();
  const uint64_t n = records_.size();
  const bool zip64 = n >= 0xffff || cd_offset >= k32Max || cd_size >= k32Max;
  if (zip64) {
    const uint64_t eocd64_offset = cd_offset + cd_size;
    Put32(&cd, 0x06064b50);
    Put64(&cd, 44);
    Put16(&cd, 45);
    Put16(&cd, 45);
    Put32(&cd, 0);
    Put32(&cd, 0);
    Put64(&cd, n);
    Put64(&cd, n);
    Put64(&cd, cd_size);
    Put64(&cd, cd_offset);
    Put32(&cd, 0x07064b50);
    Put32(&cd, 0);
    Put64(&cd, eocd64_offset);
    Put32(&cd, 1);
  }
  Put32(&cd, 0x06054b50);
  Put16(&cd, 0);
  Put16(&cd, 0);
  Put16(&cd, zip64 ? 0xffff : static_cast<uint16_t>(n));
  Put16(&cd, zip64 ? 0xffff : static_cast<uint16_t>(n));
  Put32(&cd, zip64 ? k32Max : static_cast<uint32_t>(cd_size));
  Put32(&cd, zip64 ? k32Max : static_cast<uint32_t>(cd_offset));
  Put16(&cd, 0);
  file_.recipe.AddLiteral(std::move(cd));
  return std::move(file_);
}

namespace {

// A piece of a record's CRC: a known CRC, or bytes [offset, offset + len) of the view file. A
// known record read for `seen` is cut like the rest; its CRC counts once, on its first unit, for
// `crc_len` bytes (0 on the others).
struct CrcUnit {
  size_t task = 0;
  std::optional<uint32_t> known;
  uint64_t offset = 0, len = 0;
  uint64_t crc_len = 0;
};

constexpr uint64_t kCrcUnit = 16 << 20;  // bytes one thread checksums at a time

// The source bytes of a unit's small pieces, read ahead of its walk in a few large reads: a
// gather of rows (a row-parallel shard joined or split) is otherwise one read per row, a system
// call each from a plain directory. Pieces close in one source share a span; a gap joins a span
// only when it is no longer than the piece after it, so a span holds at most twice the bytes its
// pieces need.
class SpanCache {
 public:
  Status Load(const Recipe& r, uint64_t offset, uint64_t len, const SourceReadFn& read) {
    constexpr uint64_t kSmall = 64 << 10, kGap = 4096, kMaxSpan = 32 << 20;
    constexpr size_t kFew = 8;  // fewer small pieces than this are read as they come
    struct Range {
      uint32_t source;
      uint64_t off, len;
    };
    std::vector<Range> small;
    RETURN_IF_ERROR(r.Walk(offset, len, [&](const Piece& pc) -> Status {
      if (!pc.literal && !pc.mean && pc.len < kSmall) small.push_back({pc.source, pc.offset, pc.len});
      return Status::Ok();
    }));
    if (small.size() < kFew) return Status::Ok();
    std::sort(small.begin(), small.end(), [](const Range& a, const Range& b) {
      return a.source != b.source ? a.source < b.source : a.off < b.off;
    });
    size_t pieces = 0;
    auto close = [&]() -> Status {
      Span& s = spans_.back();
      if (pieces < 2) {  // nothing to join: read as it comes
        spans_.pop_back();
        return Status::Ok();
      }
      const uint64_t n = s.hi - s.lo;
      s.bytes.reset(new (std::nothrow) uint8_t[n]);
      if (!s.bytes) return IoError("no memory to read a view's source rows");
      uint64_t got = 0;
      RETURN_IF_ERROR(read(s.source, s.lo, n, [&](const uint8_t* b, size_t k) {
        if (got + k <= n) std::memcpy(s.bytes.get() + got, b, k);
        got += k;
      }));
      if (got != n) return Internal("a source read gave a view's rows the wrong byte count");
      return Status::Ok();
    };
    for (const Range& p : small) {
      if (!spans_.empty()) {
        const Span& s = spans_.back();
        if (p.source == s.source && p.off >= s.lo && p.off <= s.hi + std::min(kGap, p.len) &&
            p.off + p.len - s.lo <= kMaxSpan) {
          spans_.back().hi = std::max(s.hi, p.off + p.len);
          ++pieces;
          continue;
        }
        RETURN_IF_ERROR(close());
      }
      spans_.push_back(Span{p.source, p.off, p.off + p.len, nullptr});
      pieces = 1;
    }
    if (!spans_.empty()) RETURN_IF_ERROR(close());
    return Status::Ok();
  }

  // Source bytes [off, off + len) of `source` to sink, from a span when one holds them.
  Status Read(uint32_t source, uint64_t off, uint64_t len,
              const std::function<void(const uint8_t*, size_t)>& sink,
              const SourceReadFn& read) const {
    auto it = std::upper_bound(spans_.begin(), spans_.end(), std::pair{source, off},
                               [](const std::pair<uint32_t, uint64_t>& k, const Span& s) {
                                 return k.first != s.source ? k.first < s.source : k.second < s.lo;
                               });
    if (it != spans_.begin()) {
      const Span& s = *std::prev(it);
      if (s.source == source && off >= s.lo && off + len <= s.hi) {
        sink(s.bytes.get() + (off - s.lo), len);
        return Status::Ok();
      }
    }
    return read(source, off, len, sink);
  }

 private:
  struct Span {
    uint32_t source;
    uint64_t lo, hi;
    std::unique_ptr<uint8_t[]> bytes;
  };
  std::vector<Span> spans_;  // sorted by source, then offset; disjoint
};

// The CRC of unit `u`; with `keep`, its bytes are also gathered there (u.len bytes).
Result<uint32_t> UnitCrc(const ViewFile& f, const CrcUnit& u, const SourceReadFn& read,
                         uint8_t* keep) {
  if (u.known && !keep) return *u.known;
  SpanCache spans;
  if (!u.known) RETURN_IF_ERROR(spans.Load(f.recipe, u.offset, u.len, read));
  uint32_t crc = 0;
  size_t kept = 0;
  auto take = [&](const uint8_t* b, size_t n) {
    if (!u.known) crc = Crc(crc, b, n);
    if (keep && kept + n <= u.len) std::memcpy(keep + kept, b, n);
    kept += n;
  };
  std::vector<uint8_t> mean;
  RETURN_IF_ERROR(f.recipe.Walk(u.offset, u.len, [&](const Piece& pc) -> Status {
    if (pc.literal) {
      take(pc.literal, pc.len);
      return Status::Ok();
    }
    if (pc.mean) {
      mean.resize(pc.len);
      RETURN_IF_ERROR(MeanBytes(pc, read, mean.data()));
      take(mean.data(), pc.len);
      return Status::Ok();
    }
    return spans.Read(pc.source, pc.offset, pc.len, take, read);
  }));
  if (kept != u.len) return Internal("a source read gave a view record the wrong byte count");
  return u.known ? *u.known : crc;
}

}  // namespace

Status MeanBytes(const Piece& pc, const SourceReadFn& read, uint8_t* out) {
  // Whole elements around the bytes asked for.
  const uint64_t size = MeanOutSize(pc.mean_out);
  const uint64_t first = pc.offset / size, last = (pc.offset + pc.len + size - 1) / size;
  const size_t n = static_cast<size_t>(last - first);
  std::vector<float> sum(n, 0.0f), x(n);
  for (const Part& p : *pc.mean) {
    size_t at = 0;
    auto sink = [&](const uint8_t* b, size_t len) {
      len = std::min(len, n * 4 - at);
      std::memcpy(reinterpret_cast<uint8_t*>(x.data()) + at, b, len);
      at += len;
    };
    RETURN_IF_ERROR(read(p.source, p.offset + first * 4, n * 4, sink));
    if (at != n * 4) return Internal("a source read gave a mean the wrong byte count");
    for (size_t i = 0; i < n; ++i) sum[i] = sum[i] + x[i];  // 0 + a0 first: -0.0 becomes +0.0
  }
  const float count = static_cast<float>(pc.mean->size());
  for (size_t i = 0; i < n; ++i) sum[i] = sum[i] / count;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(sum.data());
  std::vector<uint16_t> half;
  if (pc.mean_out != MeanOut::kFloat32) {
    half.resize(n);
    for (size_t i = 0; i < n; ++i) {
      half[i] = pc.mean_out == MeanOut::kBFloat16 ? ToBFloat16(sum[i]) : ToFloat16(sum[i]);
    }
    bytes = reinterpret_cast<const uint8_t*>(half.data());
  }
  std::memcpy(out, bytes + (pc.offset - first * size), pc.len);
  return Status::Ok();
}

Status ComputeCrcs(ViewFile* f, const SourceReadFn& read, const KnownCrcFn& known,
                   size_t threads, const ViewBytesFn& seen) {
  // Each record's bytes in order, as units: source records whose CRC is known, and runs of
  // other bytes cut at multiples of kCrcUnit of the file, so that one large record spreads over
  // the threads too and the units `seen` gets start on page boundaries.
  std::vector<CrcUnit> units;
  const auto& segs = f->recipe.segments();
  for (size_t i = 0; i < f->crc_tasks.size(); ++i) {
    const CrcTask& t = f->crc_tasks[i];
    uint64_t run = 0, run_len = 0;  // a run of bytes not yet cut into units
    auto cut = [&](uint64_t start, uint64_t len, std::optional<uint32_t> c) {
      const uint64_t end = start + len;
      for (uint64_t at = start; at < end;) {
        const uint64_t to = std::min(end, (at / kCrcUnit + 1) * kCrcUnit);
        units.push_back(CrcUnit{i, c, at, to - at, c ? 0 : to - at});
        at = to;
      }
    };
    auto flush = [&] {
      cut(run, run_len, std::nullopt);
      run_len = 0;
    };
    for (size_t k = t.first_segment; k < t.last_segment; ++k) {
      const Segment& s = segs[k];
      if (known && !s.mean && s.rows == 1 && s.parts.size() == 1) {
        if (auto c = known(s.parts[0].source, s.parts[0].offset, s.parts[0].len)) {
          flush();
          if (seen && s.size() > 0) {  // read in units: a thread's copy stays one unit at most
            const size_t first = units.size();
            cut(s.start, s.size(), c);
            units[first].crc_len = s.size();
          } else {
            units.push_back(CrcUnit{i, c, s.start, s.size(), s.size()});
          }
          continue;
        }
      }
      if (run_len == 0) run = s.start;
      run_len += s.size();
    }
    flush();
  }
  const size_t n = units.size();
  std::vector<uint32_t> crcs(n);
  std::vector<Status> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    // This thread's copy of a unit for `seen`, grown to the largest unit it meets and reused;
    // not zeroed (every byte is written). Without the memory, the bytes are not shown.
    std::unique_ptr<uint8_t[]> keep;
    uint64_t capacity = 0;
    for (size_t i = next++; i < n; i = next++) {
      const CrcUnit& u = units[i];
      bool show = static_cast<bool>(seen);
      if (show && capacity < u.len) {
        keep.reset(new (std::nothrow) uint8_t[u.len]);
        capacity = keep ? u.len : 0;
        show = keep != nullptr;
      }
      auto c = UnitCrc(*f, u, read, show ? keep.get() : nullptr);
      if (c.ok()) {
        crcs[i] = *c;
        if (show) seen(u.offset, keep.get(), u.len);
      } else {
        errors[i] = c.status();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < std::min(threads, n); ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const Status& st : errors) RETURN_IF_ERROR(st);
  std::vector<uLong> task_crc(f->crc_tasks.size(), crc32(0L, Z_NULL, 0));
  for (size_t i = 0; i < n; ++i) {
    if (units[i].crc_len == 0) continue;  // the rest of a known record
    uLong& c = task_crc[units[i].task];
    c = crc32_combine(c, crcs[i], static_cast<z_off_t>(units[i].crc_len));
  }
  for (size_t i = 0; i < f->crc_tasks.size(); ++i) {
    for (auto [lit, pos] : f->crc_tasks[i].slots) {
      f->recipe.PatchLiteral(lit, pos, static_cast<uint32_t>(task_crc[i]));
    }
  }
  f->crc_tasks.clear();
  return Status::Ok();
}

}  // namespace ckptfs::reshard
