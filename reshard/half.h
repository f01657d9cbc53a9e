// float -> 16-bit floats, rounding to nearest even as torch's .to(bfloat16 / float16) does. Plain
// integer arithmetic: no _Float16 (which some compilers lack on some targets) and no dependence on
// the floating-point environment's rounding mode.
#pragma once

#include <cstdint>
#include <cstring>

namespace ckptfs {

// float -> bfloat16; NaN -> the quiet NaN.
inline uint16_t ToBFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (f != f) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// float -> IEEE float16 (subnormals kept, overflow to infinity); NaN -> the quiet NaN, sign kept.
inline uint16_t ToFloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00;               // NaN
  if (a >= 0x47800000) return sign | 0x7c00;              // |f| >= 2^16: infinity
  if (a >= 0x38800000) {                                  // a normal half (|f| >= 2^-14)
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits, nearest even; a carry out of
    // the mantissa moves into the exponent, up to infinity (65520 and above).
    const uint32_t r = a - (112u << 23) + 0xfff + ((a >> 13) & 1);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // A subnormal half: |f| in units of 2^-24, nearest even (1024 units is the smallest normal).
  const uint32_t e = a >> 23;
  if (e < 102) return sign;                               // below 2^-25: zero
  const uint32_t m = (a & 0x7fffff) | 0x800000;           // |f| = m * 2^(e - 150)
  const uint32_t shift = 126 - e;                         // 14..24
  const uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  const uint32_t up = rest > half || (rest == half && (q & 1)) ? 1 : 0;
  return static_cast<uint16_t>(sign | (q + up));
}

}  // namespace ckptfs
