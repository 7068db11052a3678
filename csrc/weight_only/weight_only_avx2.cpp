// AVX2 + FMA: a K block's 16 accumulator lanes live in two registers, lo = pairs of K 0..15 and
// hi = pairs of K 16..31 (lane j += lane j + 8 is the lo + hi add). Weights are widened from bytes
// to 32-bit lanes (lane j = the pair 2j, 2j+1), split into even and odd elements and dequantized
// with one fma each.
#include <immintrin.h>

#include "weight_only/weight_only_kernels.h"

namespace shrike::avx2 {

namespace {

struct Pairs {
  __m256 odd, even;
};

inline Pairs load_x(const bf16* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))),
          _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))};
}

inline Pairs load_x(const float* p) {
  __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  // shuffle_ps works within 128-bit halves; the 64-bit permute puts the halves in K order.
  __m256 odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
  __m256 even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
  return {odd, even};
}

// The 16 weights of output c at K b + 16 * half .. + 15, dequantized with (s, o).
template <int BITS>
inline Pairs load_w(const WeightOnlyWeight& w, int64_t c, int64_t b, int half, __m256 s, __m256 o) {
  __m256i odd, even;
  if constexpr (BITS == 4) {
    const uint8_t* q = w.q + (c * w.k + b) / 2 + 8 * half;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
    even = _mm256_and_si256(v, _mm256_set1_epi32(15));
    odd = _mm256_srli_epi32(v, 4);
  } else {
    const uint8_t* q = w.q + c * w.k + b + 16 * half;
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    even = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    odd = _mm256_srli_epi32(v, 16);
  }
  return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), s, o), _mm256_fmadd_ps(_mm256_cvtepi32_ps(even), s, o)};
}

// Lane j += lane j + 4, + 2, + 1.
inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <int RB, int CB, typename XT, int BITS>
void block(const WeightOnlyProblem& p, int64_t r0, int64_t c0) {
  const int64_t k = p.w.k;
  const XT* x = static_cast<const XT*>(p.x) + r0 * k;
  __m256 lo[RB][CB], hi[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k; b += 32) {
    __m256 s[CB], o[CB];
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      int64_t g = weight_only_group(p.w, c0 + c, b);
      s[c] = _mm256_set1_ps(p.w.scale[g]);
      o[c] = _mm256_set1_ps(p.w.offset[g]);
    }
    SHRIKE_UNROLL for (int half = 0; half < 2; ++half) {
      Pairs xp[RB];
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_x(x + r * k + b + 16 * half);
      SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
        Pairs wp = load_w<BITS>(p.w, c0 + c, b, half, s[c], o[c]);
        SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
          __m256& acc = half ? hi[r][c] : lo[r][c];
          acc = _mm256_fmadd_ps(xp[r].odd, wp.odd, acc);
          acc = _mm256_fmadd_ps(xp[r].even, wp.even, acc);
        }
      }
    }
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c)
      weight_only_store(p, r0 + r, c0 + c, reduce8(_mm256_add_ps(lo[r][c], hi[r][c])));
}

// One row (decode): 4 outputs at a time; more rows: 2 x 2 blocks, then the remainders.
template <typename XT, int BITS>
void typed(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  if (r1 - r0 == 1) {
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4) block<1, 4, XT, BITS>(p, r0, c);
    for (; c < c1; ++c) block<1, 1, XT, BITS>(p, r0, c);
    return;
  }
  int64_t c = c0;
  for (; c + 2 <= c1; c += 2) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block<2, 2, XT, BITS>(p, r, c);
    if (r < r1) block<1, 2, XT, BITS>(p, r, c);
  }
  if (c < c1) {
    int64_t r = r0;
    for (; r + 2 <= r1; r += 2) block<2, 1, XT, BITS>(p, r, c);
    if (r < r1) block<1, 1, XT, BITS>(p, r, c);
  }
}

}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const bool xf = p.x_dtype == DType::f32;
  if (p.w.bits == 4)
    return xf ? typed<float, 4>(p, r0, r1, c0, c1) : typed<bf16, 4>(p, r0, r1, c0, c1);
  return xf ? typed<float, 8>(p, r0, r1, c0, c1) : typed<bf16, 8>(p, r0, r1, c0, c1);
}

}  // namespace shrike::avx2
