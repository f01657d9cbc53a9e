#include "reshard/dcp_view.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "formats/pickle.h"
#include "formats/safetensors.h"
#include "formats/torch_file.h"

namespace ckptfs::reshard {

DcpChunkIndex::DcpChunkIndex(const std::vector<DcpDataFile>& files) {
  for (const DcpDataFile& f : files) {
    for (const TensorInfo& t : f.desc.tensors) {
      infos_[f.relative_path + '\0' + t.name].push_back({f.source, &t});
    }
  }
}

const TensorInfo* DcpChunkIndex::Find(const dcp::TensorEntry& t, const dcp::Chunk& c,
                                      uint32_t* source) const {
  const bool whole = c.sizes == t.size && std::all_of(c.offsets.begin(), c.offsets.end(),
                                                      [](int64_t o) { return o == 0; });
  const TensorInfo* info = nullptr;
  if (auto it = infos_.find(c.storage.relative_path + '\0' + t.fqn); it != infos_.end()) {
    for (const auto& [src, ti] : it->second) {
      if (ti->shape == c.sizes &&
          (ti->global_offset == c.offsets || (ti->global_offset.empty() && whole))) {
        info = ti;
        *source = src;
      }
    }
  }
  return info;
}
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr uint64_t kMaxBytes = uint64_t{1} << 62;  // any tensor larger is a corrupt size
constexpr int64_t kMaxListIndex = int64_t{1} << 20;

std::string Ints(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The legacy storage class torch.save names for a dtype ("float32" -> "FloatStorage"); empty for
// the dtypes added since (float8, uint16, ...), which torch saves as an UntypedStorage.
std::string LegacyStorageClass(const std::string& dtype) {
  static const char* const kClasses[] = {
      "DoubleStorage", "FloatStorage", "HalfStorage",          "BFloat16Storage",
      "LongStorage",   "IntStorage",   "ShortStorage",         "CharStorage",
      "ByteStorage",   "BoolStorage",  "ComplexDoubleStorage", "ComplexFloatStorage"};
  for (const char* cls : kClasses) {
    std::string d;
    uint32_t size = 0;
    if (StorageType(cls, &d, &size) && d == dtype) return cls;
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// A whole tensor from its chunks.

struct ChunkSrc {
  uint32_t source = 0;
  uint64_t base = 0;                       // the chunk's element 0 in the source, in bytes
  std::vector<int64_t> off, size, stride;  // in elements
  uint64_t piece = 0;                      // bytes of one contiguous piece (see Assembler)
};

// Expresses the tensor's row-major bytes as gathers over its chunks and checks that the chunks
// tile it exactly. Level k is the first dimension from which every chunk spans all later
// dimensions and is contiguous in its source: a chunk's sub-block from dimension k on, for fixed
// indices before k, is one contiguous piece, and the output row of dims k.. is the pieces of the
// chunks that hold it, in order along dim k. A chunk that is not contiguous even in its last
// dimension (a transposed view torch.save kept as it was) gets a trailing dimension of 1, so its
// pieces are single elements.
class Assembler {
 public:
  Assembler(const std::string& name, std::vector<int64_t> shape, uint64_t itemsize)
      : name_(name), rank_(shape.size()), shape_(std::move(shape)), e_(itemsize) {}

  Result<std::vector<Gather>> Run(std::vector<ChunkSrc> chunks) {
    std::erase_if(chunks, [](const ChunkSrc& c) {
      return std::any_of(c.size.begin(), c.size.end(), [](int64_t s) { return s == 0; });
    });
    if (std::any_of(shape_.begin(), shape_.end(), [](int64_t s) { return s == 0; })) return out_;
    if (shape_.empty()) {
      if (chunks.size() != 1)
        return Invalid("dcp view: tensor '" + name_ + "' has " + std::to_string(chunks.size()) +
                       " chunks of a 0-d tensor");
      out_.push_back(Gather{1, {Part{chunks[0].source, chunks[0].base, e_, e_}}});
      return out_;
    }
    chunks_ = std::move(chunks);
    size_t k = 0;
    bool elementwise = false;
    for (const ChunkSrc& c : chunks_) {
      for (size_t j = 0; j < rank_; ++j) {
        if (c.size[j] != shape_[j]) k = std::max(k, j);
      }
      const size_t from = ContiguousFrom(c);
      if (from == rank_) elementwise = true;
      k = std::max(k, std::min(from, rank_ - 1));
    }
    if (elementwise) {
      shape_.push_back(1);
      for (ChunkSrc& c : chunks_) {
        c.off.push_back(0);
        c.size.push_back(1);
        c.stride.push_back(1);
      }
      k = rank_;
    }
    k_ = k;
    for (ChunkSrc& c : chunks_) {
      c.piece = e_;
      for (size_t j = k_; j < shape_.size(); ++j) c.piece *= static_cast<uint64_t>(c.size[j]);
    }
    std::vector<Active> all;
    for (const ChunkSrc& c : chunks_) all.push_back({&c, c.base});
    std::vector<int64_t> lead;
    if (k_ == 0) {
      RETURN_IF_ERROR(Tile(&all, lead));
      Gather g{1, {}};
      for (const Active& a : all)
        g.parts.push_back(Part{a.c->source, a.at, a.c->piece, a.c->piece});
      out_.push_back(std::move(g));
    } else {
      RETURN_IF_ERROR(Level(0, &lead, all));
    }
    return std::move(out_);
  }

 private:
  struct Active {
    const ChunkSrc* c;
    uint64_t at;  // the source byte of the chunk's element at the current leading indices
  };

  // The first dimension from which the chunk is laid out row-major in its source (dimensions of
  // size 1 have no say); rank_ when not even the last one is.
  size_t ContiguousFrom(const ChunkSrc& c) const {
    size_t from = rank_;
    int64_t acc = 1;
    for (size_t j = rank_; j-- > 0;) {
      if (c.size[j] != 1) {
        if (c.stride[j] != acc) break;
        acc *= c.size[j];
      }
      from = j;
    }
    return from;
  }

  Status Uncovered(std::vector<int64_t> at, bool overlap) const {
    at.resize(rank_, 0);
    return Invalid("dcp view: the chunks of tensor '" + name_ + "' " +
                   (overlap ? "overlap at element " : "leave element ") + Ints(at) +
                   (overlap ? "" : " uncovered"));
  }

  // Sorts the chunks that hold the row at `lead` along dim k and checks that they tile it.
  Status Tile(std::vector<Active>* cov, std::vector<int64_t> lead) const {
    std::sort(cov->begin(), cov->end(),
              [&](const Active& x, const Active& y) { return x.c->off[k_] < y.c->off[k_]; });
    int64_t cur = 0;
    lead.resize(k_, 0);
    lead.push_back(0);
    for (const Active& a : *cov) {
      lead.back() = std::min(cur, a.c->off[k_]);
      if (a.c->off[k_] != cur) return Uncovered(lead, a.c->off[k_] < cur);
      cur += a.c->size[k_];
    }
    lead.back() = cur;
    if (cur != shape_[k_]) return Uncovered(lead, cur > shape_[k_]);
    return Status::Ok();
  }

  // Whether every chunk spans dims (d, k) whole with strides that let one row index run over
  // them: then dims d.. k-1 are one run of rows.
  bool Flattens(const std::vector<Active>& cov, size_t d) const {
    for (const Active& a : cov) {
      for (size_t j = d + 1; j < k_; ++j) {
        if (a.c->size[j] != shape_[j] || a.c->stride[j - 1] != a.c->stride[j] * a.c->size[j]) {
          return false;
        }
      }
    }
    return true;
  }

  // Dims d .. k-1 of the block whose earlier indices are `lead`; `act`: the chunks holding it.
  Status Level(size_t d, std::vector<int64_t>* lead, const std::vector<Active>& act) {
    std::vector<int64_t> cuts{0, shape_[d]};
    for (const Active& a : act) {
      cuts.push_back(a.c->off[d]);
      cuts.push_back(a.c->off[d] + a.c->size[d]);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size() && cuts[i] < shape_[d]; ++i) {
      const int64_t a = cuts[i], b = cuts[i + 1];
      std::vector<Active> cov;
      for (const Active& x : act) {
        if (x.c->off[d] <= a && a < x.c->off[d] + x.c->size[d]) {
          cov.push_back({x.c, x.at + static_cast<uint64_t>(a - x.c->off[d]) *
                                         static_cast<uint64_t>(x.c->stride[d]) * e_});
        }
      }
      lead->push_back(a);
      if (cov.empty()) return Uncovered(*lead, false);
      if (d + 1 == k_ || Flattens(cov, d)) {
        RETURN_IF_ERROR(Tile(&cov, *lead));
        uint64_t rows = static_cast<uint64_t>(b - a);
        for (size_t j = d + 1; j < k_; ++j) rows *= static_cast<uint64_t>(shape_[j]);
        Gather g{rows, {}};
        for (const Active& x : cov) {
          g.parts.push_back(
              Part{x.c->source, x.at, x.c->piece, static_cast<uint64_t>(x.c->stride[k_ - 1]) * e_});
        }
        out_.push_back(std::move(g));
      } else {
        for (int64_t x = a; x < b; ++x) {
          lead->back() = x;
          std::vector<Active> next = cov;
          for (Active& n : next) {
            n.at += static_cast<uint64_t>(x - a) * static_cast<uint64_t>(n.c->stride[d]) * e_;
          }
          RETURN_IF_ERROR(Level(d + 1, lead, next));
        }
      }
      lead->pop_back();
    }
    return Status::Ok();
  }

  const std::string& name_;
  const size_t rank_;  // without the trailing dimension an elementwise plan adds
  std::vector<int64_t> shape_;
  const uint64_t e_;
  std::vector<ChunkSrc> chunks_;
  size_t k_ = 0;
  std::vector<Gather> out_;
};

// ---------------------------------------------------------------------------------------------
// The nested state dict, as torch's set_element builds it.

struct Node {
  enum class Type : uint8_t { kNone, kDict, kList, kTensor, kValue };
  explicit Node(Type t) : type(t) {}
  Type type;
  std::vector<std::pair<DcpKey, std::unique_ptr<Node>>> dict;  // insertion order
  std::unordered_map<std::string, size_t> slot;                // dict: key id -> position
  std::vector<std::unique_ptr<Node>> list;
  size_t tensor = 0;  // kTensor: index into Metadata::tensors
  ValuePtr value;     // kValue
  // kValue from a torch.save archive that holds storages: each storage's bytes by its key there.
  std::map<std::string, std::string> storages;
};

std::string KeyId(const DcpKey& k) { return (k.index ? "i" : "s") + k.name; }

Result<size_t> ListIndex(const DcpKey& k, const std::string& fqn) {
  int64_t i = -1;
  const char* end = k.name.data() + k.name.size();
  auto [p, ec] = std::from_chars(k.name.data(), end, i);
  if (!k.index || ec != std::errc() || p != end || i < 0 || i > kMaxListIndex) {
    return Invalid("dcp view: the key path of '" + fqn + "' indexes a list with '" + k.name + "'");
  }
  return static_cast<size_t>(i);
}

// The slot `key` of container `cur`, created as an empty `want` when absent (None in a list).
Result<std::unique_ptr<Node>*> Slot(Node* cur, const DcpKey& key, Node::Type want,
                                    const std::string& fqn) {
  if (cur->type == Node::Type::kDict) {
    auto [it, fresh] = cur->slot.emplace(KeyId(key), cur->dict.size());
    if (fresh) cur->dict.emplace_back(key, std::make_unique<Node>(want));
    return &cur->dict[it->second].second;
  }
  if (cur->type == Node::Type::kList) {
    ASSIGN_OR_RETURN(size_t i, ListIndex(key, fqn));
    while (cur->list.size() <= i) cur->list.push_back(std::make_unique<Node>(Node::Type::kNone));
    if (cur->list[i]->type == Node::Type::kNone) cur->list[i] = std::make_unique<Node>(want);
    return &cur->list[i];
  }
  return Invalid("dcp view: the key path of '" + fqn + "' runs through a non-container");
}

Status SetElement(Node* root, const std::vector<DcpKey>& path, std::unique_ptr<Node> leaf,
                  const std::string& fqn) {
  if (path.empty()) return Invalid("dcp view: '" + fqn + "' has an empty key path");
  for (const DcpKey& k : path) {
    if (k.index) RETURN_IF_ERROR(ListIndex(k, fqn).status());
  }
  Node* cur = root;
  for (size_t i = 1; i < path.size(); ++i) {
    const Node::Type want = path[i].index ? Node::Type::kList : Node::Type::kDict;
    ASSIGN_OR_RETURN(std::unique_ptr<Node> * slot, Slot(cur, path[i - 1], want, fqn));
    cur = slot->get();
  }
  if (cur->type == Node::Type::kDict && path.back().index) {
    return Invalid("dcp view: the key path of '" + fqn + "' indexes a dict as a list");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Node> * slot, Slot(cur, path.back(), leaf->type, fqn));
  *slot = std::move(leaf);
  return Status::Ok();
}

// The persistent ids (storage references) in a value tree, each node once, in the order a
// depth-first walk meets them (the pickle's order for a tree without shared nodes).
std::vector<Value*> PersIds(const ValuePtr& root) {
  std::vector<Value*> out, todo{root.get()};
  std::unordered_set<const Value*> seen;
  while (!todo.empty()) {
    Value* v = todo.back();
    todo.pop_back();
    if (!v || !seen.insert(v).second) continue;
    if (v->kind == Kind::kPersId) {
      out.push_back(v);
      continue;
    }
    std::vector<Value*> kids;
    for (const ValuePtr& x : v->items) kids.push_back(x.get());
    for (const auto& [k, x] : v->pairs) kids.insert(kids.end(), {k.get(), x.get()});
    kids.insert(kids.end(), {v->callable.get(), v->args.get(), v->kwargs.get()});
    for (const ValuePtr& x : v->list_items) kids.push_back(x.get());
    for (const auto& [k, x] : v->dict_items) kids.insert(kids.end(), {k.get(), x.get()});
    kids.push_back(v->state.get());
    todo.insert(todo.end(), kids.rbegin(), kids.rend());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

class Planner {
 public:
  Planner(const dcp::Metadata& md, const DcpKeyPaths& paths, const std::vector<DcpDataFile>& files,
          const std::map<std::string, std::string>& items)
      : md_(md), paths_(paths), files_(files), items_(items) {}

  Result<DcpView> Run() {
    gathers_.resize(md_.tensors.size());
    for (size_t i = 0; i < md_.tensors.size(); ++i) {
      ASSIGN_OR_RETURN(gathers_[i], Assemble(md_.tensors[i]));
    }
    DcpView view;
    ASSIGN_OR_RETURN(view.model_pt, ModelPt());
    ASSIGN_OR_RETURN(view.model_safetensors, ModelSafetensors());
    return view;
  }

 private:

  Result<std::vector<Gather>> Assemble(const dcp::TensorEntry& t) {
    const uint64_t e = DtypeSize(t.dtype);
    if (e == 0) return Invalid("dcp view: tensor '" + t.fqn + "' has unknown dtype " + t.dtype);
    unsigned __int128 bytes = e;
    for (int64_t d : t.size) {
      bytes *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
      if (d < 0 || bytes > kMaxBytes)
        return Invalid("dcp view: tensor '" + t.fqn + "' is too large");
    }
    std::vector<ChunkSrc> chunks;
    for (const dcp::Chunk& c : t.chunks) {
      const std::string where = "the chunk at " + Ints(c.offsets) + " of tensor '" + t.fqn + "'";
      if (c.offsets.size() != t.size.size() || c.sizes.size() != t.size.size()) {
        return Invalid("dcp view: " + where + " has the wrong rank");
      }
      for (size_t j = 0; j < t.size.size(); ++j) {
        if (c.offsets[j] < 0 || c.sizes[j] < 0 || c.offsets[j] > t.size[j] ||
            c.sizes[j] > t.size[j] - c.offsets[j]) {
          return Invalid("dcp view: " + where + " lies outside it");
        }
      }
      uint32_t source = 0;
      const TensorInfo* info = chunks_.Find(t, c, &source);
      if (!info) {
        return Invalid("dcp view: " + where + " is not in the description of " +
                       c.storage.relative_path);
      }
      if (info->dtype != t.dtype) return Invalid("dcp view: " + where + " is " + info->dtype);
      ChunkSrc s{source, info->offset, c.offsets, c.sizes, info->stride, 0};
      if (s.stride.empty()) s.stride = ContiguousStride(c.sizes);
      // The bytes the chunk's elements reach must lie in its described range.
      unsigned __int128 span = 1;
      for (size_t j = 0; j < c.sizes.size(); ++j) {
        if (s.stride.size() != c.sizes.size() || s.stride[j] < 0) {
          return Invalid("dcp view: " + where + " has a bad stride");
        }
        if (c.sizes[j] == 0) span = 0;
        if (span) span += static_cast<unsigned __int128>(c.sizes[j] - 1) * s.stride[j];
      }
      if (span * e > info->length) return Invalid("dcp view: " + where + " reaches past its data");
      chunks.push_back(std::move(s));
    }
    return Assembler(t.fqn, t.size, e).Run(std::move(chunks));
  }

  std::vector<DcpKey> PathOf(const std::string& fqn) const {
    if (auto it = paths_.find(fqn); it != paths_.end()) return it->second;
    return {DcpKey{fqn, false}};
  }

  // The value of a non-tensor entry: the data.pkl tree of its torch.save archive, and the bytes
  // of the storages it holds (an RNG state's tensors, Transformer Engine's extra state), which
  // model.pt then holds as storages of its own, as dcp_to_torch_save's torch.load and save do.
  Result<ValuePtr> ItemValue(const dcp::BytesEntry& b,
                             std::map<std::string, std::string>* storages) const {
    auto it = items_.find(b.fqn);
    if (it == items_.end()) return Invalid("dcp view: the item of '" + b.fqn + "' was not read");
    const std::string& bytes = it->second;
    auto read = [&bytes](uint64_t off, size_t len) -> Result<std::string> {
      if (off > bytes.size() || len > bytes.size() - off) return Corrupt("read past the end");
      return bytes.substr(off, len);
    };
    auto f = ReadTorchFile(bytes.size(), read);
    if (!f.ok()) {
      return Invalid("dcp view: the item of '" + b.fqn +
                     "' is not a torch.save archive: " + f.status().message());
    }
    for (const auto& [key, st] : f->pickle.storages) {
      if (st.data_offset > bytes.size() || st.nbytes() > bytes.size() - st.data_offset) {
        return Invalid("dcp view: a storage of the item of '" + b.fqn + "' lies past its end");
      }
      (*storages)[key] = bytes.substr(st.data_offset, st.nbytes());
    }
    for (const Value* pid : PersIds(f->root)) {
      const ValuePtr& t = pid->pid;
      if (!t || t->kind != Kind::kTuple || t->items.size() < 3 || !t->items[2] ||
          t->items[2]->kind != Kind::kStr || !storages->count(t->items[2]->str)) {
        return Invalid("dcp view: the item of '" + b.fqn + "' names a storage it does not hold");
      }
    }
    return f->root;
  }

  Result<ValuePtr> Emit(const Node& n) {
    switch (n.type) {
      case Node::Type::kNone:
        return pickle::MakeNone();
      case Node::Type::kValue: {
        // The item's storages get model.pt's next keys, in the order the tree names them.
        std::map<std::string, std::string> renamed;
        std::unordered_set<const Value*> done;  // a tuple two ids share is renamed once
        for (Value* pid : PersIds(n.value)) {
          if (!done.insert(pid->pid.get()).second) continue;
          std::vector<ValuePtr>& t = pid->pid->items;
          const std::string old = t[2]->str;
          auto [it, fresh] = renamed.emplace(old, std::to_string(storage_of_.size()));
          if (fresh) storage_of_.push_back(Storage{0, n.storages.at(old)});
          t[2] = pickle::MakeStr(it->second);
        }
        return n.value;
      }
      case Node::Type::kTensor:
        return NewTensor(n.tensor);
      case Node::Type::kList: {
        std::vector<ValuePtr> items;
        for (const auto& c : n.list) {
          ASSIGN_OR_RETURN(ValuePtr v, Emit(*c));
          items.push_back(std::move(v));
        }
        return pickle::MakeList(std::move(items));
      }
      case Node::Type::kDict: {
        std::vector<std::pair<ValuePtr, ValuePtr>> pairs;
        for (const auto& [k, c] : n.dict) {
          ValuePtr key = k.index ? pickle::MakeInt(std::stoll(k.name)) : pickle::MakeStr(k.name);
          ASSIGN_OR_RETURN(ValuePtr v, Emit(*c));
          pairs.emplace_back(std::move(key), std::move(v));
        }
        return pickle::MakeDict(std::move(pairs));
      }
    }
    return Internal("dcp view: bad node");
  }

  // torch._utils._rebuild_tensor_v2(PersId(('storage', torch.<T>Storage, key, 'cpu', numel)), 0,
  // size, stride, requires_grad, OrderedDict()) as torch.save writes a contiguous CPU tensor;
  // _rebuild_tensor_v3 over an UntypedStorage (numel in bytes) with the dtype last for the dtypes
  // that have no legacy storage class. Storage keys count up in pickle order.
  ValuePtr NewTensor(size_t index) {
    const dcp::TensorEntry& t = md_.tensors[index];
    const std::string key = std::to_string(storage_of_.size());
    storage_of_.push_back(Storage{index, {}});
    if (!g_.rebuild_v2) {
      g_.rebuild_v2 = pickle::MakeGlobal("torch._utils", "_rebuild_tensor_v2");
      g_.rebuild_v3 = pickle::MakeGlobal("torch._utils", "_rebuild_tensor_v3");
      g_.ordered_dict = pickle::MakeGlobal("collections", "OrderedDict");
      g_.storage = pickle::MakeStr("storage");
      g_.cpu = pickle::MakeStr("cpu");
    }
    int64_t numel = 1;
    for (int64_t d : t.size) numel *= d;
    auto ints = [](const std::vector<int64_t>& xs) {
      std::vector<ValuePtr> items;
      for (int64_t x : xs) items.push_back(pickle::MakeInt(x));
      return pickle::MakeTuple(std::move(items));
    };
    const std::string cls = LegacyStorageClass(t.dtype);
    ValuePtr& cls_node = g_.classes[cls];
    if (!cls_node) {
      cls_node = cls.empty() ? pickle::MakeGlobal("torch.storage", "UntypedStorage")
                             : pickle::MakeGlobal("torch", cls);
    }
    const int64_t count = cls.empty() ? numel * static_cast<int64_t>(DtypeSize(t.dtype)) : numel;
    ValuePtr pid = pickle::MakePersId(pickle::MakeTuple(
        {g_.storage, cls_node, pickle::MakeStr(key), g_.cpu, pickle::MakeInt(count)}));
    std::vector<ValuePtr> args{pid,
                               pickle::MakeInt(0),
                               ints(t.size),
                               ints(ContiguousStride(t.size)),
                               pickle::MakeBool(t.requires_grad),
                               pickle::MakeCall(g_.ordered_dict, pickle::MakeTuple({}))};
    if (cls.empty()) {
      ValuePtr& dtype = g_.dtypes[t.dtype];
      if (!dtype) dtype = pickle::MakeGlobal("torch", t.dtype);
      args.push_back(dtype);
      return pickle::MakeCall(g_.rebuild_v3, pickle::MakeTuple(std::move(args)));
    }
    return pickle::MakeCall(g_.rebuild_v2, pickle::MakeTuple(std::move(args)));
  }

  Result<ViewFile> ModelPt() {
    // The entries in state_dict_metadata order, as torch's dcp_to_torch_save sets them: each
    // dict's keys in the order the state dict had them, tensors and other values interleaved.
    Node root(Node::Type::kDict);
    for (const auto& [is_tensor, i] : md_.order) {
      if (is_tensor) {
        auto leaf = std::make_unique<Node>(Node::Type::kTensor);
        leaf->tensor = i;
        RETURN_IF_ERROR(
            SetElement(&root, PathOf(md_.tensors[i].fqn), std::move(leaf), md_.tensors[i].fqn));
      } else {
        const dcp::BytesEntry& b = md_.bytes[i];
        auto leaf = std::make_unique<Node>(Node::Type::kValue);
        ASSIGN_OR_RETURN(leaf->value, ItemValue(b, &leaf->storages));
        RETURN_IF_ERROR(SetElement(&root, PathOf(b.fqn), std::move(leaf), b.fqn));
      }
    }
    ASSIGN_OR_RETURN(ValuePtr tree, Emit(root));
    auto pkl = pickle::Write(tree, 2);
    if (!pkl.ok()) return Invalid("dcp view: model.pt's pickle: " + pkl.status().message());
    // torch.save names the records after the file's stem and writes the storages in the order
    // of their keys as strings ("10" before "2"), then the version.
    TorchZipWriter zip("model");
    zip.AddBytes("data.pkl", std::move(*pkl));
    std::vector<std::string> keys;
    for (size_t i = 0; i < storage_of_.size(); ++i) keys.push_back(std::to_string(i));
    std::sort(keys.begin(), keys.end());
    for (const std::string& k : keys) {
      Storage& st = storage_of_[std::stoul(k)];
      if (st.literal) {
        zip.AddBytes("data/" + k, std::move(*st.literal));
      } else {
        zip.AddGathers("data/" + k, gathers_[st.tensor]);
      }
    }
    zip.AddBytes("version", "3\n");
    return zip.Finish();
  }

  Result<ViewFile> ModelSafetensors() const {
    // Which tensors, under which names.
    auto is_model = [](const std::vector<DcpKey>& path) {
      return !path.empty() && !path[0].index && path[0].name == "model";
    };
    bool have_model = false;
    if (!paths_.empty()) {
      for (const dcp::TensorEntry& t : md_.tensors) have_model |= is_model(PathOf(t.fqn));
      for (const dcp::BytesEntry& b : md_.bytes) have_model |= is_model(PathOf(b.fqn));
    } else {
      for (const dcp::TensorEntry& t : md_.tensors) have_model |= t.fqn.starts_with("model.");
    }
    std::vector<std::pair<std::string, size_t>> chosen;  // (name, tensor index)
    for (size_t i = 0; i < md_.tensors.size(); ++i) {
      const std::string& fqn = md_.tensors[i].fqn;
      if (!have_model) {
        chosen.emplace_back(fqn, i);
      } else if (paths_.empty()) {
        if (fqn.starts_with("model.")) chosen.emplace_back(fqn.substr(6), i);
      } else {
        const std::vector<DcpKey> path = PathOf(fqn);
        if (path.size() < 2 || !is_model(path)) continue;
        std::string name = path[1].name;
        for (size_t j = 2; j < path.size(); ++j) name += "." + path[j].name;
        chosen.emplace_back(std::move(name), i);
      }
    }
    std::sort(chosen.begin(), chosen.end());
    std::vector<safetensors::TensorSpec> specs;
    for (const auto& [name, i] : chosen) {
      const dcp::TensorEntry& t = md_.tensors[i];
      auto dtype = SafetensorsDtypeOf(t.dtype);
      if (!dtype) {
        return Invalid("dcp view: tensor '" + t.fqn + "' is " + t.dtype +
                       ", which safetensors cannot hold");
      }
      specs.push_back({name, *dtype, std::vector<uint64_t>(t.size.begin(), t.size.end())});
    }
    auto header = safetensors::BuildHeader(specs, safetensors::Metadata{{"format", "pt"}});
    if (!header.ok()) {
      return Invalid("dcp view: model.safetensors: " + header.status().message());
    }
    ViewFile f;
    f.recipe.AddLiteral(std::move(header->bytes));
    for (const auto& [name, i] : chosen) {
      for (const Gather& g : gathers_[i]) f.recipe.AddGather(g.rows, g.parts);
    }
    if (f.recipe.size() != header->file_size) {
      return Internal("dcp view: model.safetensors is not the size its header says");
    }
    return f;
  }

  const dcp::Metadata& md_;
  const DcpKeyPaths& paths_;
  const std::vector<DcpDataFile>& files_;
  const std::map<std::string, std::string>& items_;
  DcpChunkIndex chunks_{files_};
  std::vector<std::vector<Gather>> gathers_;  // by tensor index
  // By storage key: a tensor of the checkpoint (its index), or the bytes of a storage held by an
  // item.
  struct Storage {
    size_t tensor = 0;
    std::optional<std::string> literal;
  };
  std::vector<Storage> storage_of_;
  struct {
    // Shared nodes, so the pickle names each global once, as Python's memo does.
    ValuePtr rebuild_v2, rebuild_v3, ordered_dict, storage, cpu;
    std::map<std::string, ValuePtr> classes, dtypes;
  } g_;
};

}  // namespace

Result<DcpView> PlanDcpConsolidated(const dcp::Metadata& md, const DcpKeyPaths& key_paths,
                                    const std::vector<DcpDataFile>& files,
                                    const std::map<std::string, std::string>& bytes_items) {
  return Planner(md, key_paths, files, bytes_items).Run();
}

Result<DcpView> PlanDcpConsolidated(const dcp::Metadata& md, const std::vector<DcpDataFile>& files,
                                    const std::map<std::string, std::string>& bytes_items) {
  DcpKeyPaths paths;
  for (const auto& [fqn, keys] : md.key_paths) {
    std::vector<DcpKey>& p = paths[fqn];
    auto ints = md.key_path_index.find(fqn);
    for (size_t i = 0; i < keys.size(); ++i) {
      const bool index = ints != md.key_path_index.end() && i < ints->second.size() &&
                         ints->second[i];
      p.push_back(DcpKey{keys[i], index});
    }
  }
  return PlanDcpConsolidated(md, paths, files, bytes_items);
}

}  // namespace ckptfs::reshard
