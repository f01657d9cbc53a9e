#include "formats/torch_file.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

namespace ckptfs {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

struct DtypeInfo {
  std::string_view storage;  // legacy storage class, empty when none
  std::string_view dtype;
  uint32_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {"DoubleStorage", "float64", 8},
    {"FloatStorage", "float32", 4},
    {"HalfStorage", "float16", 2},
    {"BFloat16Storage", "bfloat16", 2},
    {"LongStorage", "int64", 8},
    {"IntStorage", "int32", 4},
    {"ShortStorage", "int16", 2},
    {"CharStorage", "int8", 1},
    {"ByteStorage", "uint8", 1},
    {"BoolStorage", "bool", 1},
    {"ComplexDoubleStorage", "complex128", 16},
    {"ComplexFloatStorage", "complex64", 8},
    {"QUInt8Storage", "quint8", 1},
    {"QInt8Storage", "qint8", 1},
    {"QInt32Storage", "qint32", 4},
    {"QUInt4x2Storage", "quint4x2", 1},
    {"QUInt2x4Storage", "quint2x4", 1},
    {"UntypedStorage", "uint8", 1},
    {"", "complex32", 4},
    {"", "float8_e4m3fn", 1},
    {"", "float8_e5m2", 1},
    {"", "float8_e4m3fnuz", 1},
    {"", "float8_e5m2fnuz", 1},
    {"", "float8_e8m0fnu", 1},
    {"", "uint16", 2},
    {"", "uint32", 4},
    {"", "uint64", 8},
};

bool IsInt(const ValuePtr& v) { return v && v->kind == Kind::kInt; }
bool IsStr(const ValuePtr& v) { return v && v->kind == Kind::kStr; }

Result<std::vector<int64_t>> IntTuple(const ValuePtr& v, const char* what) {
  // Sizes are plain tuples; some writers wrap them as torch.Size((...)).
  const Value* t = v.get();
  if (t && t->IsCallOf("torch", "Size") && t->args && t->args->items.size() == 1) {
    t = t->args->items[0].get();
  }
  if (t == nullptr || (t->kind != Kind::kTuple && t->kind != Kind::kList)) {
    return Corrupt(std::string("tensor ") + what + " is not a tuple");
  }
  std::vector<int64_t> out;
  for (const ValuePtr& x : t->items) {
    if (!IsInt(x) || x->i < 0) return Corrupt(std::string("tensor ") + what + " has a bad entry");
    out.push_back(x->i);
  }
  return out;
}

class Walker {
 public:
  explicit Walker(TorchPickle* out) : out_(out) {}

  Status Walk(const ValuePtr& v, const std::string& path, size_t depth) {
    if (!v) return Status::Ok();
    if (depth > kMaxDepth)
      return Corrupt("data.pkl nests deeper than " + std::to_string(kMaxDepth));
    if (IsTensorCall(*v)) return AddTensor(*v, path);
    if (!on_path_.insert(v.get()).second) return Status::Ok();  // a cycle
    Status st = WalkChildren(v, path, depth);
    on_path_.erase(v.get());
    return st;
  }

 private:
  static constexpr size_t kMaxDepth = 512;

  static bool IsTensorCall(const Value& v) {
    return v.IsCallOf("torch._utils", "_rebuild_tensor_v2") ||
           v.IsCallOf("torch._utils", "_rebuild_tensor_v3") ||
           v.IsCallOf("torch._utils", "_rebuild_tensor") ||
           v.IsCallOf("torch._utils", "_rebuild_parameter") ||
           v.IsCallOf("torch._utils", "_rebuild_parameter_with_state");
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  static std::string KeyName(const ValuePtr& k) {
    if (IsStr(k)) return k->str;
    if (IsInt(k)) return std::to_string(k->i);
    return pickle::Debug(k, 80);
  }

  Status WalkPairs(const std::vector<std::pair<ValuePtr, ValuePtr>>& pairs, const std::string& path,
                   size_t depth) {
    for (const auto& [k, val] : pairs)
      RETURN_IF_ERROR(Walk(val, Join(path, KeyName(k)), depth + 1));
    return Status::Ok();
  }

  Status WalkItems(const std::vector<ValuePtr>& items, const std::string& path, size_t depth) {
    for (size_t i = 0; i < items.size(); ++i) {
      RETURN_IF_ERROR(Walk(items[i], Join(path, std::to_string(i)), depth + 1));
    }
    return Status::Ok();
  }

  Status WalkChildren(const ValuePtr& v, const std::string& path, size_t depth) {
    switch (v->kind) {
      case Kind::kDict:
        return WalkPairs(v->pairs, path, depth);
      case Kind::kList:
      case Kind::kTuple:
        return WalkItems(v->items, path, depth);
      case Kind::kObject:
        // OrderedDict and other dict subclasses carry their items; objects such as
        // argparse.Namespace carry their attributes in the BUILD state.
        RETURN_IF_ERROR(WalkPairs(v->dict_items, path, depth));
        RETURN_IF_ERROR(WalkItems(v->list_items, path, depth));
        if (v->state && v->state->kind == Kind::kDict)
          return WalkPairs(v->state->pairs, path, depth);
        if (v->state && v->state->kind == Kind::kTuple)
          return WalkItems(v->state->items, path, depth);
        return Status::Ok();
      default:
        return Status::Ok();
    }
  }

  Result<TorchStorage*> Storage(const ValuePtr& v, const std::string& name) {
    const Value* pid = v && v->kind == Kind::kPersId ? v->pid.get() : nullptr;
    if (pid == nullptr || pid->kind != Kind::kTuple || pid->items.size() != 5 ||
        !IsStr(pid->items[0]) || pid->items[0]->str != "storage" || !pid->items[1] ||
        pid->items[1]->kind != Kind::kGlobal || !IsStr(pid->items[2]) || !IsStr(pid->items[3]) ||
        !IsInt(pid->items[4]) || pid->items[4]->i < 0) {
      return Corrupt("tensor '" + name + "' has a malformed storage id");
    }
    TorchStorage s;
    if (!StorageType(pid->items[1]->name, &s.dtype, &s.itemsize)) {
      return Corrupt("tensor '" + name + "' has an unknown storage type " + pid->items[1]->name);
    }
    s.key = pid->items[2]->str;
    s.location = pid->items[3]->str;
    s.numel = static_cast<uint64_t>(pid->items[4]->i);
    if (s.numel > (uint64_t{1} << 50))
      return Corrupt("storage '" + s.key + "' is impossibly large");
    auto [it, fresh] = out_->storages.emplace(s.key, s);
    if (!fresh && (it->second.numel != s.numel || it->second.itemsize != s.itemsize)) {
      return Corrupt("storage '" + s.key + "' is described two different ways");
    }
    return &it->second;
  }

  Status AddTensor(const Value& call, const std::string& name) {
    const Value* v = &call;
    TorchTensor t;
    t.name = name;
    t.node = &call;
    if (v->IsCallOf("torch._utils", "_rebuild_parameter") ||
        v->IsCallOf("torch._utils", "_rebuild_parameter_with_state")) {
      t.parameter = true;
      if (!v->args || v->args->items.size() < 2 || !v->args->items[0]) {
        return Corrupt("parameter '" + name + "' has malformed arguments");
      }
      t.requires_grad = v->args->items[1]->kind == Kind::kBool && v->args->items[1]->b;
      v = v->args->items[0].get();
      if (!IsTensorCall(*v) || v->IsCallOf("torch._utils", "_rebuild_parameter")) {
        return Corrupt("parameter '" + name + "' does not wrap a tensor");
      }
    }
    const bool legacy = v->IsCallOf("torch._utils", "_rebuild_tensor");
    const auto& a = v->args ? v->args->items : std::vector<ValuePtr>{};
    if (a.size() < 4 || !IsInt(a[1]) || a[1]->i < 0) {
      return Corrupt("tensor '" + name + "' has malformed arguments");
    }
    ASSIGN_OR_RETURN(TorchStorage * s, Storage(a[0], name));
    t.storage_key = s->key;
    t.storage_offset = static_cast<uint64_t>(a[1]->i);
    ASSIGN_OR_RETURN(t.shape, IntTuple(a[2], "size"));
    ASSIGN_OR_RETURN(t.stride, IntTuple(a[3], "stride"));
    if (t.shape.size() != t.stride.size()) return Corrupt("tensor '" + name + "' size/stride rank");
    if (!legacy && !t.parameter && a.size() > 4 && a[4]->kind == Kind::kBool) {
      t.requires_grad = a[4]->b;
    }
    t.dtype = s->dtype;
    uint32_t itemsize = s->itemsize;
    if (v->IsCallOf("torch._utils", "_rebuild_tensor_v3") && a.size() > 6 && a[6] &&
        a[6]->kind == Kind::kGlobal) {
      t.dtype = a[6]->name;  // the tensor's dtype when the storage is untyped
      itemsize = DtypeSize(t.dtype);
      if (itemsize == 0) return Corrupt("tensor '" + name + "' has unknown dtype " + t.dtype);
    }
    // The elements the view reaches: 1 + sum((size-1) * stride), none when it is empty.
    uint64_t span = 1;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] == 0) {
        span = 0;
        break;
      }
      const auto reach = static_cast<unsigned __int128>(t.shape[i] - 1) * t.stride[i];
      if (reach > (uint64_t{1} << 50)) return Corrupt("tensor '" + name + "' is impossibly large");
      span += static_cast<uint64_t>(reach);
    }
    const uint64_t storage_bytes = s->nbytes();
    t.offset = t.storage_offset * itemsize;
    t.length = span * itemsize;
    if (t.offset > storage_bytes || t.length > storage_bytes - t.offset) {
      return Corrupt("tensor '" + name + "' reaches past the end of storage '" + s->key + "'");
    }
    out_->tensors.push_back(std::move(t));
    return Status::Ok();
  }

  TorchPickle* out_;
  std::unordered_set<const Value*> on_path_;
};

}  // namespace

bool StorageType(const std::string& cls, std::string* dtype, uint32_t* itemsize) {
  for (const DtypeInfo& d : kDtypes) {
    if (!d.storage.empty() && d.storage == cls) {
      *dtype = d.dtype;
      *itemsize = d.size;
      return true;
    }
  }
  return false;
}

uint32_t DtypeSize(const std::string& dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

Result<TorchPickle> DescribeTorchPickle(const pickle::ValuePtr& root) {
  TorchPickle out;
  Walker w(&out);
  RETURN_IF_ERROR(w.Walk(root, "", 0));
  return out;
}

std::vector<int64_t> ContiguousStride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

bool IsContiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

Result<TorchFile> ReadTorchFile(uint64_t file_size, const zip::ReadAtFn& read_at) {
  TorchFile f;
  ASSIGN_OR_RETURN(f.dir, zip::ReadDirectory(file_size, read_at));
  const zip::Entry* pkl = nullptr;
  for (const zip::Entry& e : f.dir.entries) {
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      pkl = &e;
      f.prefix = e.name.substr(0, slash);
      break;
    }
  }
  if (pkl == nullptr) return Corrupt("torch file has no <prefix>/data.pkl record");
  for (const zip::Entry& e : f.dir.entries) {
    if (e.method != 0) return Corrupt("torch file record '" + e.name + "' is compressed");
  }
  if (pkl->size > (uint64_t{1} << 32)) return Corrupt("torch file data.pkl is impossibly large");
  ASSIGN_OR_RETURN(std::string bytes, read_at(pkl->data_offset, pkl->size));
  ASSIGN_OR_RETURN(f.root, pickle::Read(bytes));
  ASSIGN_OR_RETURN(f.pickle, DescribeTorchPickle(f.root));
  for (auto& [key, s] : f.pickle.storages) {
    const zip::Entry* e = f.dir.Find(f.prefix + "/data/" + key);
    if (e == nullptr) return Corrupt("torch file has no record for storage '" + key + "'");
    if (e->size != s.nbytes()) {
      return Corrupt("torch file storage '" + key + "' holds " + std::to_string(e->size) +
                     " bytes, data.pkl says " + std::to_string(s.nbytes()));
    }
    s.data_offset = e->data_offset;
  }
  for (TorchTensor& t : f.pickle.tensors) t.offset += f.pickle.storages[t.storage_key].data_offset;
  return f;
}

}  // namespace ckptfs
