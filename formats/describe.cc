#include "formats/describe.h"

#include <algorithm>

#include "formats/json.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"

namespace ckptfs {
namespace {

bool Contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

Result<FileDescription> DescribeTorch(uint64_t size, const zip::ReadAtFn& read_at) {
  ASSIGN_OR_RETURN(TorchFile f, ReadTorchFile(size, read_at));
  FileDescription d;
  d.format = FileFormat::kTorchZip;
  for (const TorchTensor& t : f.pickle.tensors) {
    TensorInfo i{t.name, t.dtype, t.shape, {}, t.offset, t.length};
    if (!Contiguous(t.shape, t.stride)) i.stride = t.stride;
    d.tensors.push_back(std::move(i));
  }
  return d;
}

// torch's name for a safetensors dtype; the format's own name where torch has none.
std::string TorchDtype(safetensors::Dtype d) {
  using D = safetensors::Dtype;
  switch (d) {
    case D::kBool:
      return "bool";
    case D::kF4:
      return "float4_e2m1fn_x2";
    case D::kU8:
      return "uint8";
    case D::kI8:
      return "int8";
    case D::kF8E5M2:
      return "float8_e5m2";
    case D::kF8E4M3:
      return "float8_e4m3fn";
    case D::kF8E8M0:
      return "float8_e8m0fnu";
    case D::kF8E4M3Fnuz:
      return "float8_e4m3fnuz";
    case D::kF8E5M2Fnuz:
      return "float8_e5m2fnuz";
    case D::kI16:
      return "int16";
    case D::kU16:
      return "uint16";
    case D::kF16:
      return "float16";
    case D::kBF16:
      return "bfloat16";
    case D::kI32:
      return "int32";
    case D::kU32:
      return "uint32";
    case D::kF32:
      return "float32";
    case D::kC64:
      return "complex64";
    case D::kF64:
      return "float64";
    case D::kI64:
      return "int64";
    case D::kU64:
      return "uint64";
    default:
      return std::string(safetensors::DtypeName(d));
  }
}

Result<FileDescription> DescribeSafetensors(uint64_t size, const zip::ReadAtFn& read_at) {
  if (size < 8) return Corrupt("safetensors file shorter than its 8-byte header length");
  ASSIGN_OR_RETURN(std::string head, read_at(0, 8));
  ASSIGN_OR_RETURN(uint64_t need, safetensors::HeaderBytesNeeded(
                                      reinterpret_cast<const uint8_t*>(head.data()), 8));
  if (need > size) return Corrupt("safetensors header runs past the end of the file");
  ASSIGN_OR_RETURN(std::string bytes, read_at(0, static_cast<size_t>(need)));
  ASSIGN_OR_RETURN(safetensors::Header h, safetensors::ParseHeader(bytes, size));
  FileDescription d;
  d.format = FileFormat::kSafetensors;
  for (const safetensors::TensorInfo& t : h.tensors) {
    TensorInfo i{t.name, TorchDtype(t.dtype), {}, {}, t.offset, t.length};
    for (uint64_t dim : t.shape) i.shape.push_back(static_cast<int64_t>(dim));
    d.tensors.push_back(std::move(i));
  }
  return d;
}

void AppendInts(const std::vector<int64_t>& v, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out->push_back(',');
    *out += std::to_string(v[i]);
  }
  out->push_back(']');
}

// Names come from the file and may hold any bytes: invalid UTF-8 is replaced, never passed on.
void AppendString(const std::string& s, std::string* out) {
  if (json::AppendQuoted(s, out).ok()) return;
  std::string clean;
  for (unsigned char c : s) clean.push_back(c < 0x80 ? static_cast<char>(c) : '?');
  (void)json::AppendQuoted(clean, out);
}

}  // namespace

Result<FileDescription> DescribeFile(std::string_view name, uint64_t size,
                                     const zip::ReadAtFn& read_at) {
  ASSIGN_OR_RETURN(std::string head, read_at(0, static_cast<size_t>(std::min<uint64_t>(size, 16))));
  const FileFormat f =
      SniffFormat(reinterpret_cast<const uint8_t*>(head.data()), head.size(), name);
  switch (f) {
    case FileFormat::kTorchZip:
      return DescribeTorch(size, read_at);
    case FileFormat::kSafetensors:
      return DescribeSafetensors(size, read_at);
    default:
      break;
  }
  FileDescription d;
  d.format = f;
  return d;
}

std::string TensorsJson(const std::vector<TensorInfo>& tensors, size_t first, size_t max_bytes,
                        size_t* next) {
  std::string out = "[";
  size_t i = first;
  for (; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    std::string one = i > first ? "," : "";
    one += "{\"name\":";
    AppendString(t.name, &one);
    one += ",\"dtype\":";
    AppendString(t.dtype, &one);
    one += ",\"shape\":";
    AppendInts(t.shape, &one);
    if (!t.stride.empty()) {
      one += ",\"stride\":";
      AppendInts(t.stride, &one);
    }
    one +=
        ",\"offset\":" + std::to_string(t.offset) + ",\"length\":" + std::to_string(t.length) + "}";
    if (i > first && out.size() + one.size() + 1 > max_bytes) break;
    out += one;
  }
  out.push_back(']');
  *next = i;
  return out;
}

}  // namespace ckptfs
