#include "reshard/torch_out.h"

#include <algorithm>
#include <memory>

namespace ckptfs::reshard {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

bool IsMapping(const ValuePtr& v) {
  return v && (v->kind == Kind::kDict ||
               (v->kind == Kind::kObject && v->IsCallOf("collections", "OrderedDict")));
}
std::vector<std::pair<ValuePtr, ValuePtr>>& PairsOf(Value& v) {
  return v.kind == Kind::kDict ? v.pairs : v.dict_items;
}
std::string KeyName(const ValuePtr& k) {
  if (k && k->kind == Kind::kStr) return k->str;
  if (k && k->kind == Kind::kInt) return std::to_string(k->i);
  return pickle::Debug(k, 80);
}
ValuePtr Get(const ValuePtr& m, std::string_view key) {
  if (!IsMapping(m)) return nullptr;
  for (const auto& [k, v] : PairsOf(*m)) {
    if (k && k->kind == Kind::kStr && k->str == key) return v;
  }
  return nullptr;
}
// A new, empty mapping of m's kind (an OrderedDict keeps its BUILD state).
ValuePtr EmptyLike(const ValuePtr& m) {
  auto c = std::make_shared<Value>(*m);
  c->pairs.clear();
  c->dict_items.clear();
  return c;
}
void Put(const ValuePtr& m, ValuePtr k, ValuePtr v) { PairsOf(*m).emplace_back(std::move(k), std::move(v)); }

bool IntsOf(const ValuePtr& v, std::vector<int64_t>* out) {
  if (!v) return false;
  if (v->kind == Kind::kObject && v->IsCallOf("torch", "Size") && v->args &&
      v->args->items.size() == 1) {
    return IntsOf(v->args->items[0], out);
  }
  if (v->kind != Kind::kTuple && v->kind != Kind::kList) return false;
  out->clear();
  for (const ValuePtr& x : v->items) {
    if (!x || x->kind != Kind::kInt) return false;
    out->push_back(x->i);
  }
  return true;
}

TensorIndex IndexTensors(const TorchFile& f) {
  TensorIndex index;
  for (const TorchTensor& t : f.pickle.tensors) index.emplace(t.node, &t);
  return index;
}

ValuePtr TorchOut::NewTensor(const Value& like, std::vector<Gather> gathers,
                             const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& stride, uint64_t nbytes) {
  // like: the source's rebuild call; a Parameter wraps the tensor call in its first argument.
  const bool param = like.IsCallOf("torch._utils", "_rebuild_parameter") ||
                     like.IsCallOf("torch._utils", "_rebuild_parameter_with_state");
  const Value& call = param ? *like.args->items[0] : like;
  auto tuple = [](const std::vector<int64_t>& xs) {
    std::vector<ValuePtr> items;
    for (int64_t x : xs) items.push_back(pickle::MakeInt(x));
    return pickle::MakeTuple(std::move(items));
  };
  const Value& pid = *call.args->items[0]->pid;
  std::string dtype;
  uint32_t itemsize = 1;
  if (!StorageType(pid.items[1]->name, &dtype, &itemsize)) itemsize = 1;
  const std::string key = std::to_string(storages_.size());
  storages_.push_back(std::move(gathers));
  auto new_pid = pickle::MakeTuple({pid.items[0], pid.items[1], pickle::MakeStr(key),
                                    location_.empty() ? pid.items[3] : pickle::MakeStr(location_),
                                    pickle::MakeInt(static_cast<int64_t>(nbytes / itemsize))});
  std::vector<ValuePtr> args = call.args->items;
  args[0] = pickle::MakePersId(new_pid);
  args[1] = pickle::MakeInt(0);
  args[2] = tuple(shape);
  args[3] = tuple(stride);
  auto inner = std::make_shared<Value>(call);
  inner->args = pickle::MakeTuple(std::move(args));
  if (!param) return inner;
  auto outer = std::make_shared<Value>(like);
  std::vector<ValuePtr> oargs = like.args->items;
  oargs[0] = inner;
  outer->args = pickle::MakeTuple(std::move(oargs));
  return outer;
}

Result<ValuePtr> TorchOut::Copy(const TensorIndex& tensors, uint32_t source, const ValuePtr& v) {
  if (!v) return v;
  if (auto it = memo_.find(v.get()); it != memo_.end()) return it->second;
  if (auto t = tensors.find(v.get()); t != tensors.end()) {
    const TorchTensor& tt = *t->second;
    std::vector<Gather> g;
    if (tt.length) g.push_back(Gather{1, {Part{source, tt.offset, tt.length, tt.length}}});
    ValuePtr n = NewTensor(*v, std::move(g), tt.shape, tt.stride, tt.length);
    memo_.emplace(v.get(), n);
    return n;
  }
  const bool leaf = v->items.empty() && v->pairs.empty() && !v->args && !v->state &&
                    v->list_items.empty() && v->dict_items.empty() && !v->kwargs && !v->callable;
  if (leaf) return v;  // scalars, strings, globals, persistent ids are shared as they are
  auto c = std::make_shared<Value>(*v);
  memo_.emplace(v.get(), c);
  std::vector<ValuePtr*> slots;
  for (auto& x : c->items) slots.push_back(&x);
  for (auto& kv : c->pairs) slots.push_back(&kv.second);
  for (auto& x : c->list_items) slots.push_back(&x);
  for (auto& kv : c->dict_items) slots.push_back(&kv.second);
  for (ValuePtr* x : {&c->args, &c->kwargs, &c->state}) slots.push_back(x);
  for (ValuePtr* x : slots) {
    if (*x) {
      ASSIGN_OR_RETURN(*x, Copy(tensors, source, *x));
    }
  }
  return ValuePtr(c);
}

Result<ValuePtr> TorchOut::CopyWith(const TensorIndex& tensors, uint32_t source,
                                    const ValuePtr& m, const Entries& with) {
  ValuePtr out = EmptyLike(m);
  for (const auto& [k, v] : PairsOf(*m)) {
    const std::string key = KeyName(k);
    auto it = std::find_if(with.begin(), with.end(), [&](const auto& w) { return w.first == key; });
    if (it != with.end()) {
      Put(out, k, it->second);
    } else {
      ASSIGN_OR_RETURN(ValuePtr nv, Copy(tensors, source, v));
      Put(out, k, nv);
    }
  }
  return out;
}

Result<ValuePtr> TorchOut::CopyWithUnshared(const TensorIndex& tensors, uint32_t source,
                                            const ValuePtr& m, const Entries& with) {
  // A memo of its own: neither finds the copies made before nor leaves its nodes to later ones.
  std::unordered_map<const Value*, ValuePtr> outer;
  outer.swap(memo_);
  Result<ValuePtr> r = CopyWith(tensors, source, m, with);
  outer.swap(memo_);
  return r;
}

Result<ViewFile> TorchOut::Finish(
    const std::string& prefix, const ValuePtr& root,
    const std::vector<std::pair<std::string, std::string>>& extra_records) {
  ASSIGN_OR_RETURN(std::string pkl, pickle::Write(root, 2));
  TorchZipWriter zip(prefix);
  zip.AddBytes("data.pkl", std::move(pkl));
  for (size_t i = 0; i < storages_.size(); ++i) {
    zip.AddGathers("data/" + std::to_string(i), storages_[i]);
  }
  for (const auto& [name, bytes] : extra_records) zip.AddBytes(name, bytes);
  return zip.Finish();
}

}  // namespace ckptfs::reshard
