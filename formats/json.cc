#include "formats/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>

#include "common/utf8.h"

namespace ckptfs::json {
namespace {

// Objects up to this many members are checked for duplicate names pairwise as they grow; larger
// ones once at the end, sorted, so a header with 10^5 tensors costs n log n, not n^2.
constexpr size_t kLinearDuplicateCheck = 8;

// Length of the well-formed UTF-8 sequence starting at p (p < end, *p >= 0x80), or 0.
// Follows the Unicode table of well-formed byte sequences (Table 3-7).
size_t Utf8SequenceLength(const unsigned char* p, const unsigned char* end) {
  const unsigned char c = p[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (static_cast<size_t>(end - p) < n) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  }
  return n;
}

int HexDigit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A name that occurs twice in `members`, or nullptr. Sorts hashes rather than strings: names in
// a large header share long prefixes ("model.layers.") that make string comparisons slow.
const std::string* FindDuplicateName(const Object& members) {
  std::vector<std::pair<size_t, size_t>> hashes;  // (hash, index)
  hashes.reserve(members.size());
  const std::hash<std::string_view> hash;
  for (size_t i = 0; i < members.size(); ++i) hashes.emplace_back(hash(members[i].first), i);
  std::sort(hashes.begin(), hashes.end());
  for (size_t i = 1; i < hashes.size(); ++i) {
    // Equal hashes are adjacent; compare every pair within a run of equal hashes.
    for (size_t j = i; j > 0 && hashes[j - 1].first == hashes[i].first; --j) {
      if (members[hashes[j - 1].second].first == members[hashes[i].second].first) {
        return &members[hashes[i].second].first;
      }
    }
  }
  return nullptr;
}

class Parser {
 public:
  Parser(std::string_view text, const ParseOptions& options)
      : begin_(reinterpret_cast<const unsigned char*>(text.data())),
        p_(begin_),
        end_(begin_ + text.size()),
        options_(options) {}

  Result<Value> ParseDocument() {
    SkipWhitespace();
    Value v;
    RETURN_IF_ERROR(ParseValue(&v, 0));
    SkipWhitespace();
    if (p_ != end_) return Error("unexpected data after the value");
    return v;
  }

 private:
  Status Error(std::string_view what) const { return ErrorAt(what, p_); }
  Status ErrorAt(std::string_view what, const unsigned char* at) const {
    return Corrupt("json: " + std::string(what) + " at byte " + std::to_string(at - begin_));
  }

  void SkipWhitespace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  bool ConsumeLiteral(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() ||
        std::memcmp(p_, word.data(), word.size()) != 0) {
      return false;
    }
    p_ += word.size();
    return true;
  }

  Status ParseValue(Value* out, size_t depth) {
    if (p_ == end_) return Error("unexpected end of input, expected a value");
    switch (*p_) {
      case '{':
        return ParseObject(out, depth + 1);
      case '[':
        return ParseArray(out, depth + 1);
      case '"': {
        std::string s;
        RETURN_IF_ERROR(ParseString(&s));
        *out = Value::String(std::move(s));
        return Status::Ok();
      }
      case 't':
        if (!ConsumeLiteral("true")) return Error("invalid literal");
        *out = Value::Bool(true);
        return Status::Ok();
      case 'f':
        if (!ConsumeLiteral("false")) return Error("invalid literal");
        *out = Value::Bool(false);
        return Status::Ok();
      case 'n':
        if (!ConsumeLiteral("null")) return Error("invalid literal");
        *out = Value::Null();
        return Status::Ok();
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return ParseNumber(out);
        return Error("unexpected character, expected a value");
    }
  }

  Status ParseArray(Value* out, size_t depth) {
    if (depth > options_.max_depth) return Error("nesting deeper than the limit");
    ++p_;  // '['
    Array items;
    SkipWhitespace();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      *out = Value::MakeArray(std::move(items));
      return Status::Ok();
    }
    for (;;) {
      SkipWhitespace();
      items.emplace_back();
      RETURN_IF_ERROR(ParseValue(&items.back(), depth));
      SkipWhitespace();
      if (p_ == end_) return Error("unexpected end of input in an array");
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == ']') {
        ++p_;
        break;
      }
      return Error("expected ',' or ']'");
    }
    *out = Value::MakeArray(std::move(items));
    return Status::Ok();
  }

  Status ParseObject(Value* out, size_t depth) {
    if (depth > options_.max_depth) return Error("nesting deeper than the limit");
    const unsigned char* start = p_;
    ++p_;  // '{'
    Object members;
    SkipWhitespace();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      *out = Value::MakeObject(std::move(members));
      return Status::Ok();
    }
    for (;;) {
      SkipWhitespace();
      if (p_ == end_ || *p_ != '"') return Error("expected a member name");
      const unsigned char* key_at = p_;
      std::string key;
      RETURN_IF_ERROR(ParseString(&key));
      if (!options_.allow_duplicate_keys && members.size() < kLinearDuplicateCheck) {
        for (const Member& m : members) {
          if (m.first == key) return ErrorAt("duplicate member name", key_at);
        }
      }
      SkipWhitespace();
      if (p_ == end_ || *p_ != ':') return Error("expected ':'");
      ++p_;
      SkipWhitespace();
      members.emplace_back();  // constructed in place: moving a fresh Value trips GCC 12's
      members.back().first = std::move(key);  // -Wmaybe-uninitialized on std::variant
      RETURN_IF_ERROR(ParseValue(&members.back().second, depth));
      SkipWhitespace();
      if (p_ == end_) return Error("unexpected end of input in an object");
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        break;
      }
      return Error("expected ',' or '}'");
    }
    if (!options_.allow_duplicate_keys && members.size() > kLinearDuplicateCheck) {
      if (const std::string* dup = FindDuplicateName(members)) {
        return ErrorAt("duplicate member name \"" + dup->substr(0, 64) + "\" in the object", start);
      }
    }
    *out = Value::MakeObject(std::move(members));
    return Status::Ok();
  }

  // Reads 4 hex digits after "\u" (p_ at the first digit).
  Status ParseHex4(uint32_t* cp) {
    if (end_ - p_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int d = HexDigit(p_[i]);
      if (d < 0) return ErrorAt("invalid hex digit in \\u escape", p_ + i);
      v = v << 4 | static_cast<uint32_t>(d);
    }
    p_ += 4;
    *cp = v;
    return Status::Ok();
  }

  Status ParseString(std::string* out) {
    ++p_;  // opening quote
    for (;;) {
      // Copy the run of plain ASCII in one go: most names and values have no escapes.
      const unsigned char* run = p_;
      while (p_ != end_ && *p_ >= 0x20 && *p_ < 0x80 && *p_ != '"' && *p_ != '\\') ++p_;
      out->append(reinterpret_cast<const char*>(run), p_ - run);
      if (p_ == end_) return Error("unterminated string");
      const unsigned char c = *p_;
      if (c == '"') {
        ++p_;
        return Status::Ok();
      }
      if (c < 0x20) return Error("control character in a string");
      if (c >= 0x80) {
        const size_t n = Utf8SequenceLength(p_, end_);
        if (n == 0) return Error("invalid UTF-8");
        out->append(reinterpret_cast<const char*>(p_), n);
        p_ += n;
        continue;
      }
      // A backslash escape.
      const unsigned char* esc = p_;
      ++p_;
      if (p_ == end_) return Error("unterminated string");
      switch (*p_++) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return ErrorAt("lone low surrogate", esc);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low one; together they name one
            // code point above U+FFFF.
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') {
              return ErrorAt("high surrogate without a low surrogate", esc);
            }
            p_ += 2;
            uint32_t lo = 0;
            RETURN_IF_ERROR(ParseHex4(&lo));
            if (lo < 0xDC00 || lo > 0xDFFF) {
              return ErrorAt("high surrogate without a low surrogate", esc);
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return ErrorAt("invalid escape", esc);
      }
    }
  }

  Status ParseNumber(Value* out) {
    const unsigned char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return Error("expected a digit");
    // Integer part: "0" or a non-zero digit followed by digits. Accumulate while it fits.
    uint64_t magnitude = 0;
    bool overflow = false;
    if (*p_ == '0') {
      ++p_;
      if (p_ != end_ && *p_ >= '0' && *p_ <= '9') return Error("leading zero in a number");
    } else {
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
        const uint64_t d = *p_ - '0';
        if (magnitude > (UINT64_MAX - d) / 10) overflow = true;
        if (!overflow) magnitude = magnitude * 10 + d;
        ++p_;
      }
    }
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return Error("expected a digit after '.'");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || *p_ < '0' || *p_ > '9') return Error("expected a digit in the exponent");
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    constexpr uint64_t kMaxPositive = static_cast<uint64_t>(INT64_MAX);
    if (integral && !overflow && magnitude <= kMaxPositive + (negative ? 1 : 0)) {
      // -(2^63) does not fit in a positive int64; negate in unsigned arithmetic.
      *out = Value::Int(negative ? static_cast<int64_t>(0 - magnitude)
                                 : static_cast<int64_t>(magnitude));
      return Status::Ok();
    }
    double d = 0;
    const auto [ptr, ec] =
        std::from_chars(reinterpret_cast<const char*>(start), reinterpret_cast<const char*>(p_), d);
    if (ec == std::errc::result_out_of_range) return ErrorAt("number out of range", start);
    if (ec != std::errc() || ptr != reinterpret_cast<const char*>(p_) || !std::isfinite(d)) {
      return ErrorAt("invalid number", start);
    }
    *out = Value::Double(d);
    return Status::Ok();
  }

  const unsigned char* const begin_;
  const unsigned char* p_;
  const unsigned char* const end_;
  const ParseOptions& options_;
};

Status AppendDouble(double d, std::string* out) {
  if (!std::isfinite(d)) return Invalid("json: cannot write a NaN or infinite number");
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  if (ec != std::errc()) return Internal("json: to_chars failed on a double");
  const std::string_view text(buf, end - buf);
  out->append(text);
  if (text.find_first_of(".e") == std::string_view::npos) out->append(".0");
  return Status::Ok();
}

Status WriteValue(const Value& v, std::string* out) {
  switch (v.type()) {
    case Type::kNull:
      out->append("null");
      return Status::Ok();
    case Type::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return Status::Ok();
    case Type::kInt: {
      char buf[24];
      const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v.as_int());
      out->append(buf, end - buf);
      return Status::Ok();
    }
    case Type::kDouble:
      return AppendDouble(v.as_double(), out);
    case Type::kString:
      return AppendQuoted(v.as_string(), out);
    case Type::kArray: {
      out->push_back('[');
      bool first = true;
      for (const Value& item : v.as_array()) {
        if (!first) out->push_back(',');
        first = false;
        RETURN_IF_ERROR(WriteValue(item, out));
      }
      out->push_back(']');
      return Status::Ok();
    }
    case Type::kObject: {
      out->push_back('{');
      bool first = true;
      for (const Member& m : v.as_object()) {
        if (!first) out->push_back(',');
        first = false;
        RETURN_IF_ERROR(AppendQuoted(m.first, out));
        out->push_back(':');
        RETURN_IF_ERROR(WriteValue(m.second, out));
      }
      out->push_back('}');
      return Status::Ok();
    }
  }
  return Internal("json: value of unknown type");
}

}  // namespace

std::string_view TypeName(Type t) {
  switch (t) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kDouble:
      return "double";
    case Type::kString:
      return "string";
    case Type::kArray:
      return "array";
    case Type::kObject:
      return "object";
  }
  return "unknown";
}

const Value* Value::Find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const Member& m : as_object()) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

Result<Value> Parse(std::string_view text, const ParseOptions& options) {
  return Parser(text, options).ParseDocument();
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p != end) {
    if (*p < 0x80) {
      ++p;
      continue;
    }
    const size_t n = Utf8SequenceLength(p, end);
    if (n == 0) return false;
    p += n;
  }
  return true;
}

Status AppendQuoted(std::string_view s, std::string* out) {
  if (!IsValidUtf8(s)) return Invalid("json: string is not valid UTF-8");
  static constexpr char kHex[] = "0123456789abcdef";
  out->reserve(out->size() + s.size() + 2);
  out->push_back('"');
  size_t run = 0;  // start of the pending run of bytes that need no escape
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out->append(s.data() + run, i - run);
    run = i + 1;
    out->push_back('\\');
    switch (c) {
      case '"':
        out->push_back('"');
        break;
      case '\\':
        out->push_back('\\');
        break;
      case '\b':
        out->push_back('b');
        break;
      case '\f':
        out->push_back('f');
        break;
      case '\n':
        out->push_back('n');
        break;
      case '\r':
        out->push_back('r');
        break;
      case '\t':
        out->push_back('t');
        break;
      default:
        out->append("u00");
        out->push_back(kHex[c >> 4]);
        out->push_back(kHex[c & 0xF]);
    }
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
  return Status::Ok();
}

Result<std::string> Write(const Value& v) {
  std::string out;
  RETURN_IF_ERROR(WriteValue(v, &out));
  return out;
}

}  // namespace ckptfs::json
