#include "formats/describe.h"

#include <algorithm>

#include "formats/dcp.h"
#include "formats/json.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"

namespace ckptfs {
namespace {

// A torch.save file, or several back to back (a DCP .distcp file: one archive per item). Each
// archive is found from the end of the bytes before the one after it. Tensors of a file with
// several archives are named "<archive>.<name>", archives counted from 0 in file order (the
// root of a DCP item is the tensor itself, so its name is just the archive's number).
Result<FileDescription> DescribeTorch(uint64_t size, const zip::ReadAtFn& read_at) {
  std::vector<std::vector<TensorInfo>> archives;  // last archive first
  for (uint64_t end = size; end > 0;) {
    auto f = ReadTorchFile(end, read_at);
    if (!f.ok()) {
      if (archives.empty()) return f.status();
      return Corrupt("the bytes before archive ending at " + std::to_string(end) +
                     " are not a torch archive: " + f.status().message());
    }
    std::vector<TensorInfo>& tensors = archives.emplace_back();
    for (const TorchTensor& t : f->pickle.tensors) {
      TensorInfo i{t.name, t.dtype, t.shape, {}, t.offset, t.length};
      if (!IsContiguous(t.shape, t.stride)) i.stride = t.stride;
      tensors.push_back(std::move(i));
    }
    if (f->dir.archive_start >= end) return Corrupt("torch archive with no bytes");
    end = f->dir.archive_start;
  }
  FileDescription d;
  d.format = archives.size() > 1 ? FileFormat::kDcpData : FileFormat::kTorchZip;
  for (size_t a = archives.size(); a-- > 0;) {
    for (TensorInfo& t : archives[a]) {
      if (archives.size() > 1) {
        const std::string n = std::to_string(archives.size() - 1 - a);
        t.name = t.name.empty() ? n : n + "." + t.name;
      }
      d.tensors.push_back(std::move(t));
    }
  }
  return d;
}

}  // namespace

std::string TorchDtypeName(safetensors::Dtype d) {
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

std::optional<safetensors::Dtype> SafetensorsDtypeOf(const std::string& torch_dtype) {
  for (int i = 0; i <= static_cast<int>(safetensors::Dtype::kU64); ++i) {
    const auto d = static_cast<safetensors::Dtype>(i);
    if (TorchDtypeName(d) == torch_dtype) return d;
  }
  return std::nullopt;
}

namespace {

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
    TensorInfo i{t.name, TorchDtypeName(t.dtype), {}, {}, t.offset, t.length};
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
  ASSIGN_OR_RETURN(std::string head, read_at(0, static_cast<size_t>(std::min<uint64_t>(size, 128))));
  const FileFormat f =
      SniffFormat(reinterpret_cast<const uint8_t*>(head.data()), head.size(), name);
  switch (f) {
    case FileFormat::kTorchZip:
    case FileFormat::kDcpData:
      return DescribeTorch(size, read_at);
    case FileFormat::kSafetensors:
      return DescribeSafetensors(size, read_at);
    case FileFormat::kDcpMetadata: {
      // Its tensors live in the data files; a damaged one is still an error worth seeing.
      if (size > (uint64_t{1} << 32)) return Corrupt("dcp metadata larger than 4 GiB");
      ASSIGN_OR_RETURN(std::string bytes, read_at(0, static_cast<size_t>(size)));
      RETURN_IF_ERROR(dcp::ParseMetadata(bytes).status());
      FileDescription d;
      d.format = f;
      return d;
    }
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
    one += ",\"offset\":" + std::to_string(t.offset) + ",\"length\":" + std::to_string(t.length);
    if (!t.global_shape.empty()) {
      one += ",\"global_shape\":";
      AppendInts(t.global_shape, &one);
      one += ",\"global_offset\":";
      AppendInts(t.global_offset, &one);
    }
    one.push_back('}');
    if (i > first && out.size() + one.size() + 1 > max_bytes) break;
    out += one;
  }
  out.push_back(']');
  *next = i;
  return out;
}

}  // namespace ckptfs
