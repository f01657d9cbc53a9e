// The pickle writer. It follows CPython's pickler closely (opcode choice, memoization, batching by
// 1000, the order of save_reduce), so that a tree read from a Python pickle is written back as
// something Python unpickles to an equal object with the same sharing.
//
// Writing takes two walks over the tree. The first writes nothing: it counts how often each node
// is reached, so that the second memoizes exactly the nodes reached more than once. Python
// memoizes everything; counting first keeps the output free of memo entries nobody reads, while
// visiting the nodes in the same order, so both walks make the same decisions.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/pickle.h"
#include "formats/pickle_internal.h"

namespace ckptfs::pickle {
namespace {

// What Python 3's unpickler does with a Python 2 name under fix_imports (the renames that
// checkpoints meet: builtins, exceptions, copy_reg and the modules that were merged or renamed).
void Python3Name(std::string_view* module, std::string_view* name) {
  struct Rename {
    std::string_view from_module, from_name, to_module, to_name;
  };
  static constexpr Rename kNames[] = {
      {"__builtin__", "xrange", "builtins", "range"},
      {"__builtin__", "unicode", "builtins", "str"},
      {"__builtin__", "long", "builtins", "int"},
      {"__builtin__", "basestring", "builtins", "str"},
      {"__builtin__", "unichr", "builtins", "chr"},
      {"__builtin__", "reduce", "functools", "reduce"},
      {"__builtin__", "intern", "sys", "intern"},
      {"itertools", "izip", "builtins", "zip"},
      {"itertools", "imap", "builtins", "map"},
      {"itertools", "ifilter", "builtins", "filter"},
      {"itertools", "ifilterfalse", "itertools", "filterfalse"},
      {"itertools", "izip_longest", "itertools", "zip_longest"},
      {"UserDict", "IterableUserDict", "collections", "UserDict"},
      {"UserDict", "UserDict", "collections", "UserDict"},
      {"UserList", "UserList", "collections", "UserList"},
      {"UserString", "UserString", "collections", "UserString"},
  };
  for (const Rename& r : kNames) {
    if (*module == r.from_module && *name == r.from_name) {
      *module = r.to_module;
      *name = r.to_name;
      return;
    }
  }
  static constexpr std::pair<std::string_view, std::string_view> kModules[] = {
      {"__builtin__", "builtins"}, {"exceptions", "builtins"}, {"copy_reg", "copyreg"},
      {"Queue", "queue"},          {"cPickle", "pickle"},      {"cStringIO", "io"},
      {"StringIO", "io"},          {"repr", "reprlib"},        {"_abcoll", "collections.abc"},
  };
  for (const auto& [from, to] : kModules) {
    if (*module == from) {
      *module = to;
      return;
    }
  }
}

using internal::Op;

// Python's pickler writes APPENDS/SETITEMS/ADDITEMS in batches of this many items.
constexpr size_t kBatch = 1000;

struct NodeState {
  int64_t memo = -1;    // memo index once written and memoized
  uint32_t active = 0;  // how many times the node is being written further up the stack
};

class Pickler {
 public:
  // A counting walk (walk != nullptr) fills `walk` and writes nothing; a writing walk memoizes
  // the nodes that `reach` says are reached more than once.
  Pickler(int protocol, const Limits& limits, internal::Walk* walk,
          const std::unordered_map<const Value*, uint32_t>* reach)
      : protocol_(protocol), limits_(limits), walk_(walk), reach_(reach), emit_(walk == nullptr) {}

  Status Run(const ValuePtr& root) {
    if (protocol_ < 2 || protocol_ > 5) {
      return Invalid("pickle: cannot write protocol " + std::to_string(protocol_) +
                     " (2 to 5 are supported)");
    }
    Opcode(Op::kProto);
    Byte(static_cast<uint8_t>(protocol_));
    RETURN_IF_ERROR(Save(root));
    Opcode(Op::kStop);
    return Status::Ok();
  }

  std::string Take() { return std::move(out_); }

 private:
  Status Save(const ValuePtr& v) {
    if (!v) return Invalid("pickle: the tree has a null child");
    if (++saves_ > limits_.max_values) {
      return Invalid("pickle: writing visits more than " + std::to_string(limits_.max_values) +
                     " values");
    }
    NodeState& st = state_[v.get()];  // unordered_map references survive rehashing
    if (walk_) {
      ++walk_->reach[v.get()];
      if (st.active > 0 && !path_.empty()) walk_->back_edges.emplace_back(*path_.back(), v);
    }
    if (st.memo >= 0) return Get(st.memo);
    if (path_.size() + extra_ >= limits_.max_depth) {
      return Invalid("pickle: the tree nests deeper than " + std::to_string(limits_.max_depth) +
                     " levels");
    }
    ++st.active;
    path_.push_back(&v);
    Status s = SaveValue(*v, st);
    path_.pop_back();
    --st.active;
    return s;
  }

  Status SaveValue(const Value& v, NodeState& st) {
    switch (v.kind) {
      case Kind::kNone:
        Opcode(Op::kNone);
        return Status::Ok();
      case Kind::kBool:
        Opcode(v.b ? Op::kNewTrue : Op::kNewFalse);
        return Status::Ok();
      case Kind::kInt:
        SaveInt(v.i);
        return Memoize(v, st);
      case Kind::kBigInt:
        RETURN_IF_ERROR(SaveBigInt(v.str));
        return Memoize(v, st);
      case Kind::kFloat:
        SaveFloat(v.f);
        return Memoize(v, st);
      case Kind::kStr:
        RETURN_IF_ERROR(SaveUnicode(v.str));
        return Memoize(v, st);
      case Kind::kBytes:
        RETURN_IF_ERROR(v.py2_str ? SaveBinString(v.str) : SaveBytes(v.str));
        return Memoize(v, st);
      case Kind::kByteArray:
        RETURN_IF_ERROR(SaveByteArray(v.str));
        return Memoize(v, st);
      case Kind::kTuple:
        return SaveTuple(v, st);
      case Kind::kList:
        Opcode(Op::kEmptyList);
        RETURN_IF_ERROR(Memoize(v, st));
        return Batches(v.items, Op::kAppend, Op::kAppends);
      case Kind::kDict:
        Opcode(Op::kEmptyDict);
        RETURN_IF_ERROR(Memoize(v, st));
        return PairBatches(v.pairs);
      case Kind::kSet:
      case Kind::kFrozenSet:
        return SaveSet(v, st);
      case Kind::kGlobal:
        RETURN_IF_ERROR(WriteGlobal(v.module, v.name));
        return Memoize(v, st);
      case Kind::kPersId:
        RETURN_IF_ERROR(Save(v.pid));
        Opcode(Op::kBinPersId);
        if (st.memo >= 0) return FetchInnerCopy(st, 1);
        return Memoize(v, st);
      case Kind::kExt:
        RETURN_IF_ERROR(SaveExt(v.i));
        return Memoize(v, st);
      case Kind::kObject:
        return SaveObject(v, st);
    }
    return Invalid("pickle: a value of unknown kind " + std::to_string(static_cast<int>(v.kind)));
  }

  // A node memoized only once built (a tuple, a REDUCE) may be reached again while its children
  // are written, through a list or dict that closes a cycle. That inner visit built and memoized
  // it; drop the copy built here (`pops` stack entries) and fetch the memoized one, as Python's
  // pickler does. The inner visit also wrote the node's APPENDS/SETITEMS/BUILD.
  Status FetchInnerCopy(const NodeState& st, int pops) {
    for (int k = 0; k < pops; ++k) Opcode(Op::kPop);
    return Get(st.memo);
  }

  Status SaveTuple(const Value& v, NodeState& st) {
    const size_t n = v.items.size();
    if (n == 0) {
      Opcode(Op::kEmptyTuple);
      return Memoize(v, st);
    }
    if (n > 3) Opcode(Op::kMark);
    for (const ValuePtr& item : v.items) RETURN_IF_ERROR(Save(item));
    if (st.memo >= 0) {
      if (n > 3) {
        Opcode(Op::kPopMark);
        return Get(st.memo);
      }
      return FetchInnerCopy(st, static_cast<int>(n));
    }
    static constexpr Op kTupleN[] = {Op::kTuple1, Op::kTuple2, Op::kTuple3};
    Opcode(n > 3 ? Op::kTuple : kTupleN[n - 1]);
    return Memoize(v, st);
  }

  Status SaveSet(const Value& v, NodeState& st) {
    const bool frozen = v.kind == Kind::kFrozenSet;
    if (protocol_ >= 4 && !frozen) {
      Opcode(Op::kEmptySet);
      RETURN_IF_ERROR(Memoize(v, st));
      for (size_t i = 0; i < v.items.size(); i += kBatch) {
        Opcode(Op::kMark);
        for (size_t j = i; j < std::min(v.items.size(), i + kBatch); ++j) {
          RETURN_IF_ERROR(Save(v.items[j]));
        }
        Opcode(Op::kAddItems);
      }
      return Status::Ok();
    }
    if (protocol_ >= 4) {
      Opcode(Op::kMark);
      for (const ValuePtr& item : v.items) RETURN_IF_ERROR(Save(item));
      if (st.memo >= 0) {
        Opcode(Op::kPopMark);
        return Get(st.memo);
      }
      Opcode(Op::kFrozenSet);
      return Memoize(v, st);
    }
    // Below protocol 4 Python writes set(list) and frozenset(list).
    RETURN_IF_ERROR(RoomBelow(2));  // set(([items],)): the items two levels further down
    RETURN_IF_ERROR(WriteGlobal(BuiltinsModule(), frozen ? "frozenset" : "set"));
    Opcode(Op::kEmptyList);
    extra_ += 2;
    Status batched = Batches(v.items, Op::kAppend, Op::kAppends);
    extra_ -= 2;
    RETURN_IF_ERROR(batched);
    Opcode(Op::kTuple1);
    Opcode(Op::kReduce);
    if (st.memo >= 0) return FetchInnerCopy(st, 1);
    return Memoize(v, st);
  }

  Status SaveObject(const Value& v, NodeState& st) {
    if (!v.callable || !v.args) return Invalid("pickle: an object without callable or args");
    switch (v.op) {
      case ObjectOp::kReduce:
      case ObjectOp::kNewObj:
        RETURN_IF_ERROR(Save(v.callable));
        RETURN_IF_ERROR(Save(v.args));
        Opcode(v.op == ObjectOp::kReduce ? Op::kReduce : Op::kNewObj);
        break;
      case ObjectOp::kNewObjEx:
        if (!v.kwargs) return Invalid("pickle: a NEWOBJ_EX object without kwargs");
        // copyreg.__newobj_ex__(cls, args, kwargs) is what NEWOBJ_EX does, in any protocol.
        if (protocol_ < 4) RETURN_IF_ERROR(WriteGlobal("copyreg", "__newobj_ex__"));
        RETURN_IF_ERROR(Save(v.callable));
        RETURN_IF_ERROR(Save(v.args));
        RETURN_IF_ERROR(Save(v.kwargs));
        if (protocol_ < 4) {
          Opcode(Op::kTuple3);
          Opcode(Op::kReduce);
        } else {
          Opcode(Op::kNewObjEx);
        }
        break;
      case ObjectOp::kInst:
        // OBJ keeps INST/OBJ's semantics (cls.__new__ when there are no args and cls is a class,
        // which REDUCE would not); the args tuple itself was never a Python object.
        if (v.args->kind != Kind::kTuple) return Invalid("pickle: an INST object without tuple");
        if (walk_) walk_->reach.try_emplace(v.args.get(), 0);
        Opcode(Op::kMark);
        RETURN_IF_ERROR(Save(v.callable));
        for (const ValuePtr& a : v.args->items) RETURN_IF_ERROR(Save(a));
        Opcode(Op::kObj);
        break;
    }
    if (st.memo >= 0) return FetchInnerCopy(st, 1);
    RETURN_IF_ERROR(Memoize(v, st));
    RETURN_IF_ERROR(Batches(v.list_items, Op::kAppend, Op::kAppends));
    RETURN_IF_ERROR(PairBatches(v.dict_items));
    if (v.state) {
      RETURN_IF_ERROR(Save(v.state));
      Opcode(Op::kBuild);
    }
    return Status::Ok();
  }

  Status Batches(const std::vector<ValuePtr>& items, Op one, Op many) {
    for (size_t i = 0; i < items.size(); i += kBatch) {
      const size_t end = std::min(items.size(), i + kBatch);
      if (end - i == 1) {
        RETURN_IF_ERROR(Save(items[i]));
        Opcode(one);
        continue;
      }
      Opcode(Op::kMark);
      for (size_t j = i; j < end; ++j) RETURN_IF_ERROR(Save(items[j]));
      Opcode(many);
    }
    return Status::Ok();
  }

  Status PairBatches(const std::vector<std::pair<ValuePtr, ValuePtr>>& pairs) {
    for (size_t i = 0; i < pairs.size(); i += kBatch) {
      const size_t end = std::min(pairs.size(), i + kBatch);
      if (end - i > 1) Opcode(Op::kMark);
      for (size_t j = i; j < end; ++j) {
        RETURN_IF_ERROR(Save(pairs[j].first));
        RETURN_IF_ERROR(Save(pairs[j].second));
      }
      Opcode(end - i > 1 ? Op::kSetItems : Op::kSetItem);
    }
    return Status::Ok();
  }

  Status Memoize(const Value& v, NodeState& st) {
    if (v.kind == Kind::kNone || v.kind == Kind::kBool) return Status::Ok();  // singletons
    if (reach_) {
      auto it = reach_->find(&v);
      if (it == reach_->end() || it->second < 2) return Status::Ok();
    }
    if (next_memo_ > UINT32_MAX) return Invalid("pickle: more than 2^32 memo entries");
    st.memo = next_memo_++;
    if (protocol_ >= 4) {
      Opcode(Op::kMemoize);
    } else if (st.memo < 256) {
      Opcode(Op::kBinPut);
      Byte(static_cast<uint8_t>(st.memo));
    } else {
      Opcode(Op::kLongBinPut);
      LittleEndian(static_cast<uint64_t>(st.memo), 4);
    }
    return Status::Ok();
  }

  Status Get(int64_t memo) {
    if (memo < 256) {
      Opcode(Op::kBinGet);
      Byte(static_cast<uint8_t>(memo));
    } else {
      Opcode(Op::kLongBinGet);
      LittleEndian(static_cast<uint64_t>(memo), 4);
    }
    return Status::Ok();
  }

  void SaveInt(int64_t x) {
    if (x >= 0 && x <= 0xff) {
      Opcode(Op::kBinInt1);
      Byte(static_cast<uint8_t>(x));
    } else if (x >= 0 && x <= 0xffff) {
      Opcode(Op::kBinInt2);
      LittleEndian(static_cast<uint64_t>(x), 2);
    } else if (x >= INT32_MIN && x <= INT32_MAX) {
      Opcode(Op::kBinInt);
      LittleEndian(static_cast<uint64_t>(x), 4);
    } else {
      // Minimal two's complement, as Python's encode_long.
      size_t n = 8;
      while (n > 1) {
        const int64_t top = x >> (8 * (n - 1) - 1);  // the bits that the shorter form drops
        if (top != 0 && top != -1) break;
        --n;
      }
      Opcode(Op::kLong1);
      Byte(static_cast<uint8_t>(n));
      LittleEndian(static_cast<uint64_t>(x), n);
    }
  }

  Status SaveBigInt(const std::string& bytes) {
    if (bytes.size() < 256) {
      Opcode(Op::kLong1);
      Byte(static_cast<uint8_t>(bytes.size()));
    } else if (bytes.size() <= INT32_MAX) {
      Opcode(Op::kLong4);
      LittleEndian(bytes.size(), 4);
    } else {
      return Invalid("pickle: an int of more than 2^31 bytes");
    }
    Raw(bytes);
    return Status::Ok();
  }

  void SaveFloat(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    Opcode(Op::kBinFloat);
    for (int k = 7; k >= 0; --k) Byte(static_cast<uint8_t>(bits >> (8 * k)));  // big-endian
  }

  Status SaveUnicode(std::string_view s) {
    if (protocol_ >= 4 && s.size() < 256) {
      Opcode(Op::kShortBinUnicode);
      Byte(static_cast<uint8_t>(s.size()));
    } else if (s.size() <= UINT32_MAX) {
      Opcode(Op::kBinUnicode);
      LittleEndian(s.size(), 4);
    } else if (protocol_ >= 4) {
      Opcode(Op::kBinUnicode8);
      LittleEndian(s.size(), 8);
    } else {
      return Invalid("pickle: a str over 4 GiB needs protocol 4");
    }
    Raw(s);
    return Status::Ok();
  }

  Status SaveBinString(std::string_view s) {
    if (s.size() < 256) {
      Opcode(Op::kShortBinString);
      Byte(static_cast<uint8_t>(s.size()));
    } else if (s.size() <= INT32_MAX) {
      Opcode(Op::kBinString);
      LittleEndian(s.size(), 4);
    } else {
      return Invalid("pickle: a Python 2 str over 2 GiB");
    }
    Raw(s);
    return Status::Ok();
  }

  // A value written as a call (bytes below protocol 3, a set below 4, a bytearray below 5)
  // reads back as a call node with `levels` more levels under it than the value had: the
  // reader's depth limit counts them, so the writer does too (what it writes, it reads back).
  Status RoomBelow(size_t levels) const {
    if (path_.size() + extra_ + levels > limits_.max_depth) {
      return Invalid("pickle: the tree nests deeper than " + std::to_string(limits_.max_depth) +
                     " levels when written at protocol " + std::to_string(protocol_));
    }
    return Status::Ok();
  }

  // bytes, without memoizing it: also the argument of bytearray below protocol 5.
  Status SaveBytes(std::string_view s) {
    if (protocol_ < 3) {
      RETURN_IF_ERROR(RoomBelow(s.empty() ? 1 : 2));  // (args) or (args, (text, 'latin1'))
      // Python 3 at protocol 2: bytes() or _codecs.encode(s.decode('latin1'), 'latin1').
      if (s.empty()) {
        RETURN_IF_ERROR(WriteGlobal("__builtin__", "bytes"));
        Opcode(Op::kEmptyTuple);
      } else {
        RETURN_IF_ERROR(WriteGlobal("_codecs", "encode"));
        std::string utf8;
        if (emit_) {
          utf8.reserve(s.size() * 2);
          for (unsigned char c : s) {
            if (c < 0x80) {
              utf8 += static_cast<char>(c);
            } else {
              utf8 += static_cast<char>(0xc0 | (c >> 6));
              utf8 += static_cast<char>(0x80 | (c & 0x3f));
            }
          }
        }
        RETURN_IF_ERROR(SaveUnicode(utf8));
        RETURN_IF_ERROR(SaveUnicode("latin1"));
        Opcode(Op::kTuple2);
      }
      Opcode(Op::kReduce);
      return Status::Ok();
    }
    if (s.size() < 256) {
      Opcode(Op::kShortBinBytes);
      Byte(static_cast<uint8_t>(s.size()));
    } else if (s.size() <= UINT32_MAX) {
      Opcode(Op::kBinBytes);
      LittleEndian(s.size(), 4);
    } else if (protocol_ >= 4) {
      Opcode(Op::kBinBytes8);
      LittleEndian(s.size(), 8);
    } else {
      return Invalid("pickle: bytes over 4 GiB need protocol 4");
    }
    Raw(s);
    return Status::Ok();
  }

  Status SaveByteArray(std::string_view s) {
    if (protocol_ >= 5) {
      Opcode(Op::kByteArray8);
      LittleEndian(s.size(), 8);
      Raw(s);
      return Status::Ok();
    }
    RETURN_IF_ERROR(RoomBelow(2));  // bytearray((bytes,))
    RETURN_IF_ERROR(WriteGlobal(BuiltinsModule(), "bytearray"));
    extra_ += 2;
    Status saved = SaveBytes(s);
    extra_ -= 2;
    RETURN_IF_ERROR(saved);
    Opcode(Op::kTuple1);
    Opcode(Op::kReduce);
    return Status::Ok();
  }

  Status SaveExt(int64_t code) {
    if (code <= 0 || code > INT32_MAX) {
      return Invalid("pickle: extension code " + std::to_string(code) + " out of range");
    }
    if (code <= 0xff) {
      Opcode(Op::kExt1);
      Byte(static_cast<uint8_t>(code));
    } else if (code <= 0xffff) {
      Opcode(Op::kExt2);
      LittleEndian(static_cast<uint64_t>(code), 2);
    } else {
      Opcode(Op::kExt4);
      LittleEndian(static_cast<uint64_t>(code), 4);
    }
    return Status::Ok();
  }

  // Protocols 3 and up have no import fixing on load, so Python 2 names read from an old pickle
  // (Python 3 writes them too, at protocol 2) are written under their Python 3 names there.
  Status WriteGlobal(std::string_view module, std::string_view name) {
    if (protocol_ >= 3) Python3Name(&module, &name);
    if (protocol_ >= 4) {
      RETURN_IF_ERROR(SaveUnicode(module));
      RETURN_IF_ERROR(SaveUnicode(name));
      Opcode(Op::kStackGlobal);
      return Status::Ok();
    }
    if (module.find('\n') != std::string_view::npos || name.find('\n') != std::string_view::npos) {
      return Invalid("pickle: a global name with a newline needs protocol 4");
    }
    Opcode(Op::kGlobal);
    Raw(module);
    Byte('\n');
    Raw(name);
    Byte('\n');
    return Status::Ok();
  }

  std::string_view BuiltinsModule() const { return protocol_ >= 3 ? "builtins" : "__builtin__"; }

  void Opcode(Op op) { Byte(static_cast<uint8_t>(op)); }
  void Byte(uint8_t b) {
    if (emit_) out_.push_back(static_cast<char>(b));
  }
  void LittleEndian(uint64_t x, size_t n) {
    for (size_t k = 0; k < n; ++k) Byte(static_cast<uint8_t>(x >> (8 * k)));
  }
  void Raw(std::string_view s) {
    if (emit_) out_.append(s);
  }

  const int protocol_;
  const Limits limits_;
  internal::Walk* const walk_;
  const std::unordered_map<const Value*, uint32_t>* const reach_;
  const bool emit_;
  std::unordered_map<const Value*, NodeState> state_;
  std::vector<const ValuePtr*> path_;  // the nodes being written, outermost first
  size_t extra_ = 0;  // levels of call nodes written around the current one (RoomBelow)
  size_t saves_ = 0;
  int64_t next_memo_ = 0;
  std::string out_;
};

}  // namespace

namespace internal {

Status WalkTree(const ValuePtr& root, int protocol, const Limits& limits, Walk* walk) {
  Pickler counter(protocol, limits, walk, nullptr);
  return counter.Run(root);
}

}  // namespace internal

Result<std::string> Write(const ValuePtr& v, int protocol, const Limits& limits) {
  internal::Walk walk;
  RETURN_IF_ERROR(internal::WalkTree(v, protocol, limits, &walk));
  Pickler writer(protocol, limits, nullptr, &walk.reach);
  RETURN_IF_ERROR(writer.Run(v));
  return writer.Take();
}

}  // namespace ckptfs::pickle
