// How a parameter's TP slices make its full tensor, as rows of pieces (MergeLayout), and cuts of
// gather streams: what the universal view and the tpT-dpD view share.
#include <algorithm>

#include "reshard/deepspeed_internal.h"

namespace ckptfs::reshard::ds {

namespace {
uint64_t Product(const std::vector<int64_t>& xs, size_t from, size_t to) {
  uint64_t n = 1;
  for (size_t i = from; i < to; ++i) n *= static_cast<uint64_t>(xs[i]);
  return n;
}
}  // namespace

Result<MergeLayout> LayoutOf(const Merge& m, const std::vector<std::vector<int64_t>>& slices,
                             const std::string& what) {
  MergeLayout l;
  const size_t n = m.kind == Merge::kReplicated ? 1 : slices.size();
  std::vector<uint64_t> numel;
  for (size_t i = 0; i < n; ++i) numel.push_back(Product(slices[i], 0, slices[i].size()));
  l.shape = slices[0];

  if (m.kind == Merge::kSubParams) {
    const std::vector<int64_t>& s = m.sub_shape;
    const size_t p = m.partition_dim;
    const uint64_t T = n, outer = Product(s, 0, p), inner = Product(s, p + 1, s.size());
    uint64_t per_rank = 0;  // elements of dimension p in one slice
    for (int64_t sub : m.subs) {
      if (sub % static_cast<int64_t>(T) != 0) {
        return Invalid(what + ": sub-parameter of " + std::to_string(sub) +
                       " does not split in the checkpoint's " + std::to_string(T) + " TP ranks");
      }
      per_rank += static_cast<uint64_t>(sub) / T;
    }
    for (size_t i = 0; i < n; ++i) {
      if (numel[i] != outer * per_rank * inner) {
        return Invalid(what + ": its TP slice of " + std::to_string(numel[i]) +
                       " elements does not view as parameter_with_sub_params' shape");
      }
      l.widths.push_back(per_rank * inner);
    }
    l.shape = s;
    l.rows = outer;
    uint64_t at = 0;
    for (int64_t sub : m.subs) {
      const uint64_t k = static_cast<uint64_t>(sub) / T;
      for (size_t i = 0; i < n; ++i) l.pieces.push_back({i, at * inner, k * inner});
      at += k;
    }
    return l;
  }

  const size_t dim = m.kind == Merge::kCat ? static_cast<size_t>(m.cat_dim) : 0;
  if (n > 1) {
    if (dim >= l.shape.size()) return Invalid(what + " has no dimension " + std::to_string(dim));
    l.shape[dim] = 0;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int64_t>& sh = slices[i];
      if (sh.size() != slices[0].size()) return Invalid(what + ": TP slices of different ranks");
      for (size_t d = 0; d < sh.size(); ++d) {
        if (d != dim && sh[d] != slices[0][d]) {
          return Invalid(what + ": TP slices differ outside dimension " + std::to_string(dim));
        }
      }
      l.shape[dim] += sh[dim];
    }
  }
  if (dim == 1) {
    // Row-parallel: each row of the full tensor is every slice's row in turn.
    if (l.shape.size() < 2) return Invalid(what + " is row-parallel but has one dimension");
    l.rows = static_cast<uint64_t>(l.shape[0]);
    for (size_t i = 0; i < n; ++i) {
      l.widths.push_back(l.rows ? numel[i] / l.rows : 0);
      l.pieces.push_back({i, 0, l.widths.back()});
    }
    return l;
  }
  // Dimension 0: one row, the slices one after another (two sub-parameters: every slice's first
  // half, then every slice's second half).
  const int halves = m.kind == Merge::kTwoSubParams ? 2 : 1;
  for (size_t i = 0; i < n; ++i) {
    if (halves == 2 && (slices[i].empty() || slices[i][0] % 2 != 0)) {
      return Invalid(what + " does not split in two halves");
    }
    l.widths.push_back(numel[i]);
  }
  for (int h = 0; h < halves; ++h) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t len = numel[i] / halves;
      l.pieces.push_back({i, h * len, len});
    }
  }
  return l;
}

std::vector<Part> RowPiece(const Gather& g, uint64_t r, uint64_t from, uint64_t to, bool strided) {
  std::vector<Part> out;
  uint64_t at = 0;
  for (const Part& p : g.parts) {
    const uint64_t a = std::max(from, at), b = std::min(to, at + p.len);
    if (a < b) {
      const uint64_t off = p.offset + r * p.stride + (a - at);
      out.push_back(Part{p.source, off, b - a, strided ? p.stride : b - a});
    }
    at += p.len;
  }
  return out;
}

std::vector<Gather> Cut(const std::vector<Gather>& gs, uint64_t from, uint64_t to) {
  std::vector<Gather> out;
  uint64_t at = 0;
  for (const Gather& g : gs) {
    const uint64_t size = GatherBytes(g);
    const uint64_t a = std::max(from, at), b = std::min(to, at + size);
    if (a < b) {
      if (g.mean) {  // the same elements of every array it averages (a cut between elements)
        const uint64_t size = MeanOutSize(g.mean_out), from = (a - at) / size * 4;
        const uint64_t len = (b - a) / size * 4;
        std::vector<Part> parts;
        for (const Part& p : g.parts) parts.push_back(Part{p.source, p.offset + from, len, len});
        out.push_back(Gather{1, std::move(parts), 0, true, g.mean_out});
      } else if (g.parts.empty()) {
        out.push_back(Gather{1, {}, b - a});
      } else {
        const uint64_t row = size / g.rows;
        uint64_t x = a - at;
        const uint64_t end = b - at;
        while (x < end) {
          const uint64_t r = x / row, in = x % row;
          if (in == 0 && end - x >= row) {  // whole rows
            const uint64_t k = (end - x) / row;
            std::vector<Part> parts;
            for (const Part& p : g.parts) {
              parts.push_back(Part{p.source, p.offset + r * p.stride, p.len, p.stride});
            }
            out.push_back(Gather{k, std::move(parts)});
            x += k * row;
          } else {
            const uint64_t stop = std::min(end - r * row, row);
            out.push_back(Gather{1, RowPiece(g, r, in, stop)});
            x = r * row + stop;
          }
        }
      }
    }
    at += size;
  }
  return out;
}

std::vector<Gather> Columns(const std::vector<Gather>& gs,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::vector<Gather> out;
  for (const Gather& g : gs) {
    std::vector<Part> parts;
    for (const auto& [from, to] : ranges) {
      std::vector<Part> more = RowPiece(g, 0, from, to, true);
      parts.insert(parts.end(), more.begin(), more.end());
    }
    out.push_back(Gather{g.rows, std::move(parts)});
  }
  return out;
}

}  // namespace ckptfs::reshard::ds
