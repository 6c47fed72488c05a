// bf16 and IEEE fp16 as raw 16-bit words: conversions to and from fp32, round to nearest
// even, written once for the host and the GPU (SPOTRAIN_HD). Used by the backends, the
// fp16/bf16 gradient compression of comm/.
#pragma once
#include <cstdint>

#include "core/philox.h"  // SPOTRAIN_HD

namespace spotrain {

SPOTRAIN_HD uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
SPOTRAIN_HD float bits_f32(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

SPOTRAIN_HD uint16_t float_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
SPOTRAIN_HD float bf16_to_float(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// IEEE binary16: values of magnitude >= 65520 become inf, as on a GPU.
SPOTRAIN_HD uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return uint16_t(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (a < 0x38800000u) {                                   // subnormal or zero in fp16
    if (a < 0x33000000u) return sign;                      // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - int(a >> 23);                        // 14..24
    // value = mant * 2^(e - 150) = (mant >> shift) * 2^-24: keep 24 - shift bits, round.
    uint32_t r = mant >> shift;
    uint32_t dropped = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (dropped > halfway || (dropped == halfway && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}
SPOTRAIN_HD float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace spotrain
