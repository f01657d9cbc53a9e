// The pickle reader: CPython's unpickling machine (stack, marks, memo) with every opcode, where
// anything that would import or call builds a node instead. The loop is flat: no opcode recurses,
// so a hostile pickle can nest as deep as it likes while reading; the depth limit is checked
// once, after STOP, by walking the finished tree the way the writer will.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/pickle.h"
#include "formats/pickle_internal.h"

namespace ckptfs::pickle {
namespace {

using internal::Op;

// Owns a cyclic tree for Read()'s caller: the root handed out shares this keeper's lifetime, and
// when it ends the edges that close cycles are cut so that the nodes can be freed.
struct CycleKeeper {
  ValuePtr root;
  std::vector<std::pair<ValuePtr, ValuePtr>> back_edges;  // (from, to)

  ~CycleKeeper() {
    for (auto& edge : back_edges) {
      const ValuePtr& to = edge.second;  // not a structured binding: clang 14 cannot capture one
      internal::ForEachChildSlot(*edge.first, [&](ValuePtr& c) {
        if (c == to) c.reset();
      });
    }
  }
};

bool CanHaveChildren(Kind k) {
  switch (k) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kObject:
    case Kind::kPersId:
      return true;
    default:
      return false;
  }
}

std::string KindName(Kind k) {
  switch (k) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt:
    case Kind::kBigInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kByteArray: return "bytearray";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kPersId: return "persistent id";
    case Kind::kExt: return "extension";
  }
  return "value";
}

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t len, const Limits& limits)
      : data_(data), len_(len), limits_(limits) {}

  // Whatever happens, no node outlives the call except through the returned root.
  ~Unpickler() {
    for (const ValuePtr& n : nodes_) internal::ClearChildren(*n);
  }

  Result<ValuePtr> Run(size_t* consumed) {
    while (pos_ < len_) {
      op_pos_ = pos_;
      op_ = data_[pos_++];
      if (op_ == Op::kStop) {
        if (consumed) *consumed = pos_;
        return Finish();
      }
      RETURN_IF_ERROR(Step());
      if (pushes_ > limits_.max_values) {
        return Fail("more than " + std::to_string(limits_.max_values) + " values");
      }
    }
    return Corrupt("pickle: the data ends at byte " + std::to_string(len_) + " without STOP");
  }

 private:
  Result<ValuePtr> Finish() {
    ValuePtr root;
    RETURN_IF_ERROR(Pop(&root));
    internal::Walk walk;
    // Protocol 4 walks sets the way the reader built them (memoized before their items).
    Status s = internal::WalkTree(root, 4, limits_, &walk);
    if (!s.ok()) {
      std::string_view why = s.message();
      if (why.substr(0, 8) == "pickle: ") why.remove_prefix(8);
      return Fail(std::string(why));
    }
    // Reachable nodes keep their children; the destructor dismantles the rest (values dropped
    // from the stack or memo, possibly in cycles of their own).
    std::vector<ValuePtr> garbage;
    for (ValuePtr& n : nodes_) {
      if (!walk.reach.count(n.get())) garbage.push_back(std::move(n));
    }
    nodes_ = std::move(garbage);
    if (walk.back_edges.empty()) return root;
    auto keeper = std::make_shared<CycleKeeper>();
    keeper->root = root;
    keeper->back_edges = std::move(walk.back_edges);
    return ValuePtr(keeper, root.get());
  }

  Status Step();
  Status Fail(const std::string& what) const {
    const char* name = internal::OpName(op_);
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", op_);
    return Corrupt(std::string("pickle: ") + (name ? name : std::string("unknown opcode ") + hex) +
                   " at byte " + std::to_string(op_pos_) + ": " + what);
  }

  ValuePtr New(Kind k) {
    auto v = std::make_shared<Value>();
    v->kind = k;
    if (CanHaveChildren(k)) nodes_.push_back(v);
    return v;
  }
  void Push(ValuePtr v) {
    stack_.push_back(std::move(v));
    ++pushes_;
  }
  size_t Fence() const { return marks_.empty() ? 0 : marks_.back(); }
  Status Pop(ValuePtr* v) {
    if (stack_.size() <= Fence()) return Fail("stack underflow");
    *v = std::move(stack_.back());
    stack_.pop_back();
    return Status::Ok();
  }
  Status Top(ValuePtr** v) {
    if (stack_.size() <= Fence()) return Fail("stack underflow");
    *v = &stack_.back();
    return Status::Ok();
  }
  Status PopMark(std::vector<ValuePtr>* items) {
    if (marks_.empty()) return Fail("no MARK on the stack");
    const size_t m = marks_.back();
    marks_.pop_back();
    items->assign(std::make_move_iterator(stack_.begin() + static_cast<ptrdiff_t>(m)),
                  std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return Status::Ok();
  }

  Status Need(uint64_t n) const {
    if (n > len_ - pos_) {
      return Fail("truncated: needs " + std::to_string(n) + " bytes, " +
                  std::to_string(len_ - pos_) + " left");
    }
    return Status::Ok();
  }
  Status Fixed(size_t n, uint64_t* x) {
    RETURN_IF_ERROR(Need(n));
    *x = 0;
    for (size_t k = 0; k < n; ++k) *x |= uint64_t{data_[pos_ + k]} << (8 * k);
    pos_ += n;
    return Status::Ok();
  }
  Status Bytes(uint64_t n, std::string* out) {
    RETURN_IF_ERROR(Need(n));  // before allocating anything of size n
    out->assign(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return Status::Ok();
  }
  Status Line(std::string_view* line) {
    const void* nl = std::memchr(data_ + pos_, '\n', len_ - pos_);
    if (!nl) return Fail("truncated: no end of line");
    const size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
    *line = std::string_view(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n + 1;
    return Status::Ok();
  }

  // The opcodes with a length-prefixed payload: STRING-family, BYTES-family, UNICODE-family.
  Status LengthPrefixed(size_t width, Kind kind, bool py2_str);
  Status Text(Kind kind);
  Status Global(std::string module, std::string name, ValuePtr* out);
  Status MakeObject(ObjectOp op, ValuePtr callable, ValuePtr args, ValuePtr kwargs);
  Status Append(std::vector<ValuePtr> items);
  Status SetItems(std::vector<ValuePtr> items);
  Status MemoGet(uint64_t index);
  Status MemoPut(uint64_t index);

  const uint8_t* const data_;
  const size_t len_;
  const Limits limits_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  uint8_t op_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;  // stack sizes at each MARK, innermost last
  std::unordered_map<uint64_t, ValuePtr> memo_;
  std::vector<ValuePtr> nodes_;  // every node that can hold others, to dismantle what is dropped
  size_t pushes_ = 0;
};

Status Unpickler::LengthPrefixed(size_t width, Kind kind, bool py2_str) {
  uint64_t n = 0;
  RETURN_IF_ERROR(Fixed(width, &n));
  if (py2_str && width == 4 && n > INT32_MAX) return Fail("negative length");
  auto v = New(kind);
  v->py2_str = py2_str;
  RETURN_IF_ERROR(Bytes(n, &v->str));
  if (kind == Kind::kStr && !internal::IsUtf8(v->str)) return Fail("invalid UTF-8");
  Push(std::move(v));
  return Status::Ok();
}

// The text opcodes whose payload is one line: INT, LONG, FLOAT, STRING, UNICODE, PERSID.
Status Unpickler::Text(Kind kind) {
  std::string_view line;
  RETURN_IF_ERROR(Line(&line));
  ValuePtr v = New(kind);
  switch (op_) {
    case Op::kInt:
      if (line == "00" || line == "01") {  // protocol 0 spells bools as INT
        v->kind = Kind::kBool;
        v->b = line == "01";
      } else if (!internal::ParseDecimal(line, *v)) {
        return Fail("not a decimal integer");
      }
      break;
    case Op::kLong:
      if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
      if (!internal::ParseDecimal(line, *v)) return Fail("not a decimal integer");
      break;
    case Op::kFloat:
      v->kind = Kind::kFloat;
      if (!internal::ParseFloat(line, &v->f)) return Fail("not a float");
      break;
    case Op::kString:
      if (line.size() < 2 || line.front() != line.back() ||
          (line.front() != '\'' && line.front() != '"')) {
        return Fail("the argument is not quoted");
      }
      if (!internal::EscapeDecode(line.substr(1, line.size() - 2), &v->str)) {
        return Fail("bad escape");
      }
      v->py2_str = true;
      break;
    case Op::kUnicode:
      if (!internal::RawUnicodeEscapeToUtf8(line, &v->str)) return Fail("bad escape");
      break;
    case Op::kPersId: {
      for (char c : line) {
        if (static_cast<uint8_t>(c) >= 0x80) return Fail("protocol-0 persistent ids are ASCII");
      }
      ValuePtr pid = New(Kind::kStr);
      pid->str = std::string(line);
      v->pid = std::move(pid);
      break;
    }
  }
  Push(std::move(v));
  return Status::Ok();
}

Status Unpickler::Global(std::string module, std::string name, ValuePtr* out) {
  if (!internal::IsUtf8(module) || !internal::IsUtf8(name)) return Fail("invalid UTF-8");
  *out = New(Kind::kGlobal);
  (*out)->module = std::move(module);
  (*out)->name = std::move(name);
  return Status::Ok();
}

Status Unpickler::MakeObject(ObjectOp op, ValuePtr callable, ValuePtr args, ValuePtr kwargs) {
  ValuePtr v = New(Kind::kObject);
  v->op = op;
  v->callable = std::move(callable);
  v->args = std::move(args);
  v->kwargs = std::move(kwargs);
  Push(std::move(v));
  return Status::Ok();
}

// APPEND/APPENDS mutate the list (or object) in place, as Python does: every memo reference to
// it sees the new items.
Status Unpickler::Append(std::vector<ValuePtr> items) {
  ValuePtr* target = nullptr;
  RETURN_IF_ERROR(Top(&target));
  Value& t = **target;
  std::vector<ValuePtr>* dst = t.kind == Kind::kList     ? &t.items
                               : t.kind == Kind::kObject ? &t.list_items
                                                         : nullptr;
  if (!dst) return Fail("cannot append to a " + KindName(t.kind));
  dst->insert(dst->end(), std::make_move_iterator(items.begin()),
              std::make_move_iterator(items.end()));
  return Status::Ok();
}

Status Unpickler::SetItems(std::vector<ValuePtr> items) {
  if (items.size() % 2) return Fail("an odd number of items");
  ValuePtr* target = nullptr;
  RETURN_IF_ERROR(Top(&target));
  Value& t = **target;
  auto* dst = t.kind == Kind::kDict ? &t.pairs : t.kind == Kind::kObject ? &t.dict_items : nullptr;
  if (!dst) return Fail("cannot set items on a " + KindName(t.kind));
  // Repeated keys stay repeated: written back, they replay the same assignments in Python.
  for (size_t k = 0; k < items.size(); k += 2) {
    dst->emplace_back(std::move(items[k]), std::move(items[k + 1]));
  }
  return Status::Ok();
}

Status Unpickler::MemoGet(uint64_t index) {
  auto it = memo_.find(index);
  if (it == memo_.end()) return Fail("no memo entry " + std::to_string(index));
  Push(it->second);
  return Status::Ok();
}

Status Unpickler::MemoPut(uint64_t index) {
  ValuePtr* top = nullptr;
  RETURN_IF_ERROR(Top(&top));
  memo_[index] = *top;
  return Status::Ok();
}

Status Unpickler::Step() {
  ValuePtr a, b, c;
  std::vector<ValuePtr> items;
  uint64_t n = 0;
  switch (op_) {
    case Op::kMark:
      marks_.push_back(stack_.size());
      return Status::Ok();
    case Op::kPop:
      // POP right after MARK discards the mark, as CPython's unpickler does.
      if (!marks_.empty() && marks_.back() == stack_.size()) {
        marks_.pop_back();
        return Status::Ok();
      }
      return Pop(&a);
    case Op::kPopMark:
      return PopMark(&items);
    case Op::kDup: {
      ValuePtr* top = nullptr;
      RETURN_IF_ERROR(Top(&top));
      Push(*top);
      return Status::Ok();
    }
    case Op::kFloat:
    case Op::kInt:
    case Op::kLong:
    case Op::kString:
      return Text(op_ == Op::kString ? Kind::kBytes : Kind::kInt);
    case Op::kUnicode:
      return Text(Kind::kStr);
    case Op::kPersId:
      return Text(Kind::kPersId);
    case Op::kBinInt:
      RETURN_IF_ERROR(Fixed(4, &n));
      a = New(Kind::kInt);
      a->i = static_cast<int32_t>(static_cast<uint32_t>(n));
      Push(std::move(a));
      return Status::Ok();
    case Op::kBinInt1:
    case Op::kBinInt2:
      RETURN_IF_ERROR(Fixed(op_ == Op::kBinInt1 ? 1 : 2, &n));
      a = New(Kind::kInt);
      a->i = static_cast<int64_t>(n);
      Push(std::move(a));
      return Status::Ok();
    case Op::kLong1:
    case Op::kLong4: {
      RETURN_IF_ERROR(Fixed(op_ == Op::kLong1 ? 1 : 4, &n));
      if (op_ == Op::kLong4 && n > INT32_MAX) return Fail("negative length");
      std::string le;
      RETURN_IF_ERROR(Bytes(n, &le));
      a = New(Kind::kInt);
      internal::SetLong(*a, std::move(le));
      Push(std::move(a));
      return Status::Ok();
    }
    case Op::kBinFloat: {
      RETURN_IF_ERROR(Need(8));
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = bits << 8 | data_[pos_ + k];  // big-endian
      pos_ += 8;
      a = New(Kind::kFloat);
      std::memcpy(&a->f, &bits, sizeof(bits));
      Push(std::move(a));
      return Status::Ok();
    }
    case Op::kNone:
      Push(New(Kind::kNone));
      return Status::Ok();
    case Op::kNewTrue:
    case Op::kNewFalse:
      a = New(Kind::kBool);
      a->b = op_ == Op::kNewTrue;
      Push(std::move(a));
      return Status::Ok();
    case Op::kBinString:
      return LengthPrefixed(4, Kind::kBytes, true);
    case Op::kShortBinString:
      return LengthPrefixed(1, Kind::kBytes, true);
    case Op::kBinBytes:
      return LengthPrefixed(4, Kind::kBytes, false);
    case Op::kShortBinBytes:
      return LengthPrefixed(1, Kind::kBytes, false);
    case Op::kBinBytes8:
      return LengthPrefixed(8, Kind::kBytes, false);
    case Op::kByteArray8:
      return LengthPrefixed(8, Kind::kByteArray, false);
    case Op::kBinUnicode:
      return LengthPrefixed(4, Kind::kStr, false);
    case Op::kShortBinUnicode:
      return LengthPrefixed(1, Kind::kStr, false);
    case Op::kBinUnicode8:
      return LengthPrefixed(8, Kind::kStr, false);
    case Op::kNextBuffer:
    case Op::kReadOnlyBuffer:
      return Fail("out-of-band buffers are not supported");
    case Op::kBinPersId:
      RETURN_IF_ERROR(Pop(&a));
      b = New(Kind::kPersId);
      b->pid = std::move(a);
      Push(std::move(b));
      return Status::Ok();
    case Op::kReduce: {
      RETURN_IF_ERROR(Pop(&b));
      RETURN_IF_ERROR(Pop(&a));
      return MakeObject(ObjectOp::kReduce, std::move(a), std::move(b), nullptr);
    }
    case Op::kNewObj:
      RETURN_IF_ERROR(Pop(&b));
      RETURN_IF_ERROR(Pop(&a));
      return MakeObject(ObjectOp::kNewObj, std::move(a), std::move(b), nullptr);
    case Op::kNewObjEx:
      RETURN_IF_ERROR(Pop(&c));
      RETURN_IF_ERROR(Pop(&b));
      RETURN_IF_ERROR(Pop(&a));
      return MakeObject(ObjectOp::kNewObjEx, std::move(a), std::move(b), std::move(c));
    case Op::kAppend:
      RETURN_IF_ERROR(Pop(&a));
      return Append({std::move(a)});
    case Op::kAppends:
      RETURN_IF_ERROR(PopMark(&items));
      return Append(std::move(items));
    case Op::kSetItem:
      RETURN_IF_ERROR(Pop(&b));
      RETURN_IF_ERROR(Pop(&a));
      return SetItems({std::move(a), std::move(b)});
    case Op::kSetItems:
      RETURN_IF_ERROR(PopMark(&items));
      return SetItems(std::move(items));
    case Op::kAddItems: {
      RETURN_IF_ERROR(PopMark(&items));
      ValuePtr* target = nullptr;
      RETURN_IF_ERROR(Top(&target));
      if ((*target)->kind != Kind::kSet) return Fail("cannot add to a " + KindName((*target)->kind));
      auto& dst = (*target)->items;
      dst.insert(dst.end(), std::make_move_iterator(items.begin()),
                 std::make_move_iterator(items.end()));
      return Status::Ok();
    }
    case Op::kBuild: {
      RETURN_IF_ERROR(Pop(&a));
      ValuePtr* target = nullptr;
      RETURN_IF_ERROR(Top(&target));
      if ((*target)->kind != Kind::kObject) return Fail("cannot BUILD a " + KindName((*target)->kind));
      // The tree has one state slot; Python's pickler never builds an object twice.
      if ((*target)->state) return Fail("a second BUILD on one object");
      (*target)->state = std::move(a);
      return Status::Ok();
    }
    case Op::kGlobal:
    case Op::kInst: {
      std::string_view module, name;
      RETURN_IF_ERROR(Line(&module));
      RETURN_IF_ERROR(Line(&name));
      RETURN_IF_ERROR(Global(std::string(module), std::string(name), &a));
      if (op_ == Op::kGlobal) {
        Push(std::move(a));
        return Status::Ok();
      }
      RETURN_IF_ERROR(PopMark(&items));
      b = New(Kind::kTuple);
      b->items = std::move(items);
      return MakeObject(ObjectOp::kInst, std::move(a), std::move(b), nullptr);
    }
    case Op::kObj:
      RETURN_IF_ERROR(PopMark(&items));
      if (items.empty()) return Fail("no class after the MARK");
      a = std::move(items.front());
      b = New(Kind::kTuple);
      b->items.assign(std::make_move_iterator(items.begin() + 1),
                      std::make_move_iterator(items.end()));
      return MakeObject(ObjectOp::kInst, std::move(a), std::move(b), nullptr);
    case Op::kStackGlobal:
      RETURN_IF_ERROR(Pop(&b));
      RETURN_IF_ERROR(Pop(&a));
      if (a->kind != Kind::kStr || b->kind != Kind::kStr) return Fail("module and name must be str");
      RETURN_IF_ERROR(Global(a->str, b->str, &c));
      Push(std::move(c));
      return Status::Ok();
    case Op::kDict:
    case Op::kEmptyDict:
      if (op_ == Op::kDict) RETURN_IF_ERROR(PopMark(&items));
      if (items.size() % 2) return Fail("an odd number of items");
      a = New(Kind::kDict);
      for (size_t k = 0; k < items.size(); k += 2) {
        a->pairs.emplace_back(std::move(items[k]), std::move(items[k + 1]));
      }
      Push(std::move(a));
      return Status::Ok();
    case Op::kTuple:
    case Op::kList:
    case Op::kFrozenSet:
      RETURN_IF_ERROR(PopMark(&items));
      a = New(op_ == Op::kTuple ? Kind::kTuple : op_ == Op::kList ? Kind::kList : Kind::kFrozenSet);
      a->items = std::move(items);
      Push(std::move(a));
      return Status::Ok();
    case Op::kTuple1:
    case Op::kTuple2:
    case Op::kTuple3: {
      const size_t k = op_ - Op::kTuple1 + 1;
      if (stack_.size() < Fence() + k) return Fail("stack underflow");
      a = New(Kind::kTuple);
      a->items.assign(std::make_move_iterator(stack_.end() - static_cast<ptrdiff_t>(k)),
                      std::make_move_iterator(stack_.end()));
      stack_.resize(stack_.size() - k);
      Push(std::move(a));
      return Status::Ok();
    }
    case Op::kEmptyTuple:
      Push(New(Kind::kTuple));
      return Status::Ok();
    case Op::kEmptyList:
      Push(New(Kind::kList));
      return Status::Ok();
    case Op::kEmptySet:
      Push(New(Kind::kSet));
      return Status::Ok();
    case Op::kGet:
    case Op::kPut: {
      std::string_view line;
      RETURN_IF_ERROR(Line(&line));
      if (!internal::ParseIndex(line, &n)) return Fail("not a memo index");
      return op_ == Op::kGet ? MemoGet(n) : MemoPut(n);
    }
    case Op::kBinGet:
    case Op::kLongBinGet:
      RETURN_IF_ERROR(Fixed(op_ == Op::kBinGet ? 1 : 4, &n));
      return MemoGet(n);
    case Op::kBinPut:
    case Op::kLongBinPut:
      RETURN_IF_ERROR(Fixed(op_ == Op::kBinPut ? 1 : 4, &n));
      return MemoPut(n);
    case Op::kMemoize:
      return MemoPut(memo_.size());
    case Op::kExt1:
    case Op::kExt2:
    case Op::kExt4:
      RETURN_IF_ERROR(Fixed(op_ == Op::kExt1 ? 1 : op_ == Op::kExt2 ? 2 : 4, &n));
      if (n == 0 || n > INT32_MAX) return Fail("extension code out of range");
      a = New(Kind::kExt);
      a->i = static_cast<int64_t>(n);
      Push(std::move(a));
      return Status::Ok();
    case Op::kProto:
      RETURN_IF_ERROR(Fixed(1, &n));
      if (n > 5) return Fail("unsupported protocol " + std::to_string(n));
      return Status::Ok();
    case Op::kFrame:
      // Frames only help streaming readers; the whole frame must be there, that is all.
      RETURN_IF_ERROR(Fixed(8, &n));
      return Need(n);
    default:
      return Fail("not a pickle opcode");
  }
}

}  // namespace

Result<ValuePtr> Read(const uint8_t* data, size_t len, size_t* consumed, const Limits& limits) {
  Unpickler u(data, len, limits);
  return u.Run(consumed);
}

}  // namespace ckptfs::pickle
