// A pickle reader that never executes anything, and a writer for what it reads.
//
// Checkpoints are pickles, and a pickle is a program: unpickling one in Python may call any
// function it names (REDUCE on os.system is the classic attack). ckptfs only ever *reads* pickles
// as data. The reader runs the pickle machine's stack and memo, but where Python would import a
// global or call a callable it builds a node that records the name or the call. Nothing is looked
// up, imported or run, so a malicious pickle is just an odd tree.
//
// The tree keeps Python's object identity: the memo shares nodes (a storage referenced by two
// tensors is one node with two parents), and the writer memoizes shared nodes again, so a tree read
// and written back unpickles in Python to an equal object with the same sharing.
//
// Ownership. Nodes are shared_ptrs; destroying a tree never recurses, however deep it is. A pickle
// may build reference cycles (a list that contains itself). Read() returns such a tree through a
// root that owns the cycles: when the last copy of that root goes away, the links that close each
// cycle are reset to nullptr so that everything is freed. Keep the root alive while using nodes
// of a cyclic tree. A cyclic tree built by hand is the builder's to break.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ckptfs::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

enum class Kind : uint8_t {
  kNone,
  kBool,       // b
  kInt,        // i (fits int64)
  kBigInt,     // str: little-endian two's complement, minimal length, as LONG1/LONG4 store it
  kFloat,      // f
  kStr,        // str: UTF-8 text (BINUNICODE and friends; lone surrogates kept as 3-byte forms)
  kBytes,      // str: raw bytes (BINBYTES and friends; protocol-2 BINSTRING too, see py2_str)
  kByteArray,  // str: raw bytes (BYTEARRAY8)
  kTuple,      // items
  kList,       // items
  kDict,       // pairs, in insertion order
  kSet,        // items
  kFrozenSet,  // items
  kGlobal,     // module, name: a reference to a class or function, never resolved
  kObject,     // an instance built by calling something: see ObjectOp and the object fields
  kPersId,     // pid: a persistent id (torch: a storage reference); persistent_load never runs
  kExt,        // i: an extension-registry code (EXT1/2/4), never resolved
};

// How a kObject came to be; the writer emits the same opcodes.
enum class ObjectOp : uint8_t {
  kReduce,    // callable(*args): REDUCE
  kNewObj,    // cls.__new__(cls, *args): NEWOBJ
  kNewObjEx,  // cls.__new__(cls, *args, **kwargs): NEWOBJ_EX
  kInst,      // INST / OBJ (protocols 0 and 1): `callable` is the class, `args` a kTuple
};

struct Value {
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string str;           // kStr, kBytes, kByteArray, kBigInt
  bool py2_str = false;      // kBytes read from BINSTRING/SHORT_BINSTRING/STRING (Python 2 str)
  std::string module, name;  // kGlobal
  std::vector<ValuePtr> items;                       // kTuple, kList, kSet, kFrozenSet
  std::vector<std::pair<ValuePtr, ValuePtr>> pairs;  // kDict
  ValuePtr pid;                                      // kPersId

  // kObject: built by `op` from `callable` (a kGlobal, or any value) and `args` (a kTuple);
  // kwargs for NEWOBJ_EX (a kDict). Then, in this order, as the pickle mutated it:
  ObjectOp op = ObjectOp::kReduce;
  ValuePtr callable, args, kwargs;
  std::vector<ValuePtr> list_items;                       // APPEND/APPENDS onto the object
  std::vector<std::pair<ValuePtr, ValuePtr>> dict_items;  // SETITEM/SETITEMS onto the object
  ValuePtr state;                                         // BUILD (nullptr: none)

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Releases children with an explicit worklist: a chain a million nodes deep must not recurse.
  ~Value();

  // Helpers for readers of the tree.
  bool IsGlobal(std::string_view mod, std::string_view nm) const {
    return kind == Kind::kGlobal && module == mod && name == nm;
  }
  // A kObject whose callable is the global mod.nm.
  bool IsCallOf(std::string_view mod, std::string_view nm) const {
    return kind == Kind::kObject && callable && callable->IsGlobal(mod, nm);
  }
};

ValuePtr MakeNone();
ValuePtr MakeBool(bool b);
ValuePtr MakeInt(int64_t i);
ValuePtr MakeFloat(double f);
ValuePtr MakeStr(std::string s);
ValuePtr MakeBytes(std::string s);
ValuePtr MakeTuple(std::vector<ValuePtr> items);
ValuePtr MakeList(std::vector<ValuePtr> items);
ValuePtr MakeDict(std::vector<std::pair<ValuePtr, ValuePtr>> pairs);
ValuePtr MakeGlobal(std::string module, std::string name);
ValuePtr MakeCall(ValuePtr callable, ValuePtr args);  // kObject, ObjectOp::kReduce
ValuePtr MakePersId(ValuePtr pid);

// Bounds that keep a hostile pickle from exhausting memory or the stack. Read() and Write() take
// the same limits, so whatever Read() accepts, Write() with the same limits can write back.
struct Limits {
  // Nesting as the writer recurses: one level per container or object on the way down (the
  // reader checks this after STOP by walking the tree the way the writer will). The writer's
  // stack use grows with it; the default suits an 8 MiB thread stack with room to spare.
  size_t max_depth = 1000;
  // Values created while reading, and values visited while writing (a shared node counts each
  // time the writer reaches it before it is memoized).
  size_t max_values = 50'000'000;
};

// Reads one pickle (protocols 0-5) from data[0..len). Stops at STOP; `consumed` (if given) gets
// the number of bytes up to and including STOP. Errors (Code::kCorrupt, message names the opcode
// and its byte offset): truncated input, an unknown opcode, stack underflow, a missing memo entry,
// a MARK out of place, malformed text or UTF-8, out-of-band buffers (NEXT_BUFFER,
// READONLY_BUFFER), limits exceeded.
Result<ValuePtr> Read(const uint8_t* data, size_t len, size_t* consumed = nullptr,
                      const Limits& limits = {});
inline Result<ValuePtr> Read(std::string_view s, size_t* consumed = nullptr,
                             const Limits& limits = {}) {
  return Read(reinterpret_cast<const uint8_t*>(s.data()), s.size(), consumed, limits);
}

// Writes `v` as a pickle of protocol 2 (what torch.save uses) up to 5. A node reached more than
// once is written once and memoized, so sharing and cycles survive. Values a protocol has no
// opcode for are written the way Python 3 writes them (bytes below protocol 3 as
// _codecs.encode(str, 'latin1'), sets below 4 as set([...]), bytearray below 5 as
// bytearray(bytes)); an object is written in the order of Python's save_reduce: callable, args,
// the constructing opcode, then APPENDS, SETITEMS and BUILD. Errors (Code::kInvalid): a protocol
// outside 2..5, a malformed tree (a null child, a kObject without callable), a global name with
// a newline below protocol 4, a string over 4 GiB below protocol 4, limits exceeded, or a cycle
// that no memoizable node breaks (Python could not pickle it either).
Result<std::string> Write(const ValuePtr& v, int protocol = 2, const Limits& limits = {});

// A short, human-readable rendering for logs, tests and `ckptfs inspect` (Python-like syntax;
// shared nodes are printed each time they are reached, cycles as "..."). Output stops near
// max_len characters, ending with "...".
std::string Debug(const ValuePtr& v, size_t max_len = 4096);

}  // namespace ckptfs::pickle
