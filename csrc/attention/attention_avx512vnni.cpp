// AVX-512 (F/BW/VL/DQ) inner loops of the attention walk (attention_tiles.h); head_dim % 16 == 0.
// Same algorithm as attention_avx2.cpp at twice the width; tails of the exp use masks.
#include <immintrin.h>

#include "attention/attention_tiles.h"
#include "attention/exp_avx512.h"
#include "common/bf16_avx512.h"

namespace shrike::avx512vnni {
namespace {

using avx512::load16;
using avx512::store16;

// Lane u of the result is the sum of the lanes of a[u], for 8 vectors.
inline __m256 transpose_sum8(const __m512* a) {
  __m256 h[8];
  for (int u = 0; u < 8; ++u) h[u] = _mm256_add_ps(_mm512_castps512_ps256(a[u]), _mm512_extractf32x8_ps(a[u], 1));
  __m256 s01 = _mm256_hadd_ps(h[0], h[1]), s23 = _mm256_hadd_ps(h[2], h[3]);
  __m256 s45 = _mm256_hadd_ps(h[4], h[5]), s67 = _mm256_hadd_ps(h[6], h[7]);
  __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// acc[0 .. 16*NV) = acc * rescale + sum_j p[j] * v_j[0 .. 16*NV), the accumulators held in registers.
template <int NV>
inline void accumulate_slice(float* acc, __m512 rescale, const float* p, const float* v, int64_t v_stride, int64_t n) {
  __m512 a[NV];
  for (int u = 0; u < NV; ++u) a[u] = _mm512_mul_ps(load16(acc + 16 * u), rescale);
  for (int64_t j = 0; j < n; ++j) {
    __m512 pj = _mm512_set1_ps(p[j]);
    const float* vj = v + j * v_stride;
    for (int u = 0; u < NV; ++u) a[u] = _mm512_fmadd_ps(pj, load16(vj + 16 * u), a[u]);
  }
  for (int u = 0; u < NV; ++u) store16(acc + 16 * u, a[u]);
}

struct Avx512Vec {
  template <class T>
  static void load_scaled(const T* src, float scale, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 16) store16(dst + i, _mm512_mul_ps(load16(src + i), _mm512_set1_ps(scale)));
  }
  static void to_float(const bf16* src, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 16) store16(dst + i, load16(src + i));
  }
  static void to_float(const int8_t* row, float* dst, int64_t d) {
    const __m512 scale = _mm512_set1_ps(kv_int8_scale(row, d));
    for (int64_t i = 0; i < d; i += 16) {
      __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
      store16(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
    }
  }
  static void query_key_scores(const float* q, const float* k, int64_t k_stride, int64_t n, int64_t d, float* scores) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {  // eight keys at once: one query load feeds eight FMAs
      __m512 a[8];
      for (int u = 0; u < 8; ++u) a[u] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        __m512 qv = load16(q + i);
        for (int u = 0; u < 8; ++u) a[u] = _mm512_fmadd_ps(qv, load16(k + (j + u) * k_stride + i), a[u]);
      }
      _mm256_storeu_ps(scores + j, transpose_sum8(a));
    }
    for (; j < n; ++j) {
      __m512 a = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) a = _mm512_fmadd_ps(load16(q + i), load16(k + j * k_stride + i), a);
      scores[j] = _mm512_reduce_add_ps(a);
    }
  }
  static float exp_shifted(float* p, int64_t n, float shift) {
    const __m512 vshift = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 lanes = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
      __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_mask_loadu_ps(vshift, lanes, p + j), vshift));
      _mm512_mask_storeu_ps(p + j, lanes, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(lanes, e));
    }
    return _mm512_reduce_add_ps(sum);
  }
  static void rescale_accumulate(float* acc, float rescale, const float* p, const float* v, int64_t v_stride, int64_t n,
                                 int64_t d) {
    const __m512 r = _mm512_set1_ps(rescale);
    int64_t i = 0;
    for (; i + 128 <= d; i += 128) accumulate_slice<8>(acc + i, r, p, v + i, v_stride, n);
    if (i + 64 <= d) accumulate_slice<4>(acc + i, r, p, v + i, v_stride, n), i += 64;
    if (i + 32 <= d) accumulate_slice<2>(acc + i, r, p, v + i, v_stride, n), i += 32;
    if (i < d) accumulate_slice<1>(acc + i, r, p, v + i, v_stride, n);
  }
  template <class T>
  static void store_scaled(const float* acc, float factor, T* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 16) store16(dst + i, _mm512_mul_ps(load16(acc + i), _mm512_set1_ps(factor)));
  }
};

}  // namespace

void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch) {
  attention_detail::attend<Avx512Vec>(args, item, scratch);
}

}  // namespace shrike::avx512vnni
