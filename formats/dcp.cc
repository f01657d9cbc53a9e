#include "formats/dcp.h"

#include <algorithm>
#include <set>
#include <utility>

#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"

namespace ckptfs::dcp {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr std::string_view kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr std::string_view kShardModule = "torch.distributed._shard.sharded_tensor.metadata";

// The class name of an object built by NEWOBJ/REDUCE of a global ("" for anything else).
std::string_view ClassOf(const ValuePtr& v, std::string_view* module = nullptr) {
  if (!v || v->kind != Kind::kObject || !v->callable || v->callable->kind != Kind::kGlobal) {
    return {};
  }
  if (module) *module = v->callable->module;
  return v->callable->name;
}

bool IsClass(const ValuePtr& v, std::string_view name) {
  std::string_view module;
  return ClassOf(v, &module) == name && module == kMetadataModule;
}

// A field of a dataclass instance: its BUILD state is a dict of field name -> value. nullptr when
// the field is absent (optional fields are left out by some versions).
ValuePtr Field(const ValuePtr& obj, std::string_view name) {
  if (!obj || !obj->state || obj->state->kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : obj->state->pairs) {
    if (k && k->kind == Kind::kStr && k->str == name) return v;
  }
  return nullptr;
}

bool IsNone(const ValuePtr& v) { return !v || v->kind == Kind::kNone; }

Result<std::string> Str(const ValuePtr& v, const std::string& what) {
  if (!v || v->kind != Kind::kStr) return Corrupt("dcp metadata: " + what + " is not a string");
  return v->str;
}

Result<int64_t> Int(const ValuePtr& v, const std::string& what) {
  if (!v || v->kind != Kind::kInt) return Corrupt("dcp metadata: " + what + " is not an integer");
  return v->i;
}

// torch.Size((...)) or a plain tuple/list of ints.
Result<std::vector<int64_t>> Dims(const ValuePtr& v, const std::string& what) {
  const Value* t = v.get();
  if (t && t->IsCallOf("torch", "Size") && t->args && t->args->items.size() == 1) {
    t = t->args->items[0].get();
  }
  if (!t || (t->kind != Kind::kTuple && t->kind != Kind::kList)) {
    return Corrupt("dcp metadata: " + what + " is not a torch.Size");
  }
  std::vector<int64_t> out;
  for (const ValuePtr& d : t->items) {
    if (!d || d->kind != Kind::kInt || d->i < 0) {
      return Corrupt("dcp metadata: " + what + " has a dimension that is not a size");
    }
    out.push_back(d->i);
  }
  return out;
}

// TensorProperties: since torch 2.3 its state is the tuple (dtype, layout, requires_grad,
// memory format, pin_memory); a plain dataclass dict before that.
Status ReadProperties(const ValuePtr& props, TensorEntry* t) {
  std::string_view module;
  if (ClassOf(props, &module) != "TensorProperties" ||
      (module != kMetadataModule && module != kShardModule)) {
    return Corrupt("dcp metadata: tensor '" + t->fqn + "' has no TensorProperties");
  }
  ValuePtr dtype, requires_grad;
  if (props->state && props->state->kind == Kind::kTuple && props->state->items.size() >= 3) {
    dtype = props->state->items[0];
    requires_grad = props->state->items[2];
  } else {
    dtype = Field(props, "dtype");
    requires_grad = Field(props, "requires_grad");
  }
  if (!dtype || dtype->kind != Kind::kGlobal || dtype->module != "torch" ||
      DtypeSize(dtype->name) == 0) {
    return Corrupt("dcp metadata: tensor '" + t->fqn + "' has an unknown dtype");
  }
  t->dtype = dtype->name;
  t->requires_grad = requires_grad && requires_grad->kind == Kind::kBool && requires_grad->b;
  return Status::Ok();
}

// storage_data is keyed by MetadataIndex(fqn, offset): the chunk's offsets for a tensor, none
// for bytes. This key string joins both.
std::string IndexKey(const std::string& fqn, const std::vector<int64_t>* offsets) {
  std::string k = fqn;
  k.push_back('\0');
  if (!offsets) return k + "bytes";
  for (int64_t o : *offsets) k += std::to_string(o) + ",";
  return k;
}

Result<std::map<std::string, StorageRef>> ReadStorage(const ValuePtr& data) {
  std::map<std::string, StorageRef> out;
  if (IsNone(data)) return out;
  if (data->kind != Kind::kDict) return Corrupt("dcp metadata: storage_data is not a dict");
  for (const auto& [index, info] : data->pairs) {
    if (!IsClass(index, "MetadataIndex")) {
      return Corrupt("dcp metadata: a storage_data key is not a MetadataIndex");
    }
    ASSIGN_OR_RETURN(std::string fqn, Str(Field(index, "fqn"), "MetadataIndex.fqn"));
    if (ClassOf(info) != "_StorageInfo") {
      return Corrupt("dcp metadata: storage of '" + fqn + "' is not a _StorageInfo");
    }
    StorageRef ref;
    ASSIGN_OR_RETURN(ref.relative_path, Str(Field(info, "relative_path"), "storage of " + fqn));
    ASSIGN_OR_RETURN(int64_t off, Int(Field(info, "offset"), "storage offset of " + fqn));
    ASSIGN_OR_RETURN(int64_t len, Int(Field(info, "length"), "storage length of " + fqn));
    if (off < 0 || len < 0) return Corrupt("dcp metadata: storage of '" + fqn + "' is negative");
    ref.offset = static_cast<uint64_t>(off);
    ref.length = static_cast<uint64_t>(len);
    if (ValuePtr tr = Field(info, "transform_descriptors"); !IsNone(tr)) {
      if (tr->kind != Kind::kList && tr->kind != Kind::kTuple) {
        return Corrupt("dcp metadata: transforms of '" + fqn + "' are not a list");
      }
      for (const ValuePtr& d : tr->items) {
        ASSIGN_OR_RETURN(std::string s, Str(d, "transform of " + fqn));
        ref.transforms.push_back(std::move(s));
      }
    }
    const ValuePtr offset = Field(index, "offset");
    std::vector<int64_t> offsets;
    if (!IsNone(offset)) {
      ASSIGN_OR_RETURN(offsets, Dims(offset, "MetadataIndex.offset of " + fqn));
    }
    out[IndexKey(fqn, IsNone(offset) ? nullptr : &offsets)] = std::move(ref);
  }
  return out;
}

// Chunks lie inside the tensor, do not overlap and cover it exactly.
Status CheckChunks(const TensorEntry& t) {
  using Wide = unsigned __int128;
  Wide numel = 1, covered = 0;
  for (int64_t d : t.size) numel *= static_cast<uint64_t>(d);
  for (const Chunk& c : t.chunks) {
    if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) {
      return Corrupt("dcp metadata: a chunk of '" + t.fqn + "' has the wrong number of dims");
    }
    Wide vol = 1;
    for (size_t d = 0; d < t.size.size(); ++d) {
      if (c.offsets[d] > t.size[d] || c.sizes[d] > t.size[d] - c.offsets[d]) {
        return Corrupt("dcp metadata: a chunk of '" + t.fqn + "' lies outside the tensor");
      }
      vol *= static_cast<uint64_t>(c.sizes[d]);
    }
    covered += vol;
  }
  if (covered != numel) {
    return Corrupt("dcp metadata: the chunks of '" + t.fqn + "' do not cover it exactly");
  }
  // Equal volumes with an overlap would leave a gap; pairs are checked where there are few.
  if (t.chunks.size() <= 1024) {
    for (size_t a = 0; a < t.chunks.size(); ++a) {
      for (size_t b = a + 1; b < t.chunks.size(); ++b) {
        bool overlap = true;
        for (size_t d = 0; d < t.size.size() && overlap; ++d) {
          const Chunk &x = t.chunks[a], &y = t.chunks[b];
          overlap = x.offsets[d] < y.offsets[d] + y.sizes[d] &&
                    y.offsets[d] < x.offsets[d] + x.sizes[d];
        }
        if (overlap && !t.size.empty()) {
          return Corrupt("dcp metadata: two chunks of '" + t.fqn + "' overlap");
        }
      }
    }
  }
  return Status::Ok();
}

Result<TensorEntry> ReadTensor(const std::string& fqn, const ValuePtr& m,
                               std::map<std::string, StorageRef>& storage) {
  TensorEntry t;
  t.fqn = fqn;
  RETURN_IF_ERROR(ReadProperties(Field(m, "properties"), &t));
  ASSIGN_OR_RETURN(t.size, Dims(Field(m, "size"), "size of " + fqn));
  const ValuePtr chunks = Field(m, "chunks");
  if (!chunks || chunks->kind != Kind::kList) {
    return Corrupt("dcp metadata: chunks of '" + fqn + "' are not a list");
  }
  for (const ValuePtr& c : chunks->items) {
    if (!IsClass(c, "ChunkStorageMetadata")) {
      return Corrupt("dcp metadata: a chunk of '" + fqn + "' is not a ChunkStorageMetadata");
    }
    Chunk chunk;
    ASSIGN_OR_RETURN(chunk.offsets, Dims(Field(c, "offsets"), "chunk offsets of " + fqn));
    ASSIGN_OR_RETURN(chunk.sizes, Dims(Field(c, "sizes"), "chunk sizes of " + fqn));
    auto it = storage.find(IndexKey(fqn, &chunk.offsets));
    if (it == storage.end()) {
      return Corrupt("dcp metadata: a chunk of '" + fqn + "' has no storage entry");
    }
    chunk.storage = it->second;
    t.chunks.push_back(std::move(chunk));
  }
  RETURN_IF_ERROR(CheckChunks(t));
  return t;
}

Status ReadPlannerData(const ValuePtr& pd, Metadata* md) {
  if (IsNone(pd) || pd->kind != Kind::kDict) return Status::Ok();  // custom planners: anything
  for (const auto& [k, v] : pd->pairs) {
    if (!k || k->kind != Kind::kStr || !v || v->kind != Kind::kTuple) continue;
    std::vector<std::string> path;
    std::vector<bool> index;
    for (const ValuePtr& p : v->items) {
      index.push_back(p && p->kind == Kind::kInt);
      if (p && p->kind == Kind::kStr) {
        path.push_back(p->str);
      } else if (p && p->kind == Kind::kInt) {
        path.push_back(std::to_string(p->i));
      } else {
        return Corrupt("dcp metadata: planner_data path of '" + k->str + "' is not keys");
      }
    }
    md->key_paths[k->str] = std::move(path);
    md->key_path_index[k->str] = std::move(index);
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> Metadata::Files() const {
  std::set<std::string> files;
  for (const TensorEntry& t : tensors) {
    for (const Chunk& c : t.chunks) files.insert(c.storage.relative_path);
  }
  for (const BytesEntry& b : bytes) files.insert(b.storage.relative_path);
  return {files.begin(), files.end()};
}

uint64_t Metadata::TensorBytes() const {
  uint64_t total = 0;
  for (const TensorEntry& t : tensors) {
    uint64_t n = DtypeSize(t.dtype);
    for (int64_t d : t.size) n *= static_cast<uint64_t>(d);
    total += n;
  }
  return total;
}

Result<Metadata> ParseMetadata(std::string_view bytes) {
  ASSIGN_OR_RETURN(ValuePtr root, pickle::Read(bytes));
  if (!IsClass(root, "Metadata")) {
    return Corrupt("dcp metadata: not a pickle of " + std::string(kMetadataModule) + ".Metadata");
  }
  ASSIGN_OR_RETURN(auto storage, ReadStorage(Field(root, "storage_data")));
  const ValuePtr sdm = Field(root, "state_dict_metadata");
  if (!sdm || sdm->kind != Kind::kDict) {
    return Corrupt("dcp metadata: state_dict_metadata is not a dict");
  }
  Metadata md;
  for (const auto& [k, v] : sdm->pairs) {
    ASSIGN_OR_RETURN(std::string fqn, Str(k, "a state_dict_metadata key"));
    if (IsClass(v, "TensorStorageMetadata")) {
      ASSIGN_OR_RETURN(TensorEntry t, ReadTensor(fqn, v, storage));
      md.order.emplace_back(true, md.tensors.size());
      md.tensors.push_back(std::move(t));
    } else if (IsClass(v, "BytesStorageMetadata")) {
      auto it = storage.find(IndexKey(fqn, nullptr));
      if (it == storage.end()) return Corrupt("dcp metadata: '" + fqn + "' has no storage entry");
      md.order.emplace_back(false, md.bytes.size());
      md.bytes.push_back({fqn, it->second});
    } else {
      return Corrupt("dcp metadata: '" + fqn + "' is neither a tensor nor bytes");
    }
  }
  RETURN_IF_ERROR(ReadPlannerData(Field(root, "planner_data"), &md));
  if (ValuePtr v = Field(root, "version"); v && v->kind == Kind::kStr) md.version = v->str;
  return md;
}

Result<FileDescription> DescribeDataFile(const Metadata& md, std::string_view relative_path,
                                         uint64_t size, const zip::ReadAtFn& read_at) {
  FileDescription d;
  d.format = FileFormat::kDcpData;
  // A safetensors blob (torch >= 2.8's safetensors format), parsed once per start offset.
  std::map<uint64_t, safetensors::Header> blobs;
  for (const TensorEntry& t : md.tensors) {
    for (const Chunk& c : t.chunks) {
      const StorageRef& s = c.storage;
      if (s.relative_path != relative_path) continue;
      if (!s.transforms.empty()) {
        return Status(Code::kUnsupported, "dcp: '" + t.fqn + "' is stored through transforms (" +
                                              s.transforms[0] + "): no raw byte range");
      }
      if (s.offset > size || s.length > size - s.offset) {
        return Corrupt("dcp: '" + t.fqn + "' lies past the end of " + std::string(relative_path));
      }
      TensorInfo info{t.fqn, t.dtype, c.sizes, {}, 0, 0};
      if (c.sizes != t.size) {
        info.global_shape = t.size;
        info.global_offset = c.offsets;
      }
      ASSIGN_OR_RETURN(std::string magic, read_at(s.offset, std::min<uint64_t>(s.length, 4)));
      if (magic == "PK\x03\x04") {
        const uint64_t base = s.offset;
        auto window = [&](uint64_t off, size_t len) { return read_at(base + off, len); };
        auto f = ReadTorchFile(s.length, window);
        if (!f.ok()) return Corrupt("dcp: '" + t.fqn + "': " + f.status().message());
        if (f->pickle.tensors.size() != 1 || !f->pickle.tensors[0].name.empty()) {
          return Corrupt("dcp: the item of '" + t.fqn + "' is not one tensor");
        }
        const TorchTensor& tt = f->pickle.tensors[0];
        if (tt.dtype != t.dtype || tt.shape != c.sizes) {
          return Corrupt("dcp: the item of '" + t.fqn + "' is not the chunk the metadata names");
        }
        if (!IsContiguous(tt.shape, tt.stride)) info.stride = tt.stride;
        info.offset = base + tt.offset;
        info.length = tt.length;
      } else {
        auto blob = blobs.find(s.offset);
        if (blob == blobs.end()) {
          ASSIGN_OR_RETURN(std::string head, read_at(s.offset, std::min<uint64_t>(size - s.offset, 8)));
          auto need = safetensors::HeaderBytesNeeded(
              reinterpret_cast<const uint8_t*>(head.data()), head.size());
          if (!need.ok() || *need > size - s.offset) {
            return Corrupt("dcp: the item of '" + t.fqn + "' is neither a torch archive nor a "
                           "safetensors blob");
          }
          ASSIGN_OR_RETURN(std::string hdr, read_at(s.offset, static_cast<size_t>(*need)));
          auto h = safetensors::ParseHeader(hdr);
          if (!h.ok()) return Corrupt("dcp: safetensors blob of '" + t.fqn + "': " +
                                      h.status().message());
          blob = blobs.emplace(s.offset, std::move(*h)).first;
        }
        const safetensors::TensorInfo* found = nullptr;
        for (const auto& st : blob->second.tensors) {
          if (st.name == t.fqn) found = &st;
        }
        if (!found) return Corrupt("dcp: '" + t.fqn + "' is not in its safetensors blob");
        if (TorchDtypeName(found->dtype) != t.dtype ||
            std::vector<int64_t>(found->shape.begin(), found->shape.end()) != c.sizes ||
            found->offset > size - s.offset || found->length > size - s.offset - found->offset) {
          return Corrupt("dcp: '" + t.fqn + "' in the safetensors blob is not the named chunk");
        }
        info.offset = s.offset + found->offset;
        info.length = found->length;
      }
      d.tensors.push_back(std::move(info));
    }
  }
  std::stable_sort(d.tensors.begin(), d.tensors.end(),
                   [](const TensorInfo& a, const TensorInfo& b) { return a.offset < b.offset; });
  return d;
}

}  // namespace ckptfs::dcp
