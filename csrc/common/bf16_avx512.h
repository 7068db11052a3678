// float <-> bfloat16 for 16 lanes at a time, AVX-512 (F/BW). Include only from files built with AVX-512 flags.
// Internal linkage on purpose: these are compiled with AVX-512 flags and must never be merged
// with a same-named inline function from a translation unit built for another ISA.
#pragma once
#include <immintrin.h>

#include "common/bf16.h"

namespace shrike::avx512 {
namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// Round to nearest even, as float_to_bf16 does for finite values.
inline void store16(bf16* p, __m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(b));
}

}  // namespace
}  // namespace shrike::avx512
