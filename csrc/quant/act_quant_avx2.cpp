#include <immintrin.h>

#include "common/bf16_avx2.h"
#include "common/lanes_avx2.h"
#include "quant/act_params.h"
#include "quant/act_quant.h"

namespace shrike::avx2 {

namespace {

// std::round (half away from zero) exactly: trunc(v) + trunc(2 * (v - trunc(v))); every step is
// exact, unlike floor(v + 0.5), which rounds 0.49999997 up.
inline __m256 round_half_away(__m256 v) {
  __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256 frac2 = _mm256_add_ps(_mm256_sub_ps(v, t), _mm256_sub_ps(v, t));
  return _mm256_add_ps(t, _mm256_round_ps(frac2, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
}

// 16 int32 -> 16 int8 with saturation, in order.
inline __m128i pack16(__m256i a, __m256i b) {
  __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
  return _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
}

inline int32_t sum_bytes(const int8_t* q, int64_t n) {
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i acc = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), bias);
    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, _mm256_setzero_si256()));
  }
  __m128i s = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  int64_t total = _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1) - 128 * i;
  for (; i < n; ++i) total += q[i];
  return static_cast<int32_t>(total);
}
}  // namespace

template <typename T>
void quantize_asym(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    __m256 lo = load8(xr), hi = lo;
    for (int64_t i = 8; i < k; i += 8) {
      lo = _mm256_min_ps(lo, load8(xr + i));
      hi = _mm256_max_ps(hi, load8(xr + i));
    }
    AsymParams p = asym_params(hmin(lo), hmax(hi));
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    const __m256 inv = _mm256_set1_ps(p.inv);
    const __m256i zero = _mm256_set1_epi32(p.zero);
    int8_t* q = out.q + r * k;
    for (int64_t i = 0; i < k; i += 16) {
      __m256i a = _mm256_add_epi32(_mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(load8(xr + i), inv))), zero);
      __m256i b = _mm256_add_epi32(_mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(load8(xr + i + 8), inv))), zero);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), pack16(a, b));
    }
    for (int64_t g = 0; g < k / group; ++g) out.group_sum[r * (k / group) + g] = sum_bytes(q + g * group, group);
  }
}

template <typename T>
void quantize_sym(const T* x, int64_t rows, int64_t k, const SymRows& out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i qmax = _mm256_set1_epi32(127), qmin = _mm256_set1_epi32(-127);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, load8(xr + i)));
    SymParams p = sym_params(hmax(amax));
    out.scale[r] = p.scale;
    const __m256 inv = _mm256_set1_ps(p.inv);
    for (int64_t i = 0; i < k; i += 16) {
      __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(load8(xr + i), inv));  // rounds half to even
      __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(load8(xr + i + 8), inv));
      a = _mm256_max_epi32(_mm256_min_epi32(a, qmax), qmin);
      b = _mm256_max_epi32(_mm256_min_epi32(b, qmax), qmin);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q + r * k + i), pack16(a, b));
    }
  }
}

SHRIKE_INSTANTIATE_ACT_QUANT

}  // namespace shrike::avx2
