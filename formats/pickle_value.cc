// The pickle tree: constructors, non-recursive destruction, opcode names and Debug().
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "formats/pickle.h"
#include "formats/pickle_internal.h"

namespace ckptfs::pickle {
namespace {

bool HasChildren(const Value& v) {
  return !v.items.empty() || !v.pairs.empty() || v.pid || v.callable || v.args || v.kwargs ||
         !v.list_items.empty() || !v.dict_items.empty() || v.state;
}

// Moves v's children that would die with it, and have children of their own, onto `doomed`:
// the caller frees them one at a time instead of the destructor chain recursing into them.
void TakeDoomedChildren(Value& v, std::vector<ValuePtr>& doomed) {
  internal::ForEachChildSlot(v, [&](ValuePtr& c) {
    if (c && c.use_count() == 1 && HasChildren(*c)) doomed.push_back(std::move(c));
  });
}

ValuePtr Make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

}  // namespace

Value::~Value() {
  if (!HasChildren(*this)) return;
  std::vector<ValuePtr> doomed;
  TakeDoomedChildren(*this, doomed);
  while (!doomed.empty()) {
    ValuePtr p = std::move(doomed.back());
    doomed.pop_back();
    if (p.use_count() == 1) TakeDoomedChildren(*p, doomed);
  }  // each p dies here with no deep children left, so its destructor returns at once
}

ValuePtr MakeNone() { return Make(Kind::kNone); }
ValuePtr MakeBool(bool b) {
  auto v = Make(Kind::kBool);
  v->b = b;
  return v;
}
ValuePtr MakeInt(int64_t i) {
  auto v = Make(Kind::kInt);
  v->i = i;
  return v;
}
ValuePtr MakeFloat(double f) {
  auto v = Make(Kind::kFloat);
  v->f = f;
  return v;
}
ValuePtr MakeStr(std::string s) {
  auto v = Make(Kind::kStr);
  v->str = std::move(s);
  return v;
}
ValuePtr MakeBytes(std::string s) {
  auto v = Make(Kind::kBytes);
  v->str = std::move(s);
  return v;
}
ValuePtr MakeTuple(std::vector<ValuePtr> items) {
  auto v = Make(Kind::kTuple);
  v->items = std::move(items);
  return v;
}
ValuePtr MakeList(std::vector<ValuePtr> items) {
  auto v = Make(Kind::kList);
  v->items = std::move(items);
  return v;
}
ValuePtr MakeDict(std::vector<std::pair<ValuePtr, ValuePtr>> pairs) {
  auto v = Make(Kind::kDict);
  v->pairs = std::move(pairs);
  return v;
}
ValuePtr MakeGlobal(std::string module, std::string name) {
  auto v = Make(Kind::kGlobal);
  v->module = std::move(module);
  v->name = std::move(name);
  return v;
}
ValuePtr MakeCall(ValuePtr callable, ValuePtr args) {
  auto v = Make(Kind::kObject);
  v->op = ObjectOp::kReduce;
  v->callable = std::move(callable);
  v->args = std::move(args);
  return v;
}
ValuePtr MakePersId(ValuePtr pid) {
  auto v = Make(Kind::kPersId);
  v->pid = std::move(pid);
  return v;
}

namespace internal {

void ClearChildren(Value& v) {
  v.items.clear();
  v.pairs.clear();
  v.pid.reset();
  v.callable.reset();
  v.args.reset();
  v.kwargs.reset();
  v.list_items.clear();
  v.dict_items.clear();
  v.state.reset();
}

const char* OpName(uint8_t op) {
  switch (op) {
    case kMark: return "MARK";
    case kStop: return "STOP";
    case kPop: return "POP";
    case kPopMark: return "POP_MARK";
    case kDup: return "DUP";
    case kFloat: return "FLOAT";
    case kInt: return "INT";
    case kBinInt: return "BININT";
    case kBinInt1: return "BININT1";
    case kLong: return "LONG";
    case kBinInt2: return "BININT2";
    case kNone: return "NONE";
    case kPersId: return "PERSID";
    case kBinPersId: return "BINPERSID";
    case kReduce: return "REDUCE";
    case kString: return "STRING";
    case kBinString: return "BINSTRING";
    case kShortBinString: return "SHORT_BINSTRING";
    case kUnicode: return "UNICODE";
    case kBinUnicode: return "BINUNICODE";
    case kAppend: return "APPEND";
    case kBuild: return "BUILD";
    case kGlobal: return "GLOBAL";
    case kDict: return "DICT";
    case kEmptyDict: return "EMPTY_DICT";
    case kAppends: return "APPENDS";
    case kGet: return "GET";
    case kBinGet: return "BINGET";
    case kInst: return "INST";
    case kLongBinGet: return "LONG_BINGET";
    case kList: return "LIST";
    case kEmptyList: return "EMPTY_LIST";
    case kObj: return "OBJ";
    case kPut: return "PUT";
    case kBinPut: return "BINPUT";
    case kLongBinPut: return "LONG_BINPUT";
    case kSetItem: return "SETITEM";
    case kTuple: return "TUPLE";
    case kEmptyTuple: return "EMPTY_TUPLE";
    case kSetItems: return "SETITEMS";
    case kBinFloat: return "BINFLOAT";
    case kProto: return "PROTO";
    case kNewObj: return "NEWOBJ";
    case kExt1: return "EXT1";
    case kExt2: return "EXT2";
    case kExt4: return "EXT4";
    case kTuple1: return "TUPLE1";
    case kTuple2: return "TUPLE2";
    case kTuple3: return "TUPLE3";
    case kNewTrue: return "NEWTRUE";
    case kNewFalse: return "NEWFALSE";
    case kLong1: return "LONG1";
    case kLong4: return "LONG4";
    case kBinBytes: return "BINBYTES";
    case kShortBinBytes: return "SHORT_BINBYTES";
    case kShortBinUnicode: return "SHORT_BINUNICODE";
    case kBinUnicode8: return "BINUNICODE8";
    case kBinBytes8: return "BINBYTES8";
    case kEmptySet: return "EMPTY_SET";
    case kAddItems: return "ADDITEMS";
    case kFrozenSet: return "FROZENSET";
    case kNewObjEx: return "NEWOBJ_EX";
    case kStackGlobal: return "STACK_GLOBAL";
    case kMemoize: return "MEMOIZE";
    case kFrame: return "FRAME";
    case kByteArray8: return "BYTEARRAY8";
    case kNextBuffer: return "NEXT_BUFFER";
    case kReadOnlyBuffer: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

}  // namespace internal

namespace {

// Debug() never recurses deeper than this, whatever max_len allows.
constexpr size_t kDebugDepth = 100;

class Printer {
 public:
  explicit Printer(size_t max_len) : max_len_(max_len) {}

  std::string Finish() {
    if (full()) {
      out_.resize(max_len_);
      out_ += "...";
    }
    return std::move(out_);
  }

  void Print(const ValuePtr& v) {
    if (full()) return;
    if (!v) {
      out_ += "<null>";
      return;
    }
    for (const Value* p : path_) {
      if (p == v.get()) {
        out_ += "...";
        return;
      }
    }
    if (path_.size() >= kDebugDepth) {
      out_ += "...";
      return;
    }
    path_.push_back(v.get());
    PrintValue(*v);
    path_.pop_back();
  }

 private:
  bool full() const { return out_.size() >= max_len_; }

  void PrintValue(const Value& v) {
    switch (v.kind) {
      case Kind::kNone: out_ += "None"; break;
      case Kind::kBool: out_ += v.b ? "True" : "False"; break;
      case Kind::kInt: out_ += std::to_string(v.i); break;
      case Kind::kBigInt: out_ += "<int of " + std::to_string(v.str.size()) + " bytes>"; break;
      case Kind::kFloat: PrintFloat(v.f); break;
      case Kind::kStr: Quote(v.str, /*bytes=*/false); break;
      case Kind::kBytes: Quote(v.str, /*bytes=*/true); break;
      case Kind::kByteArray:
        out_ += "bytearray(";
        Quote(v.str, /*bytes=*/true);
        out_ += ")";
        break;
      case Kind::kTuple:
        out_ += "(";
        Items(v.items);
        out_ += v.items.size() == 1 ? ",)" : ")";
        break;
      case Kind::kList:
        out_ += "[";
        Items(v.items);
        out_ += "]";
        break;
      case Kind::kDict:
        out_ += "{";
        Pairs(v.pairs);
        out_ += "}";
        break;
      case Kind::kSet:
      case Kind::kFrozenSet:
        out_ += v.kind == Kind::kSet ? (v.items.empty() ? "set(" : "{") : "frozenset({";
        Items(v.items);
        out_ += v.kind == Kind::kSet ? (v.items.empty() ? ")" : "}") : "})";
        break;
      case Kind::kGlobal: out_ += v.module + "." + v.name; break;
      case Kind::kPersId:
        out_ += "persistent_id(";
        Print(v.pid);
        out_ += ")";
        break;
      case Kind::kExt: out_ += "ext(" + std::to_string(v.i) + ")"; break;
      case Kind::kObject: PrintObject(v); break;
    }
  }

  void PrintObject(const Value& v) {
    Print(v.callable);
    if (v.op == ObjectOp::kNewObj || v.op == ObjectOp::kNewObjEx) out_ += ".__new__";
    out_ += "(";
    if (v.args && v.args->kind == Kind::kTuple) {
      Items(v.args->items);
    } else {
      out_ += "*";
      Print(v.args);
    }
    if (v.kwargs) {
      out_ += ", **";
      Print(v.kwargs);
    }
    out_ += ")";
    if (!v.list_items.empty()) {
      out_ += ".extend([";
      Items(v.list_items);
      out_ += "])";
    }
    if (!v.dict_items.empty()) {
      out_ += ".update({";
      Pairs(v.dict_items);
      out_ += "})";
    }
    if (v.state) {
      out_ += ".__setstate__(";
      Print(v.state);
      out_ += ")";
    }
  }

  void Items(const std::vector<ValuePtr>& items) {
    for (size_t k = 0; k < items.size() && !full(); ++k) {
      if (k) out_ += ", ";
      Print(items[k]);
    }
  }

  void Pairs(const std::vector<std::pair<ValuePtr, ValuePtr>>& pairs) {
    for (size_t k = 0; k < pairs.size() && !full(); ++k) {
      if (k) out_ += ", ";
      Print(pairs[k].first);
      out_ += ": ";
      Print(pairs[k].second);
    }
  }

  void PrintFloat(double f) {
    if (std::isnan(f)) {
      out_ += "nan";
    } else if (std::isinf(f)) {
      out_ += f < 0 ? "-inf" : "inf";
    } else {
      char buf[32];
      const auto r = std::to_chars(buf, buf + sizeof(buf), f);  // shortest round trip, like repr
      const std::string_view text(buf, r.ptr - buf);
      out_ += text;
      if (text.find_first_of(".e") == std::string_view::npos) out_ += ".0";
    }
  }

  // Python-like quoting; str keeps its UTF-8, bytes show non-ASCII as \xNN.
  void Quote(const std::string& s, bool bytes) {
    if (bytes) out_ += "b";
    out_ += "'";
    for (unsigned char c : s) {
      if (full()) return;
      switch (c) {
        case '\\': out_ += "\\\\"; break;
        case '\'': out_ += "\\'"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (c < 0x20 || c == 0x7f || (bytes && c >= 0x80)) {
            char buf[5];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out_ += buf;
          } else {
            out_ += static_cast<char>(c);
          }
      }
    }
    out_ += "'";
  }

  const size_t max_len_;
  std::string out_;
  std::vector<const Value*> path_;
};

}  // namespace

std::string Debug(const ValuePtr& v, size_t max_len) {
  Printer p(max_len);
  p.Print(v);
  return p.Finish();
}

}  // namespace ckptfs::pickle
