#include "formats/safetensors.h"

#include <algorithm>
#include <unordered_set>

#include "formats/json.h"

namespace ckptfs::safetensors {
namespace {

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  uint32_t bits;
};

// Indexed by Dtype.
constexpr DtypeRow kDtypes[] = {
    {Dtype::kBool, "BOOL", 8},
    {Dtype::kF4, "F4", 4},
    {Dtype::kF6E2M3, "F6_E2M3", 6},
    {Dtype::kF6E3M2, "F6_E3M2", 6},
    {Dtype::kU8, "U8", 8},
    {Dtype::kI8, "I8", 8},
    {Dtype::kF8E5M2, "F8_E5M2", 8},
    {Dtype::kF8E4M3, "F8_E4M3", 8},
    {Dtype::kF8E8M0, "F8_E8M0", 8},
    {Dtype::kF8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {Dtype::kF8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {Dtype::kI16, "I16", 16},
    {Dtype::kU16, "U16", 16},
    {Dtype::kF16, "F16", 16},
    {Dtype::kBF16, "BF16", 16},
    {Dtype::kI32, "I32", 32},
    {Dtype::kU32, "U32", 32},
    {Dtype::kF32, "F32", 32},
    {Dtype::kC64, "C64", 64},
    {Dtype::kF64, "F64", 64},
    {Dtype::kI64, "I64", 64},
    {Dtype::kU64, "U64", 64},
};
static_assert(std::size(kDtypes) == static_cast<size_t>(Dtype::kU64) + 1);

constexpr std::string_view kMetadataKey = "__metadata__";

// Tensor names come from the file; keep error messages short whatever they hold.
std::string Quote(std::string_view name) {
  constexpr size_t kMax = 200;
  if (name.size() <= kMax) return "'" + std::string(name) + "'";
  return "'" + std::string(name.substr(0, kMax)) + "...'";
}

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | p[i];
  return n;
}

// Bytes of a tensor of `dtype` and `shape`, or an error naming why there is no such number.
// `bad` builds the error (Corrupt when reading a file, Invalid when writing one).
template <typename MakeError>
Result<uint64_t> ByteLength(Dtype dtype, const std::vector<uint64_t>& shape, std::string_view name,
                            MakeError bad) {
  uint64_t elements = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(elements, dim, &elements)) {
      return bad("safetensors: element count of tensor " + Quote(name) + " overflows");
    }
  }
  uint64_t bits;
  if (__builtin_mul_overflow(elements, uint64_t{DtypeBits(dtype)}, &bits)) {
    return bad("safetensors: bit count of tensor " + Quote(name) + " overflows");
  }
  if (bits % 8 != 0) {
    return bad("safetensors: tensor " + Quote(name) + " of " + std::string(DtypeName(dtype)) +
               " does not fill a whole number of bytes");
  }
  return bits / 8;
}

Status CorruptEntry(std::string_view name, std::string_view what) {
  return Corrupt("safetensors: tensor " + Quote(name) + ": " + std::string(what));
}

// A JSON integer >= 0. Integers beyond int64 arrive as doubles and are rejected: no valid file
// has offsets that large.
bool AsUnsigned(const json::Value& v, uint64_t* out) {
  if (!v.is_int() || v.as_int() < 0) return false;
  *out = static_cast<uint64_t>(v.as_int());
  return true;
}

// One "<name>": {"dtype":..., "shape":..., "data_offsets":...} entry. Leaves offsets relative.
Status ParseEntry(const std::string& name, const json::Value& v, TensorInfo* t, uint64_t* begin,
                  uint64_t* end) {
  if (!v.is_object()) return CorruptEntry(name, "entry is not an object");
  const json::Value *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const json::Member& m : v.as_object()) {
    if (m.first == "dtype") {
      dtype = &m.second;
    } else if (m.first == "shape") {
      shape = &m.second;
    } else if (m.first == "data_offsets") {
      offsets = &m.second;
    }  // other fields are ignored, as the reference ignores them
  }
  if (!dtype || !shape || !offsets) {
    return CorruptEntry(name, "needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (!dtype->is_string()) return CorruptEntry(name, "\"dtype\" is not a string");
  std::optional<Dtype> d = DtypeFromName(dtype->as_string());
  if (!d) return CorruptEntry(name, "unknown dtype " + Quote(dtype->as_string()));
  if (!shape->is_array()) return CorruptEntry(name, "\"shape\" is not an array");
  t->name = name;
  t->dtype = *d;
  t->shape.reserve(shape->as_array().size());
  for (const json::Value& dim : shape->as_array()) {
    uint64_t n;
    if (!AsUnsigned(dim, &n)) return CorruptEntry(name, "a dimension is not an integer >= 0");
    t->shape.push_back(n);
  }
  if (!offsets->is_array() || offsets->as_array().size() != 2 ||
      !AsUnsigned(offsets->as_array()[0], begin) || !AsUnsigned(offsets->as_array()[1], end)) {
    return CorruptEntry(name, "\"data_offsets\" is not two integers >= 0");
  }
  return Status::Ok();
}

Status ParseMetadata(const json::Value& v, std::optional<Metadata>* out) {
  if (v.is_null()) return Status::Ok();  // the reference reads null as "no metadata"
  if (!v.is_object()) return Corrupt("safetensors: __metadata__ is not an object");
  Metadata md;
  md.reserve(v.as_object().size());
  for (const json::Member& m : v.as_object()) {
    if (!m.second.is_string()) {
      return Corrupt("safetensors: __metadata__ value of " + Quote(m.first) + " is not a string");
    }
    md.emplace_back(m.first, m.second.as_string());
  }
  *out = std::move(md);
  return Status::Ok();
}

}  // namespace

std::string_view DtypeName(Dtype d) { return kDtypes[static_cast<size_t>(d)].name; }

uint32_t DtypeBits(Dtype d) { return kDtypes[static_cast<size_t>(d)].bits; }

std::optional<Dtype> DtypeFromName(std::string_view name) {
  for (const DtypeRow& row : kDtypes) {
    if (row.name == name) return row.dtype;
  }
  return std::nullopt;
}

Result<uint64_t> HeaderBytesNeeded(const uint8_t* head, size_t len) {
  if (len < 8) return uint64_t{8};
  const uint64_t n = LoadLe64(head);
  if (n > kMaxHeaderLen) {
    return Corrupt("safetensors: header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderLen));
  }
  return 8 + n;
}

Result<Header> ParseHeader(const uint8_t* data, size_t len, std::optional<uint64_t> file_size) {
  if (len < 8) {
    return Corrupt("safetensors: truncated: " + std::to_string(len) +
                   " bytes, the header length alone needs 8");
  }
  ASSIGN_OR_RETURN(const uint64_t needed, HeaderBytesNeeded(data, len));
  if (len < needed) {
    return Corrupt("safetensors: truncated: the header needs " + std::to_string(needed) +
                   " bytes, have " + std::to_string(len));
  }
  Header h;
  h.header_len = needed - 8;
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, h.header_len);
  auto doc = json::Parse(text);
  if (!doc.ok()) {
    // The JSON error's offset is within the header; the header starts at byte 8 of the file.
    return Corrupt("safetensors: header (at byte 8): " + doc.status().message());
  }
  if (!doc->is_object()) return Corrupt("safetensors: header is not a JSON object");

  // Relative offsets in header order; validated below in offset order.
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  spans.reserve(doc->as_object().size());
  h.tensors.reserve(doc->as_object().size());
  for (const json::Member& m : doc->as_object()) {
    if (m.first == kMetadataKey) {
      RETURN_IF_ERROR(ParseMetadata(m.second, &h.metadata));
      continue;
    }
    TensorInfo t;
    Span s{0, 0, h.tensors.size()};
    RETURN_IF_ERROR(ParseEntry(m.first, m.second, &t, &s.begin, &s.end));
    h.tensors.push_back(std::move(t));
    spans.push_back(s);
  }

  // The reference sorts by (begin, end) and then requires the tensors to tile the buffer.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t next = 0;
  for (const Span& s : spans) {
    TensorInfo& t = h.tensors[s.index];
    if (s.begin != next || s.end < s.begin) {
      const char* why = s.end < s.begin  ? "ends before it begins"
                        : s.begin < next ? "overlaps the tensor before it"
                                         : "leaves a hole before it";
      return Corrupt("safetensors: tensor " + Quote(t.name) + " data_offsets [" +
                     std::to_string(s.begin) + ", " + std::to_string(s.end) + "] " + why);
    }
    ASSIGN_OR_RETURN(const uint64_t bytes, ByteLength(t.dtype, t.shape, t.name, [](std::string m) {
                       return Corrupt(std::move(m));
                     }));
    if (s.end - s.begin != bytes) {
      return Corrupt("safetensors: tensor " + Quote(t.name) + " has " +
                     std::to_string(s.end - s.begin) + " bytes, its dtype and shape need " +
                     std::to_string(bytes));
    }
    t.offset = h.data_start() + s.begin;
    t.length = bytes;
    next = s.end;
  }
  h.data_len = next;
  if (file_size && *file_size != h.file_size()) {
    return Corrupt("safetensors: file has " + std::to_string(*file_size) +
                   " bytes, its header describes " + std::to_string(h.file_size()));
  }
  return h;
}

void SortLikeReference(std::vector<TensorSpec>* tensors) {
  std::stable_sort(tensors->begin(), tensors->end(), [](const TensorSpec& a, const TensorSpec& b) {
    if (a.dtype != b.dtype) return a.dtype > b.dtype;
    return a.name < b.name;
  });
}

Result<BuiltHeader> BuildHeader(const std::vector<TensorSpec>& tensors,
                                const std::optional<Metadata>& metadata) {
  BuiltHeader out;
  std::string& json = out.bytes;
  json.assign(8, '\0');  // the length, filled in at the end
  json.push_back('{');
  bool first = true;
  if (metadata) {
    json.append("\"__metadata__\":{");
    bool first_md = true;
    for (const auto& [key, value] : *metadata) {
      if (!first_md) json.push_back(',');
      first_md = false;
      RETURN_IF_ERROR(json::AppendQuoted(key, &json));
      json.push_back(':');
      RETURN_IF_ERROR(json::AppendQuoted(value, &json));
    }
    json.push_back('}');
    first = false;
  }
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  out.tensors.reserve(tensors.size());
  uint64_t offset = 0;
  for (const TensorSpec& spec : tensors) {
    if (spec.name == kMetadataKey) {
      return Invalid("safetensors: a tensor cannot be named __metadata__");
    }
    if (!names.insert(spec.name).second) {
      return Invalid("safetensors: duplicate tensor name " + Quote(spec.name));
    }
    ASSIGN_OR_RETURN(const uint64_t bytes,
                     ByteLength(spec.dtype, spec.shape, spec.name,
                                [](std::string m) { return Invalid(std::move(m)); }));
    uint64_t end;
    if (__builtin_add_overflow(offset, bytes, &end)) {
      return Invalid("safetensors: total data size overflows");
    }
    if (!first) json.push_back(',');
    first = false;
    RETURN_IF_ERROR(json::AppendQuoted(spec.name, &json));
    json.append(":{\"dtype\":\"");
    json.append(DtypeName(spec.dtype));
    json.append("\",\"shape\":[");
    for (size_t i = 0; i < spec.shape.size(); ++i) {
      if (i) json.push_back(',');
      json.append(std::to_string(spec.shape[i]));
    }
    json.append("],\"data_offsets\":[");
    json.append(std::to_string(offset));
    json.push_back(',');
    json.append(std::to_string(end));
    json.append("]}");
    out.tensors.push_back(TensorInfo{spec.name, spec.dtype, spec.shape, offset, bytes});
    offset = end;
  }
  json.push_back('}');
  // Spaces up to a multiple of 8, so the buffer after the header starts 8-byte aligned.
  const size_t n = (json.size() - 8 + 7) / 8 * 8;
  json.resize(8 + n, ' ');
  if (n > kMaxHeaderLen) {
    return Invalid("safetensors: header of " + std::to_string(n) + " bytes exceeds the limit");
  }
  for (int i = 0; i < 8; ++i) json[i] = static_cast<char>(uint64_t{n} >> (8 * i) & 0xFF);
  for (TensorInfo& t : out.tensors) t.offset += 8 + n;
  if (__builtin_add_overflow(uint64_t{8 + n}, offset, &out.file_size)) {
    return Invalid("safetensors: total file size overflows");
  }
  return out;
}

}  // namespace ckptfs::safetensors
