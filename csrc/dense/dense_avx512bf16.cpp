// AVX-512: one zmm holds a block's 16 accumulator lanes (dense_kernels.h). bf16 activations x
// bf16 weights use vdpbf16ps, which adds x[2j+1]*w[2j+1] then x[2j]*w[2j] into lane j with exact
// products and one rounding per add, i.e. the reference order in one instruction. Any fp32 operand
// goes through widening + FMA instead: converting fp32 activations to bf16 for vdpbf16ps would round
// them to 8 significant bits, and a GEMV reads weights at the memory bound either way.
// vdpbf16ps treats denormal inputs and results as zero; with bf16 values of ordinary size (products
// above ~1e-38) it gives the reference's bits.
#include <immintrin.h>

#include "dense/dense_kernels.h"

namespace shrike::avx512bf16 {

namespace {

struct Pairs {
  __m512 odd, even;
};

inline Pairs to_pairs(__m512i v) {
  return {_mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))),
          _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))};
}

inline Pairs load_pairs(const bf16* p, __mmask32 valid) { return to_pairs(_mm512_maskz_loadu_epi16(valid, p)); }

inline Pairs load_pairs(const float* p, __mmask32 valid) {
  __m512 a = _mm512_maskz_loadu_ps(static_cast<__mmask16>(valid), p);
  __m512 b = _mm512_maskz_loadu_ps(static_cast<__mmask16>(valid >> 16), p + 16);
  const __m512i odd_idx = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i even_idx = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return {_mm512_permutex2var_ps(a, odd_idx, b), _mm512_permutex2var_ps(a, even_idx, b)};
}

// Lane j += lane j + 8, + 4, + 2, + 1.
inline float reduce16(__m512 v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

constexpr __mmask32 kAll = ~__mmask32(0);

// step(b, valid) for every block of K: full blocks with a constant mask, then the partial one.
template <typename Step>
inline void for_blocks(int64_t k, Step step) {
  int64_t full = k / kDenseBlockK * kDenseBlockK;
  for (int64_t b = 0; b < full; b += kDenseBlockK) step(b, kAll);
  if (full < k) step(full, static_cast<__mmask32>((1u << (k - full)) - 1));
}

// Widening + FMA for any operand types; RB rows x CB outputs, one accumulator each.
template <int RB, int CB, typename XT, typename WT>
void block_fma(const DenseProblem& p, int64_t r0, int64_t c0) {
  const XT* x = static_cast<const XT*>(p.x) + r0 * p.k;
  const WT* w = static_cast<const WT*>(p.w) + c0 * p.k;
  __m512 acc[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_setzero_ps();
  auto step = [&](int64_t b, __mmask32 valid) {
    Pairs xp[RB];
    SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_pairs(x + r * p.k + b, valid);
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      Pairs wp = load_pairs(w + c * p.k + b, valid);
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
        acc[r][c] = _mm512_fmadd_ps(xp[r].odd, wp.odd, acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xp[r].even, wp.even, acc[r][c]);
      }
    }
  };
  for_blocks(p.k, step);
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) dense_store(p, r0 + r, c0 + c, reduce16(acc[r][c]));
}

// bf16 x bf16 with vdpbf16ps.
template <int RB, int CB>
void block_dp(const DenseProblem& p, int64_t r0, int64_t c0) {
  const bf16* x = static_cast<const bf16*>(p.x) + r0 * p.k;
  const bf16* w = static_cast<const bf16*>(p.w) + c0 * p.k;
  __m512 acc[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) acc[r][c] = _mm512_setzero_ps();
  auto step = [&](int64_t b, __mmask32 valid) {
    __m512bh xv[RB];
    SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xv[r] = (__m512bh)_mm512_maskz_loadu_epi16(valid, x + r * p.k + b);
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
      __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(valid, w + c * p.k + b);
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv);
    }
  };
  for_blocks(p.k, step);
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) dense_store(p, r0 + r, c0 + c, reduce16(acc[r][c]));
}

template <int RB, int CB, typename XT, typename WT>
void block(const DenseProblem& p, int64_t r0, int64_t c0) {
  if constexpr (sizeof(XT) == 2 && sizeof(WT) == 2)
    block_dp<RB, CB>(p, r0, c0);
  else
    block_fma<RB, CB, XT, WT>(p, r0, c0);
}

}  // namespace

void dense_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  with_dtypes(p, [&](auto x, auto w) {
    walk_4x4(r0, r1, c0, c1, [&](auto rows, auto cols, int64_t r, int64_t c) {
      block<decltype(rows)::value, decltype(cols)::value, decltype(x), decltype(w)>(p, r, c);
    });
  });
}

}  // namespace shrike::avx512bf16
