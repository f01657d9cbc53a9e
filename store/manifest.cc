#include "store/manifest.h"

#include <algorithm>

namespace ckptfs {
namespace {

constexpr uint8_t kFormatVersion = 1;

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view& in, uint64_t* v) {
  uint64_t r = 0;
  for (int shift = 0; shift <= 63 && !in.empty(); shift += 7) {
    auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    r |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return true;
    }
  }
  return false;
}

}  // namespace

void Manifest::Append(const Extent& e) {
  if (e.len == 0) return;
  starts_.push_back(size_);
  extents_.push_back(e);
  size_ += e.len;
}

void Manifest::AppendHole(uint64_t len) {
  if (len == 0) return;
  if (!extents_.empty() && extents_.back().hole()) {
    extents_.back().len += len;
    size_ += len;
    return;
  }
  Append(Extent{ChunkId{}, len});
}

void Manifest::PopBack() {
  size_ -= extents_.back().len;
  extents_.pop_back();
  starts_.pop_back();
}

uint64_t Manifest::DataBytes() const {
  uint64_t n = 0;
  for (const Extent& e : extents_) n += e.hole() ? 0 : e.len;
  return n;
}

size_t Manifest::Find(uint64_t offset) const {
  if (offset >= size_) return extents_.size();
  auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

std::optional<uint64_t> Manifest::Seek(uint64_t offset, bool data) const {
  if (offset >= size_) return std::nullopt;
  for (size_t i = Find(offset); i < extents_.size(); ++i) {
    if (extents_[i].hole() != data) return std::max(offset, starts_[i]);
  }
  if (data) return std::nullopt;
  return size_;
}

// Layout: version byte, extent count, then per extent: a tag byte (0 hole, 1 chunk), the 16-byte
// id for chunks, and the length; integers as LEB128 varints.
std::string Manifest::Encode() const {
  std::string out;
  out.reserve(2 + extents_.size() * 21);
  out.push_back(static_cast<char>(kFormatVersion));
  PutVarint(out, extents_.size());
  for (const Extent& e : extents_) {
    if (e.hole()) {
      out.push_back(0);
    } else {
      out.push_back(1);
      uint8_t id[16];
      e.id.ToBytes(id);
      out.append(reinterpret_cast<const char*>(id), 16);
    }
    PutVarint(out, e.len);
  }
  return out;
}

Result<Manifest> Manifest::Decode(std::string_view in) {
  if (in.empty() || static_cast<uint8_t>(in[0]) != kFormatVersion) {
    return Corrupt("manifest has an unknown format version");
  }
  in.remove_prefix(1);
  uint64_t count;
  if (!GetVarint(in, &count) || count > in.size()) return Corrupt("manifest count is damaged");
  Manifest m;
  m.extents_.reserve(count);
  m.starts_.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (in.empty()) return Corrupt("manifest ends early");
    char tag = in.front();
    in.remove_prefix(1);
    Extent e;
    if (tag == 1) {
      if (in.size() < 16) return Corrupt("manifest ends inside a chunk id");
      e.id = ChunkId::FromBytes(reinterpret_cast<const uint8_t*>(in.data()));
      in.remove_prefix(16);
    } else if (tag != 0) {
      return Corrupt("manifest has an unknown extent tag");
    }
    if (!GetVarint(in, &e.len) || e.len == 0) return Corrupt("manifest extent length is damaged");
    m.Append(e);
  }
  if (!in.empty()) return Corrupt("manifest has trailing bytes");
  return m;
}

}  // namespace ckptfs
