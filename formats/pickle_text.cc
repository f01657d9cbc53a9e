// Decoding of the text and number encodings inside pickle opcodes. The protocol-0 opcodes carry
// their arguments as text lines (INT, LONG, FLOAT, STRING, UNICODE, GET, PUT); binary LONG1/LONG4
// carry two's complement bytes. Each function mirrors what CPython accepts for pickles that
// Python itself writes, and refuses the rest.
#include <charconv>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "formats/pickle.h"
#include "formats/pickle_internal.h"

#include "common/utf8.h"

namespace ckptfs::pickle::internal {
namespace {

// CPython refuses to convert longer decimal strings to int by default (sys.int_info).
constexpr size_t kMaxDecimalDigits = 4300;

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

void SetLong(Value& v, std::string le) {
  // A byte of pure sign extension adds nothing: 0x00 above a clear sign bit, 0xff above a set one.
  while (le.size() > 1) {
    const auto last = static_cast<uint8_t>(le.back());
    const auto prev = static_cast<uint8_t>(le[le.size() - 2]);
    if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) {
      le.pop_back();
    } else {
      break;
    }
  }
  if (le.size() <= 8) {
    uint64_t u = 0;
    for (size_t k = 0; k < le.size(); ++k) u |= uint64_t{static_cast<uint8_t>(le[k])} << (8 * k);
    if (!le.empty() && le.size() < 8 && (static_cast<uint8_t>(le.back()) & 0x80)) {
      u |= ~uint64_t{0} << (8 * le.size());
    }
    v.kind = Kind::kInt;
    v.i = static_cast<int64_t>(u);
    v.str.clear();
    return;
  }
  v.kind = Kind::kBigInt;
  v.str = std::move(le);
}

bool ParseDecimal(std::string_view s, Value& v) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (!AllDigits(s) || s.size() > kMaxDecimalDigits) return false;
  if (s.size() <= 18) {  // fits int64 with room to negate
    int64_t x = 0;
    for (char c : s) x = x * 10 + (c - '0');
    v.kind = Kind::kInt;
    v.i = negative ? -x : x;
    return true;
  }
  std::vector<uint32_t> magnitude;  // little-endian base 2^32
  for (char c : s) {
    uint64_t carry = static_cast<uint64_t>(c - '0');
    for (uint32_t& limb : magnitude) {
      const uint64_t t = uint64_t{limb} * 10 + carry;
      limb = static_cast<uint32_t>(t);
      carry = t >> 32;
    }
    if (carry) magnitude.push_back(static_cast<uint32_t>(carry));
  }
  std::string le;
  for (uint32_t limb : magnitude) {
    for (int k = 0; k < 4; ++k) le += static_cast<char>(limb >> (8 * k));
  }
  le += '\0';  // room for the sign bit
  if (negative) {
    bool carry = true;
    for (char& b : le) {
      auto x = static_cast<uint8_t>(~static_cast<uint8_t>(b));
      if (carry) {
        ++x;
        carry = x == 0;
      }
      b = static_cast<char>(x);
    }
  }
  SetLong(v, std::move(le));
  return true;
}

bool ParseIndex(std::string_view s, uint64_t* out) {
  if (!AllDigits(s) || s.size() > 18) return false;
  uint64_t x = 0;
  for (char c : s) x = x * 10 + static_cast<uint64_t>(c - '0');
  *out = x;
  return true;
}

bool ParseFloat(std::string_view s, double* out) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  // from_chars would also take "inf"/"nan" spellings, but only these are Python's.
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  double x = 0;
  if (lower == "inf" || lower == "infinity") {
    x = std::numeric_limits<double>::infinity();
  } else if (lower == "nan") {
    x = std::numeric_limits<double>::quiet_NaN();
  } else {
    if (s.empty() || !((s[0] >= '0' && s[0] <= '9') || s[0] == '.')) return false;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), x, std::chars_format::general);
    if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return false;
  }
  *out = negative ? -x : x;
  return true;
}

bool EscapeDecode(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      *out += s[i];
      continue;
    }
    if (++i == s.size()) return false;  // a trailing backslash
    const char c = s[i];
    switch (c) {
      case '\n': break;  // line continuation
      case '\\': *out += '\\'; break;
      case '\'': *out += '\''; break;
      case '"': *out += '"'; break;
      case 'a': *out += '\a'; break;
      case 'b': *out += '\b'; break;
      case 'f': *out += '\f'; break;
      case 'n': *out += '\n'; break;
      case 'r': *out += '\r'; break;
      case 't': *out += '\t'; break;
      case 'v': *out += '\v'; break;
      case 'x': {
        const int hi = i + 1 < s.size() ? HexDigit(s[i + 1]) : -1;
        const int lo = i + 2 < s.size() ? HexDigit(s[i + 2]) : -1;
        if (hi < 0 || lo < 0) return false;
        *out += static_cast<char>(hi * 16 + lo);
        i += 2;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          int x = c - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
            x = x * 8 + (s[++i] - '0');
          }
          *out += static_cast<char>(x & 0xff);
        } else {
          *out += '\\';  // unknown escapes stay as written
          *out += c;
        }
    }
  }
  return true;
}

bool RawUnicodeEscapeToUtf8(std::string_view s, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '\\') {
      AppendUtf8(static_cast<uint8_t>(s[i]), out);  // latin-1
      ++i;
      continue;
    }
    // Only the last of an odd run of backslashes starts an escape.
    size_t j = i;
    while (j < s.size() && s[j] == '\\') ++j;
    const size_t run = j - i;
    const bool escape = j < s.size() && (s[j] == 'u' || s[j] == 'U') && run % 2 == 1;
    out->append(escape ? run - 1 : run, '\\');
    i = j;
    if (!escape) continue;
    const size_t digits = s[j] == 'u' ? 4 : 8;
    if (s.size() - (j + 1) < digits) return false;
    uint32_t cp = 0;
    for (size_t k = 0; k < digits; ++k) {
      const int d = HexDigit(s[j + 1 + k]);
      if (d < 0) return false;
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    if (cp > 0x10ffff) return false;
    AppendUtf8(cp, out);
    i = j + 1 + digits;
  }
  return true;
}

bool IsUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t more;
    uint8_t lo = 0x80, hi = 0xbf;  // the allowed range of the first continuation byte
    if (c >= 0xc2 && c <= 0xdf) {
      more = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      more = 2;
      if (c == 0xe0) lo = 0xa0;  // no overlong forms; surrogates (0xed 0xa0..) are let through
    } else if (c >= 0xf0 && c <= 0xf4) {
      more = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return false;
    }
    if (n - i - 1 < more) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k <= more; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
    }
    i += more + 1;
  }
  return true;
}

}  // namespace ckptfs::pickle::internal
