// 16 bf16 values to and from an AVX-512 fp32 vector, as bf16_to_float and float_to_bf16 do
// one (round to nearest even, NaN quieted). Only for code reached after a check that the
// processor has AVX-512 (F and BW): the functions carry their own target. Internal to
// kernels/cpu/.
#pragma once
#include <immintrin.h>

#include <cstdint>

#define SPOTRAIN_AVX512 __attribute__((target("avx512f,avx512bw")))

namespace spotrain::cpu {

// Whether the processor has AVX-512 F and BW, which these functions need (decided once).
inline bool have_avx512bw() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
}

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

SPOTRAIN_AVX512 inline __m512 bf16x16_load(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

SPOTRAIN_AVX512 inline void bf16x16_store(uint16_t* p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

#pragma GCC diagnostic pop

}  // namespace spotrain::cpu
