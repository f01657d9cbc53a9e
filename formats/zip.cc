#include "formats/zip.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace ckptfs::zip {

uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t Le64(const uint8_t* p) { return uint64_t{Le32(p)} | uint64_t{Le32(p + 4)} << 32; }

namespace {

constexpr uint32_t kMax32 = 0xffffffffu;
constexpr uint16_t kZip64ExtraId = 0x0001;

// The 64-bit values a zip64 extra field holds: only those whose 32-bit field is saturated, in the
// order size, compressed size, header offset.
struct Zip64Fields {
  uint64_t* size = nullptr;
  uint64_t* compressed = nullptr;
  uint64_t* offset = nullptr;
};

// Walks the extra fields; returns whether a zip64 field is present.
Result<bool> ParseExtra(const uint8_t* p, size_t len, Zip64Fields f) {
  bool zip64 = false;
  while (len >= 4) {
    const uint16_t id = Le16(p);
    const uint16_t n = Le16(p + 2);
    if (n > len - 4) return Corrupt("zip extra field runs past its header");
    if (id == kZip64ExtraId) {
      zip64 = true;
      const uint8_t* q = p + 4;
      size_t left = n;
      for (uint64_t* v : {f.size, f.compressed, f.offset}) {
        if (v == nullptr || *v != kMax32) continue;
        if (left < 8) return Corrupt("zip64 extra field too short");
        *v = Le64(q);
        q += 8;
        left -= 8;
      }
    }
    p += 4 + n;
    len -= 4 + n;
  }
  return zip64;
}

}  // namespace

std::optional<uint64_t> LocalHeader::known_size() const {
  if (has_descriptor()) return std::nullopt;
  return compressed_size;
}

Result<std::optional<LocalHeader>> ParseLocalHeader(const uint8_t* p, size_t len, size_t* need) {
  *need = kLocalFixed;
  if (len < 4) return std::optional<LocalHeader>();
  if (Le32(p) != kLocalSig) return Corrupt("not a zip local header");
  if (len < kLocalFixed) return std::optional<LocalHeader>();
  const size_t name_len = Le16(p + 26);
  const size_t extra_len = Le16(p + 28);
  *need = kLocalFixed + name_len + extra_len;
  if (len < *need) return std::optional<LocalHeader>();
  LocalHeader h;
  h.flags = Le16(p + 6);
  h.method = Le16(p + 8);
  h.crc32 = Le32(p + 14);
  h.compressed_size = Le32(p + 18);
  h.size = Le32(p + 22);
  h.name.assign(reinterpret_cast<const char*>(p + kLocalFixed), name_len);
  h.header_len = *need;
  ASSIGN_OR_RETURN(h.zip64, ParseExtra(p + kLocalFixed + name_len, extra_len,
                                       {&h.size, &h.compressed_size, nullptr}));
  return std::optional<LocalHeader>(std::move(h));
}

bool IsDescriptorFor(const uint8_t* p, bool zip64, uint64_t size) {
  if (Le32(p) != kDescriptorSig) return false;
  if (zip64) return Le64(p + 8) == size && Le64(p + 16) == size;
  return Le32(p + 8) == size && Le32(p + 12) == size;
}

const Entry* Directory::Find(const std::string& name) const {
  for (const Entry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

namespace {

struct EndRecord {
  uint64_t entries = 0;
  uint64_t cd_size = 0;
  uint64_t cd_offset = 0;  // in the file (the archive's start added)
  uint64_t end = 0;        // one past the end record
  uint64_t start = 0;      // where the archive starts in the file: its offsets count from here
};

// The end-of-central-directory record is the last thing in an archive, followed only by its
// comment (at most 64 KiB); the zip64 locator sits right before it.
Result<EndRecord> FindEnd(uint64_t file_size, const ReadAtFn& read_at) {
  const uint64_t tail_len = std::min<uint64_t>(file_size, kEocdFixed + 0xffff + 20);
  ASSIGN_OR_RETURN(std::string tail, read_at(file_size - tail_len, tail_len));
  const auto* t = reinterpret_cast<const uint8_t*>(tail.data());
  for (size_t i = tail.size() >= kEocdFixed ? tail.size() - kEocdFixed + 1 : 0; i-- > 0;) {
    if (Le32(t + i) != kEocdSig) continue;
    if (i + kEocdFixed + Le16(t + i + 20) != tail.size()) continue;  // comment must end the file
    EndRecord r;
    r.entries = Le16(t + i + 10);
    r.cd_size = Le32(t + i + 12);
    r.cd_offset = Le32(t + i + 16);
    r.end = file_size;
    const uint64_t eocd_at = file_size - tail.size() + i;
    const bool needs64 = r.entries == 0xffff || r.cd_size == kMax32 || r.cd_offset == kMax32;
    // Where the central directory really ends: right before the end record, or before the zip64
    // end record (56 bytes, as every writer of torch files makes it) and its 20-byte locator.
    uint64_t cd_end = eocd_at;
    if (i >= 20 && Le32(t + i - 20) == kLocator64Sig) {
      uint64_t eocd64 = Le64(t + i - 20 + 8);
      // Offsets in an archive that does not start the file (a DCP .distcp file holds archives
      // back to back) are relative to its own start: try where the record must be first.
      if (eocd_at >= 20 + 56) {
        ASSIGN_OR_RETURN(std::string probe, read_at(eocd_at - 20 - 56, 4));
        if (Le32(reinterpret_cast<const uint8_t*>(probe.data())) == kEocd64Sig &&
            eocd_at - 20 - 56 >= eocd64) {
          r.start = eocd_at - 20 - 56 - eocd64;
          eocd64 += r.start;
        }
      }
      if (eocd64 > file_size || file_size - eocd64 < 56) {
        return Corrupt("zip64 end record offset " + std::to_string(eocd64) + " outside the file");
      }
      ASSIGN_OR_RETURN(std::string rec, read_at(eocd64, 56));
      const auto* q = reinterpret_cast<const uint8_t*>(rec.data());
      if (Le32(q) != kEocd64Sig)
        return Corrupt("zip64 locator does not point at a zip64 end record");
      r.entries = Le64(q + 32);
      r.cd_size = Le64(q + 40);
      r.cd_offset = Le64(q + 48);
      cd_end = eocd64;
    } else if (needs64) {
      return Corrupt("zip end record needs zip64 but has no zip64 locator");
    } else if (r.cd_size <= cd_end && cd_end - r.cd_size >= r.cd_offset) {
      r.start = cd_end - r.cd_size - r.cd_offset;
    }
    if (r.cd_offset > UINT64_MAX - r.start) return Corrupt("zip central directory offset overflows");
    r.cd_offset += r.start;
    return r;
  }
  return Corrupt("no zip end-of-central-directory record (truncated file?)");
}

}  // namespace

Result<Directory> ReadDirectory(uint64_t file_size, const ReadAtFn& read_at) {
  ASSIGN_OR_RETURN(EndRecord end, FindEnd(file_size, read_at));
  if (end.cd_offset > file_size || end.cd_size > file_size - end.cd_offset) {
    return Corrupt("zip central directory outside the file");
  }
  if (end.entries > end.cd_size / kCentralFixed) {
    return Corrupt("zip central directory too small for its " + std::to_string(end.entries) +
                   " entries");
  }
  ASSIGN_OR_RETURN(std::string cd, read_at(end.cd_offset, end.cd_size));
  const auto* p = reinterpret_cast<const uint8_t*>(cd.data());
  size_t left = cd.size();
  Directory dir;
  dir.archive_end = end.end;
  dir.archive_start = end.start;
  dir.entries.reserve(end.entries);
  for (uint64_t i = 0; i < end.entries; ++i) {
    if (left < kCentralFixed || Le32(p) != kCentralSig) {
      return Corrupt("zip central directory entry " + std::to_string(i) + " is damaged");
    }
    const size_t name_len = Le16(p + 28), extra_len = Le16(p + 30), comment_len = Le16(p + 32);
    const size_t len = kCentralFixed + name_len + extra_len + comment_len;
    if (len > left)
      return Corrupt("zip central directory entry " + std::to_string(i) + " truncated");
    Entry e;
    e.method = Le16(p + 10);
    e.crc32 = Le32(p + 16);
    e.compressed_size = Le32(p + 20);
    e.size = Le32(p + 24);
    e.header_offset = Le32(p + 42);
    e.name.assign(reinterpret_cast<const char*>(p + kCentralFixed), name_len);
    RETURN_IF_ERROR(ParseExtra(p + kCentralFixed + name_len, extra_len,
                               {&e.size, &e.compressed_size, &e.header_offset})
                        .status());
    if (e.header_offset > UINT64_MAX - end.start) return Corrupt("zip record offset overflows");
    e.header_offset += end.start;
    dir.entries.push_back(std::move(e));
    p += len;
    left -= len;
  }
  // Each record's data starts after its own local header, whose extra field may differ in length
  // from the central one (torch pads local headers to align the data).
  for (Entry& e : dir.entries) {
    if (e.header_offset > end.cd_offset || end.cd_offset - e.header_offset < kLocalFixed) {
      return Corrupt("zip record '" + e.name + "' has its header outside the archive");
    }
    ASSIGN_OR_RETURN(std::string fixed, read_at(e.header_offset, kLocalFixed));
    const auto* h = reinterpret_cast<const uint8_t*>(fixed.data());
    if (Le32(h) != kLocalSig) return Corrupt("zip record '" + e.name + "' has no local header");
    const uint64_t data = e.header_offset + kLocalFixed + Le16(h + 26) + Le16(h + 28);
    if (data > end.cd_offset || e.compressed_size > end.cd_offset - data) {
      return Corrupt("zip record '" + e.name + "' runs past the central directory");
    }
    e.data_offset = data;
  }
  std::vector<const Entry*> by_offset;
  for (const Entry& e : dir.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->header_offset < b->header_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    if (prev.data_offset + prev.compressed_size > by_offset[i]->header_offset) {
      return Corrupt("zip records '" + prev.name + "' and '" + by_offset[i]->name + "' overlap");
    }
  }
  return dir;
}

}  // namespace ckptfs::zip
