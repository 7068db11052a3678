// The float kernels' K-block order (dense/dense_kernels.h) on AVX2: 16 consecutive values split
// into their odd and even elements, 8 fp32 lanes each (lane j = pair j). Include only from x86 ISA
// files; internal linkage, as in bf16_avx2.h.
#pragma once
#include <immintrin.h>

#include "common/bf16.h"

namespace shrike::avx2 {
namespace {

struct Pairs {
  __m256 odd, even;
};

inline Pairs load_pairs(const bf16* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))),
          _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))};
}

inline Pairs load_pairs(const float* p) {
  __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  // shuffle_ps works within 128-bit halves; the 64-bit permute puts the halves in K order.
  __m256 odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  __m256 even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
  return {odd, even};
}

// Lane j += lane j + 4, + 2, + 1 (lane j += j + 8 is the caller's add of its lo and hi halves).
inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace shrike::avx2
