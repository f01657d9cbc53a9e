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
  kBigInt,     // bytes: little-endian two's complement, as LONG1/LONG4 store it
  kFloat,      // f
  kStr,        // str: UTF-8 text (BINUNICODE and friends)
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
  kInst,      // INST / OBJ (protocols 0 and 1): cls(*args)
};

struct Value {
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string str;     // kStr, kBytes, kByteArray, kBigInt
  bool py2_str = false;  // kBytes read from BINSTRING/SHORT_BINSTRING/STRING (Python 2 str)
  std::string module, name;  // kGlobal
  std::vector<ValuePtr> items;                            // kTuple, kList, kSet, kFrozenSet
  std::vector<std::pair<ValuePtr, ValuePtr>> pairs;       // kDict
  ValuePtr pid;                                           // kPersId

  // kObject: built by `op` from `callable` (a kGlobal, or any value) and `args` (a kTuple);
  // kwargs for NEWOBJ_EX (a kDict). Then, in this order, as the pickle mutated it:
  ObjectOp op = ObjectOp::kReduce;
  ValuePtr callable, args, kwargs;
  std::vector<ValuePtr> list_items;                       // APPEND/APPENDS onto the object
  std::vector<std::pair<ValuePtr, ValuePtr>> dict_items;  // SETITEM/SETITEMS onto the object
  ValuePtr state;                                         // BUILD (nullptr: none)

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

// Bounds that keep a hostile pickle from exhausting memory or the stack.
struct ReadLimits {
  size_t max_depth = 1000;       // nesting of containers/objects
  size_t max_values = 50'000'000;  // values created in total
};

// Reads one pickle (protocols 0-5) from data[0..len). Stops at STOP; `consumed` (if given) gets
// the number of bytes up to and including STOP. Errors (Code::kCorrupt, message names the opcode
// and its byte offset): truncated input, an unknown opcode, stack underflow, a missing memo entry,
// a MARK out of place, out-of-band buffers (NEXT_BUFFER), limits exceeded.
Result<ValuePtr> Read(const uint8_t* data, size_t len, size_t* consumed = nullptr,
                      const ReadLimits& limits = {});
inline Result<ValuePtr> Read(std::string_view s, size_t* consumed = nullptr) {
  return Read(reinterpret_cast<const uint8_t*>(s.data()), s.size(), consumed);
}

// Writes `v` as a pickle of protocol 2 (what torch.save uses) or higher (up to 5). A node reached
// more than once is written once and memoized, so sharing survives. Errors (Code::kInvalid): a
// value the protocol cannot express (e.g. kByteArray below protocol 5 is written as a REDUCE of
// builtins.bytearray instead, so in practice only malformed trees fail), or a cycle that does not
// pass through an object or container that pickle can memoize before recursing.
Result<std::string> Write(const ValuePtr& v, int protocol = 2);

// A short, human-readable rendering for logs, tests and `ckptfs inspect` (Python-like syntax;
// shared nodes are printed each time they are reached, cycles as "...").
std::string Debug(const ValuePtr& v, size_t max_len = 4096);

}  // namespace ckptfs::pickle
