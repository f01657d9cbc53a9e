// safetensors::ParseHeader on arbitrary bytes taken as a whole file. Accepted files must satisfy
// the format's invariants, agree with the streaming probe, and survive BuildHeader: writing the
// parsed tensors back out gives a header that parses to the same tensors and metadata.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "formats/safetensors.h"
#include "fuzz/fuzz_check.h"

using ckptfs::Code;
namespace st = ckptfs::safetensors;

namespace {

// Tensors in data order: by relative offset, then length (an empty tensor may share its offset
// with the next one), then name. Each as (relative offset, length, name, dtype, shape).
using Row = std::tuple<uint64_t, uint64_t, std::string, st::Dtype, std::vector<uint64_t>>;
std::vector<Row> Rows(const st::Header& h) {
  std::vector<Row> rows;
  for (const st::TensorInfo& t : h.tensors) {
    rows.emplace_back(t.offset - h.data_start(), t.length, t.name, t.dtype, t.shape);
  }
  std::sort(rows.begin(), rows.end());
  return rows;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto need = st::HeaderBytesNeeded(data, size);
  auto h = st::ParseHeader(data, size, size);
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == Code::kCorrupt);
    return 0;
  }
  FUZZ_CHECK(need.ok() && *need == h->data_start());
  FUZZ_CHECK(h->file_size() == size);
  // The header alone parses too, without the size check.
  FUZZ_CHECK(st::ParseHeader(data, h->data_start()).ok());

  // Tensors tile [data_start, size) and each length follows from dtype and shape.
  const std::vector<Row> rows = Rows(*h);
  uint64_t next = 0;
  for (const auto& [offset, length, name, dtype, shape] : rows) {
    FUZZ_CHECK(offset == next);
    unsigned __int128 bits = st::DtypeBits(dtype);
    for (uint64_t d : shape) bits *= d;
    FUZZ_CHECK(bits == static_cast<unsigned __int128>(length) * 8);
    next += length;
  }
  FUZZ_CHECK(next == h->data_len);

  // Write the tensors back in data order; the result parses to the same description.
  std::vector<st::TensorSpec> specs;
  for (const auto& [offset, length, name, dtype, shape] : rows)
    specs.push_back({name, dtype, shape});
  auto built = st::BuildHeader(specs, h->metadata);
  FUZZ_CHECK(built.ok());
  FUZZ_CHECK(built->bytes.size() % 8 == 0);
  FUZZ_CHECK(built->file_size - built->bytes.size() == h->data_len);
  std::string file = built->bytes;
  file.append(reinterpret_cast<const char*>(data) + h->data_start(), h->data_len);
  auto again = st::ParseHeader(file, file.size());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(Rows(*again) == rows);
  FUZZ_CHECK(again->metadata == h->metadata);
  return 0;
}
