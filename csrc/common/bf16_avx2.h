// float <-> bfloat16 for 8 lanes at a time, AVX2. Include only from *_avx2.cpp files.
// Internal linkage on purpose: these are compiled with AVX2 flags and must never be merged
// with a same-named inline function from a translation unit built for another ISA.
#pragma once
#include <immintrin.h>

#include "common/bf16.h"

namespace shrike::avx2 {
namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The float bits plus the round-to-nearest-even increment: the top 16 bits of each lane are
// then the bf16 value, as float_to_bf16 gives it for finite inputs.
inline __m256i bf16_rounded_bits(__m256 v) {
  __m256i b = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}

inline __m128i to_bf16(__m256 v) {
  __m256i hi = _mm256_srli_epi32(bf16_rounded_bits(v), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(bf16* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(v)); }

}  // namespace
}  // namespace shrike::avx2
