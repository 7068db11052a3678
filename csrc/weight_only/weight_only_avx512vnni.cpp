// AVX-512: one zmm holds a K block's 16 accumulator lanes. Weights are widened from bytes to 32-bit
// lanes (lane j = the pair 2j, 2j+1), split into their even and odd elements, converted to float
// and dequantized with one fma each; then the dense reference order with FMA.
#include <immintrin.h>

#include "weight_only/weight_only_kernels.h"

namespace shrike::avx512vnni {

namespace {

struct Pairs {
  __m512 odd, even;
};

inline Pairs load_x(const bf16* p) {
  __m512i v = _mm512_loadu_si512(p);
  return {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))),
          _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
}

inline Pairs load_x(const float* p) {
  __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
  const __m512i odd_idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i even_idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return {_mm512_permutex2var_ps(a, odd_idx, b), _mm512_permutex2var_ps(a, even_idx, b)};
}

// The 32 weights of output c at K block b, dequantized.
template <int BITS>
inline Pairs load_w(const WeightOnlyWeight& w, int64_t c, int64_t b) {
  __m512i odd, even;
  if constexpr (BITS == 4) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.q + (c * w.k + b) / 2)));
    even = _mm512_and_si512(v, _mm512_set1_epi32(15));
    odd = _mm512_srli_epi32(v, 4);
  } else {
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.q + c * w.k + b)));
    even = _mm512_and_si512(v, _mm512_set1_epi32(0xffff));
    odd = _mm512_srli_epi32(v, 16);
  }
  int64_t g = weight_only_group(w, c, b);
  __m512 s = _mm512_set1_ps(w.scale[g]), o = _mm512_set1_ps(w.offset[g]);
  return {_mm512_fmadd_ps(_mm512_cvtepi32_ps(odd), s, o), _mm512_fmadd_ps(_mm512_cvtepi32_ps(even), s, o)};
}

// Lane j += lane j + 8, + 4, + 2, + 1.
inline float reduce16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// RB rows x CB outputs, one accumulator each; each dequantized weight block feeds RB rows.
template <int RB, int CB, typename XT, int BITS>
void block(const WeightOnlyProblem& p, int64_t r0, int64_t c0) {
  const int64_t k = p.w.k;
  const XT* x = static_cast<const XT*>(p.x) + r0 * k;
  __m512 acc[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < k; b += 32) {
    Pairs xp[RB];
    SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_x(x + r * k + b);
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      Pairs wp = load_w<BITS>(p.w, c0 + c, b);
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
        acc[r][c] = _mm512_fmadd_ps(xp[r].odd, wp.odd, acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xp[r].even, wp.even, acc[r][c]);
      }
    }
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) weight_only_store(p, r0 + r, c0 + c, reduce16(acc[r][c]));
}

}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  with_weight_only_types(p, [&](auto x, auto bits) {
    walk_4x4(r0, r1, c0, c1, [&](auto rows, auto cols, int64_t r, int64_t c) {
      block<decltype(rows)::value, decltype(cols)::value, decltype(x), decltype(bits)::value>(p, r, c);
    });
  });
}

}  // namespace shrike::avx512vnni
