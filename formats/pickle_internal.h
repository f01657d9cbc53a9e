// Pieces shared by the pickle reader, writer and tree code; not part of the formats/ API.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "formats/pickle.h"

namespace ckptfs::pickle::internal {

// Opcodes, named as in CPython's pickle module.
enum Op : uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  // Protocol 2.
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  // Protocol 3.
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  // Protocol 4.
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  // Protocol 5.
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

// The opcode's name for error messages, or nullptr for a byte that is no opcode.
const char* OpName(uint8_t op);

// Calls f(ValuePtr&) on every child slot of v, in the order the writer visits them.
template <typename F>
void ForEachChildSlot(Value& v, F&& f) {
  for (ValuePtr& c : v.items) f(c);
  for (auto& [k, x] : v.pairs) {
    f(k);
    f(x);
  }
  f(v.pid);
  f(v.callable);
  f(v.args);
  f(v.kwargs);
  for (ValuePtr& c : v.list_items) f(c);
  for (auto& [k, x] : v.dict_items) {
    f(k);
    f(x);
  }
  f(v.state);
}

// Drops every child link of v (used to dismantle garbage without recursion).
void ClearChildren(Value& v);

// What the writer learns by walking a tree without writing it: how often each node is reached
// (a node reached more than once is memoized) and the edges that close a cycle (from a node to
// one that is still being written further up). Every reachable node has an entry in `reach`.
struct Walk {
  std::unordered_map<const Value*, uint32_t> reach;
  std::vector<std::pair<ValuePtr, ValuePtr>> back_edges;
};

// Walks `root` as Write(root, protocol, limits) would. Fails (Code::kInvalid) where Write would.
Status WalkTree(const ValuePtr& root, int protocol, const Limits& limits, Walk* walk);

// Text and number decoding for the protocol-0 opcodes (pickle_text.cc). Each returns false on
// malformed input; the reader turns that into an error naming the opcode.

// Sets v to the int whose little-endian two's complement bytes are `le`: kInt where it fits in
// int64, else kBigInt with the bytes trimmed to minimal length.
void SetLong(Value& v, std::string le);
// A decimal integer with optional sign ("123", "-5"), as INT and LONG carry it; kInt or kBigInt.
// Refuses more digits than Python converts by default (4300).
bool ParseDecimal(std::string_view s, Value& v);
// A non-negative decimal memo index (GET, PUT).
bool ParseIndex(std::string_view s, uint64_t* out);
// A float as Python's float() reads repr() output, including inf and nan.
bool ParseFloat(std::string_view s, double* out);
// Python 2 string escapes (codecs.escape_decode), for STRING.
bool EscapeDecode(std::string_view s, std::string* out);
// raw-unicode-escape (latin-1 bytes plus backslash-u/U hex escapes) to UTF-8, for UNICODE.
bool RawUnicodeEscapeToUtf8(std::string_view s, std::string* out);
// UTF-8 as Python decodes it with 'surrogatepass': lone surrogates are accepted.
bool IsUtf8(std::string_view s);

}  // namespace ckptfs::pickle::internal
