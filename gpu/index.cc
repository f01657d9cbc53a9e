// The tensor index: user.ckptfs.tensors read from the mount and parsed, selection by name.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <unordered_map>

#include "common/xattr.h"
#include "formats/json.h"
#include "gpu/loader.h"

namespace ckptfs::gpu {
namespace {

// Pages are at most 64 KiB each; a count beyond this is not a list the mount wrote.
constexpr int64_t kMaxPages = 1 << 20;

Status Malformed(std::string_view file, size_t i, const std::string& what) {
  return Corrupt(std::string(file) + ": tensor index entry " + std::to_string(i) + ": " + what);
}

Status Ints(const json::Value& obj, const char* key, bool required, bool nonneg,
            std::vector<int64_t>* out, std::string_view file, size_t i) {
  const json::Value* v = obj.Find(key);
  if (!v) return required ? Malformed(file, i, std::string("no \"") + key + "\"") : Status::Ok();
  if (!v->is_array()) return Malformed(file, i, std::string("\"") + key + "\" is not a list");
  for (const json::Value& d : v->as_array()) {
    if (!d.is_int() || (nonneg && d.as_int() < 0)) {
      return Malformed(file, i, std::string("\"") + key + "\" holds something other than " +
                                    (nonneg ? "sizes" : "integers"));
    }
    out->push_back(d.as_int());
  }
  return Status::Ok();
}

Status U64(const json::Value& obj, const char* key, uint64_t* out, std::string_view file,
           size_t i) {
  const json::Value* v = obj.Find(key);
  if (!v || !v->is_int() || v->as_int() < 0) {
    return Malformed(file, i, std::string("\"") + key + "\" is missing or not a byte count");
  }
  *out = static_cast<uint64_t>(v->as_int());
  return Status::Ok();
}

Status ParseEntry(const json::Value& e, std::string_view file, size_t i, TensorInfo* t) {
  if (!e.is_object()) return Malformed(file, i, "not an object");
  const json::Value* name = e.Find("name");
  const json::Value* dtype = e.Find("dtype");
  if (!name || !name->is_string()) return Malformed(file, i, "\"name\" is missing or not text");
  t->name = name->as_string();
  if (!dtype || !dtype->is_string()) {
    return Malformed(file, i, "tensor '" + t->name + "': \"dtype\" is missing or not text");
  }
  t->dtype = dtype->as_string();
  RETURN_IF_ERROR(Ints(e, "shape", true, true, &t->shape, file, i));
  RETURN_IF_ERROR(Ints(e, "stride", false, true, &t->stride, file, i));
  if (!t->stride.empty() && t->stride.size() != t->shape.size()) {
    return Malformed(file, i, "tensor '" + t->name + "': stride and shape differ in rank");
  }
  RETURN_IF_ERROR(U64(e, "offset", &t->offset, file, i));
  RETURN_IF_ERROR(U64(e, "length", &t->length, file, i));
  RETURN_IF_ERROR(Ints(e, "global_shape", false, true, &t->global_shape, file, i));
  RETURN_IF_ERROR(Ints(e, "global_offset", false, true, &t->global_offset, file, i));
  return Status::Ok();
}

// One attribute's value. EIO is the mount saying the checkpoint does not decode (kCorrupt);
// FromErrno would call it, and EACCES too, an I/O error.
Result<std::string> GetAttr(const std::string& path, std::string_view name) {
  int err = 0;
  auto v = ReadXattr(path, std::string(name), &err);
  if (!v.ok() && err == EIO) return Corrupt(std::string(name) + ": " + std::strerror(err));
  return v;
}

// Turns a failed attribute read into the error a loader's user can act on.
Status Explain(const std::string& path, const Status& st) {
  switch (st.code()) {
    case Code::kNotFound:
      return NotFound(path + ": no such file");
    case Code::kNoData:
    case Code::kUnsupported:
      return Status(Code::kNoData, path + ": no tensor index (" + std::string(kXattrTensors) +
                                       "): the file is not on a ckptfs mount");
    case Code::kCorrupt:
      return Corrupt(path + ": the mount cannot list this checkpoint's tensors (EIO): the file "
                            "is damaged or truncated (the daemon's log says what is wrong)");
    default:
      return Status(st.code(), path + ": reading " + st.message());
  }
}

Result<std::vector<TensorInfo>> ReadPages(const std::string& path) {
  auto pages = GetAttr(path, kXattrTensorPages);
  if (!pages.ok()) return Explain(path, pages.status());
  const Status bad = Corrupt(path + ": bad " + std::string(kXattrTensorPages));
  int64_t n = 0;
  for (char c : *pages) {
    if (c < '0' || c > '9' || n > kMaxPages) return bad;
    n = n * 10 + (c - '0');
  }
  if (pages->empty() || n > kMaxPages) return bad;
  std::vector<TensorInfo> all;
  for (int64_t i = 0; i < n; ++i) {
    const std::string attr = std::string(kXattrTensors) + "." + std::to_string(i);
    auto page = GetAttr(path, attr);
    if (!page.ok()) return Explain(path, page.status());
    ASSIGN_OR_RETURN(std::vector<TensorInfo> part,
                     ParseTensorIndex(*page, path + " (" + attr + ")"));
    for (TensorInfo& t : part) all.push_back(std::move(t));
  }
  return all;
}

}  // namespace

Result<std::vector<TensorInfo>> ParseTensorIndex(std::string_view json_text,
                                                 std::string_view file) {
  auto v = json::Parse(json_text);
  if (!v.ok()) {
    return Corrupt(std::string(file) + ": tensor index is not JSON: " + v.status().message());
  }
  if (!v->is_array()) return Corrupt(std::string(file) + ": tensor index is not a list");
  std::vector<TensorInfo> out;
  out.reserve(v->as_array().size());
  for (const json::Value& e : v->as_array()) {
    TensorInfo t;
    RETURN_IF_ERROR(ParseEntry(e, file, out.size(), &t));
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::vector<TensorInfo>> ReadTensorIndex(const std::string& path) {
  std::vector<TensorInfo> tensors;
  auto one = GetAttr(path, kXattrTensors);
  if (one.ok()) {
    ASSIGN_OR_RETURN(tensors, ParseTensorIndex(*one, path));
  } else if (one.status().code() == Code::kValueTooLarge) {
    ASSIGN_OR_RETURN(tensors, ReadPages(path));
  } else {
    return Explain(path, one.status());
  }
  if (!tensors.empty()) return tensors;
  // An empty list: a checkpoint with no tensors, or a file that is no checkpoint at all.
  auto format = GetAttr(path, kXattrFormat);
  if (!format.ok()) return Explain(path, format.status());
  if (*format == "unknown") {
    return Status(Code::kNoData,
                  path + ": not a checkpoint ckptfs recognizes (user.ckptfs.format is 'unknown')");
  }
  if (*format == "dcp-metadata") {
    return Status(Code::kNoData, path + ": a DCP .metadata file holds no tensors; load the "
                                        ".distcp files beside it");
  }
  return tensors;
}

Result<std::vector<TensorInfo>> SelectTensors(const std::vector<TensorInfo>& index,
                                              std::span<const std::string> names,
                                              std::string_view file) {
  std::unordered_map<std::string_view, const TensorInfo*> by_name;
  by_name.reserve(index.size());
  for (const TensorInfo& t : index) by_name.emplace(t.name, &t);  // the first of a repeated name
  std::vector<TensorInfo> out;
  std::string unknown;
  size_t missing = 0;
  std::set<std::string_view> seen;
  for (const std::string& n : names) {
    auto it = by_name.find(n);
    if (it == by_name.end()) {
      if (!seen.insert(n).second) continue;
      if (missing++ < 20) unknown += (unknown.empty() ? "'" : ", '") + n + "'";
      continue;
    }
    out.push_back(*it->second);
  }
  if (missing) {
    if (missing > 20) unknown += ", ... (" + std::to_string(missing) + " in all)";
    return NotFound(std::string(file) + ": no tensor named " + unknown + " in its index of " +
                    std::to_string(index.size()) + " tensors");
  }
  return out;
}

std::string TensorIndexJson(const std::vector<TensorInfo>& tensors) {
  size_t next = 0;
  return TensorsJson(tensors, 0, SIZE_MAX, &next);
}

}  // namespace ckptfs::gpu
