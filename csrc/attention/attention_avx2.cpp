// AVX2+FMA inner loops of the attention walk (attention_tiles.h); head_dim % 8 == 0.
#include <immintrin.h>

#include "attention/attention_tiles.h"
#include "common/bf16_avx2.h"

namespace shrike::avx2 {
namespace {

inline float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

// Lane u of the result is the sum of the lanes of a[u].
inline __m256 transpose_sum8(const __m256* a) {
  __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);  // 128-bit halves still split
  return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-5 polynomial), ~1 ulp.
// Inputs below -87.3 give ~1e-38 instead of a denormal or 0, which the softmax cannot tell apart.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

// acc[0 .. 8*NV) = acc * rescale + sum_j p[j] * v_j[0 .. 8*NV), the accumulators held in registers.
template <int NV>
inline void accumulate_slice(float* acc, __m256 rescale, const float* p, const float* v, int64_t v_stride, int64_t n) {
  __m256 a[NV];
  for (int u = 0; u < NV; ++u) a[u] = _mm256_mul_ps(load8(acc + 8 * u), rescale);
  for (int64_t j = 0; j < n; ++j) {
    __m256 pj = _mm256_broadcast_ss(p + j);
    const float* vj = v + j * v_stride;
    for (int u = 0; u < NV; ++u) a[u] = _mm256_fmadd_ps(pj, load8(vj + 8 * u), a[u]);
  }
  for (int u = 0; u < NV; ++u) store8(acc + 8 * u, a[u]);
}

struct Avx2Vec {
  template <class T>
  static void load_scaled(const T* src, float scale, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 8) store8(dst + i, _mm256_mul_ps(load8(src + i), _mm256_set1_ps(scale)));
  }
  static void to_float(const bf16* src, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 8) store8(dst + i, load8(src + i));
  }
  static void to_float(const int8_t* row, float* dst, int64_t d) {
    const __m256 scale = _mm256_set1_ps(kv_int8_scale(row, d));
    for (int64_t i = 0; i < d; i += 8) {
      __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i)));
      store8(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
    }
  }
  static void query_key_scores(const float* q, const float* k, int64_t k_stride, int64_t n, int64_t d, float* scores) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {  // eight keys at once: one query load feeds eight FMAs
      __m256 a[8];
      for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) {
        __m256 qv = load8(q + i);
        for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(qv, load8(k + (j + u) * k_stride + i), a[u]);
      }
      store8(scores + j, transpose_sum8(a));
    }
    for (; j < n; ++j) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) a = _mm256_fmadd_ps(load8(q + i), load8(k + j * k_stride + i), a);
      scores[j] = horizontal_sum(a);
    }
  }
  static float exp_shifted(float* p, int64_t n, float shift) {
    __m256 vshift = _mm256_set1_ps(shift), sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256 e = exp_nonpositive(_mm256_sub_ps(load8(p + j), vshift));
      store8(p + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    float rest = 0.f;
    if (j < n) {  // tail through a padded buffer, so every p comes from the same polynomial
      alignas(32) float tail[8];
      for (int t = 0; t < 8; ++t) tail[t] = j + t < n ? p[j + t] : shift;
      store8(tail, exp_nonpositive(_mm256_sub_ps(load8(tail), vshift)));
      for (int64_t t = j; t < n; ++t) rest += (p[t] = tail[t - j]);
    }
    return horizontal_sum(sum) + rest;
  }
  static void rescale_accumulate(float* acc, float rescale, const float* p, const float* v, int64_t v_stride, int64_t n,
                                 int64_t d) {
    __m256 r = _mm256_set1_ps(rescale);
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) accumulate_slice<8>(acc + i, r, p, v + i, v_stride, n);
    if (i + 32 <= d) accumulate_slice<4>(acc + i, r, p, v + i, v_stride, n), i += 32;
    if (i + 16 <= d) accumulate_slice<2>(acc + i, r, p, v + i, v_stride, n), i += 16;
    if (i < d) accumulate_slice<1>(acc + i, r, p, v + i, v_stride, n);
  }
  template <class T>
  static void store_scaled(const float* acc, float factor, T* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 8) store8(dst + i, _mm256_mul_ps(load8(acc + i), _mm256_set1_ps(factor)));
  }
};

}  // namespace

void attend(const PagedAttentionArgs& args, const AttentionWorkItem& item, float* scratch) {
  attention_detail::attend<Avx2Vec>(args, item, scratch);
}

}  // namespace shrike::avx2
