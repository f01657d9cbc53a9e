// A small strict JSON reader and writer (RFC 8259).
//
// ckptfs reads JSON from checkpoint files it does not control (safetensors headers of tens of MB,
// `model.safetensors.index.json`) and writes JSON for extended attributes (user.ckptfs.*). The
// reader accepts exactly the RFC grammar and nothing more: no comments, no trailing commas, no
// NaN, no byte-order mark, strings only in valid UTF-8. Every rejection is Code::kCorrupt with the
// byte offset where the input went wrong, because a header that does not parse is damaged data.
//
// Objects keep their members in document order (a safetensors header lists tensors in the order a
// writer chose, and views keep it). Numbers without a fraction or exponent that fit in int64 are
// integers; every other number is a double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace ckptfs::json {

enum class Type : uint8_t { kNull, kBool, kInt, kDouble, kString, kArray, kObject };

std::string_view TypeName(Type t);

class Value;
using Array = std::vector<Value>;
using Member = std::pair<std::string, Value>;
using Object = std::vector<Member>;  // document order; see ParseOptions for duplicate keys

class Value {
 public:
  Value() = default;  // null
  static Value Null() { return Value(); }
  static Value Bool(bool b) { return Value(Rep(std::in_place_index<1>, b)); }
  static Value Int(int64_t i) { return Value(Rep(std::in_place_index<2>, i)); }
  static Value Double(double d) { return Value(Rep(std::in_place_index<3>, d)); }
  static Value String(std::string s) { return Value(Rep(std::in_place_index<4>, std::move(s))); }
  static Value MakeArray(Array a = {}) { return Value(Rep(std::in_place_index<5>, std::move(a))); }
  static Value MakeObject(Object o = {}) {
    return Value(Rep(std::in_place_index<6>, std::move(o)));
  }

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_null() const { return type() == Type::kNull; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_number() const { return type() == Type::kInt || type() == Type::kDouble; }
  bool is_string() const { return type() == Type::kString; }
  bool is_array() const { return type() == Type::kArray; }
  bool is_object() const { return type() == Type::kObject; }

  // REQUIRES: the matching type (checked by std::get; a mismatch is a bug in the caller).
  bool as_bool() const { return std::get<1>(v_); }
  int64_t as_int() const { return std::get<2>(v_); }
  // An int converts; REQUIRES: is_number().
  double as_double() const { return is_int() ? static_cast<double>(as_int()) : std::get<3>(v_); }
  const std::string& as_string() const { return std::get<4>(v_); }
  const Array& as_array() const { return std::get<5>(v_); }
  const Object& as_object() const { return std::get<6>(v_); }
  Array& mutable_array() { return std::get<5>(v_); }
  Object& mutable_object() { return std::get<6>(v_); }

  // The first member named `key`, or nullptr (also when this is not an object). Linear: meant for
  // the few members of a small object; walk as_object() for large ones.
  const Value* Find(std::string_view key) const;

  // Deep equality; object members compare in order. Int 1 and double 1.0 differ (types differ).
  friend bool operator==(const Value& a, const Value& b) { return a.v_ == b.v_; }

 private:
  using Rep = std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object>;
  explicit Value(Rep v) : v_(std::move(v)) {}
  Rep v_;
};

struct ParseOptions {
  // Arrays and objects nested deeper than this are rejected, so hostile input cannot exhaust the
  // stack (the parser recurses once per level).
  size_t max_depth = 128;
  // RFC 8259 leaves duplicate names undefined; safetensors forbids them. Rejected unless allowed.
  bool allow_duplicate_keys = false;
};

// Parses one JSON text: optional whitespace, one value, optional whitespace, end of input.
// Errors: Code::kCorrupt, the message naming the problem and its byte offset in `text`.
Result<Value> Parse(std::string_view text, const ParseOptions& options = {});

// Writes `v` compactly (no insignificant whitespace). Strings are escaped the way serde_json and
// Python's json (ensure_ascii=False) escape them: `"` and `\` with a backslash, \b \f \n \r \t by
// name, other control characters as \u00xx, everything else (non-ASCII included) as raw UTF-8.
// A double that holds an integral value gets a ".0" so it reads back as a double.
// Errors (Code::kInvalid): a string that is not valid UTF-8, a NaN or infinite double.
Result<std::string> Write(const Value& v);

// Appends `s` to `*out` as a quoted, escaped JSON string (see Write). For callers that produce
// JSON text directly without building a Value tree. Errors (Code::kInvalid): invalid UTF-8; `*out`
// is then left as it was.
Status AppendQuoted(std::string_view s, std::string* out);

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace ckptfs::json
