#include "reshard/recipe.h"

#include <algorithm>

namespace ckptfs::reshard {

void Recipe::AddLiteral(std::string bytes) {
  if (bytes.empty()) return;
  Segment s;
  s.start = size_;
  s.row_len = bytes.size();
  s.literal = static_cast<uint32_t>(literals_.size());
  literals_.push_back(std::move(bytes));
  size_ += s.row_len;
  segments_.push_back(std::move(s));
}

void Recipe::AddGather(uint64_t rows, std::vector<Part> parts) {
  std::erase_if(parts, [](const Part& p) { return p.len == 0; });
  uint64_t row_len = 0;
  for (const Part& p : parts) row_len += p.len;
  if (rows == 0 || row_len == 0) return;
  // One part whose rows follow each other in the source is one range.
  if (rows > 1 && parts.size() == 1 && parts[0].stride == parts[0].len) {
    parts[0].len *= rows;
    parts[0].stride = parts[0].len;
    row_len = parts[0].len;
    rows = 1;
  }
  // A single row continuing the previous single-row gather from the same source merges with it.
  if (rows == 1 && parts.size() == 1 && !segments_.empty()) {
    Segment& last = segments_.back();
    if (!last.parts.empty() && !last.mean && last.rows == 1 && last.parts.size() == 1 &&
        last.parts[0].source == parts[0].source &&
        last.parts[0].offset + last.parts[0].len == parts[0].offset) {
      last.parts[0].len += parts[0].len;
      last.parts[0].stride = last.parts[0].len;
      last.row_len += row_len;
      size_ += row_len;
      return;
    }
  }
  Segment s;
  s.start = size_;
  s.rows = rows;
  s.row_len = row_len;
  s.parts = std::move(parts);
  size_ += s.size();
  segments_.push_back(std::move(s));
}

void Recipe::AddMean(std::vector<Part> parts, MeanOut out) {
  if (parts.empty() || parts[0].len == 0) return;
  Segment s;
  s.start = size_;
  s.row_len = parts[0].len / 4 * MeanOutSize(out);
  s.mean = true;
  s.mean_out = out;
  for (Part& p : parts) p.stride = p.len;
  s.parts = std::move(parts);
  size_ += s.size();
  segments_.push_back(std::move(s));
}

void Recipe::PatchLiteral(size_t literal_index, size_t pos, uint32_t v) {
  std::string& b = literals_[literal_index];
  for (int i = 0; i < 4; ++i) b[pos + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

Status Recipe::WalkSegment(const Segment& s, uint64_t from, uint64_t to,
                           const std::function<Status(const Piece&)>& fn) const {
  // [from, to) relative to the segment's start.
  if (s.parts.empty()) {
    const auto* p = reinterpret_cast<const uint8_t*>(literals_[s.literal].data());
    return fn(Piece{p + from, 0, 0, to - from});
  }
  if (s.mean) return fn(Piece{nullptr, 0, from, to - from, &s.parts, s.mean_out});
  uint64_t row = from / s.row_len;
  uint64_t in_row = from % s.row_len;
  uint64_t pos = from;
  while (pos < to) {
    uint64_t part_start = 0;
    for (const Part& p : s.parts) {
      if (pos >= to) break;
      if (in_row >= part_start + p.len) {
        part_start += p.len;
        continue;
      }
      const uint64_t skip = in_row - part_start;
      const uint64_t n = std::min(p.len - skip, to - pos);
      RETURN_IF_ERROR(fn(Piece{nullptr, p.source, p.offset + row * p.stride + skip, n}));
      pos += n;
      in_row += n;
      part_start += p.len;
    }
    ++row;
    in_row = 0;
  }
  return Status::Ok();
}

Status Recipe::Walk(uint64_t offset, uint64_t len,
                    const std::function<Status(const Piece&)>& fn) const {
  if (offset >= size_ || len == 0) return Status::Ok();
  const uint64_t end = std::min(size_, offset + len);
  auto it = std::upper_bound(segments_.begin(), segments_.end(), offset,
                             [](uint64_t off, const Segment& s) { return off < s.start; });
  for (--it; it != segments_.end() && it->start < end; ++it) {
    const uint64_t from = offset > it->start ? offset - it->start : 0;
    const uint64_t to = std::min(it->size(), end - it->start);
    RETURN_IF_ERROR(WalkSegment(*it, from, to, fn));
  }
  return Status::Ok();
}

Status Recipe::WalkSegments(size_t first, size_t last,
                            const std::function<Status(const Piece&)>& fn) const {
  for (size_t i = first; i < last && i < segments_.size(); ++i) {
    RETURN_IF_ERROR(WalkSegment(segments_[i], 0, segments_[i].size(), fn));
  }
  return Status::Ok();
}

}  // namespace ckptfs::reshard
