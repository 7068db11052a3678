#include <immintrin.h>

#include <cmath>

#include "common/bf16_avx2.h"
#include "norm/rmsnorm.h"

namespace shrike::avx2 {

namespace {
// Round-to-nearest-even to bf16 (inputs here are finite), kept in float lanes.
inline __m256 round_to(__m256 v, const float*) { return v; }
inline __m256 round_to(__m256 v, const bf16*) {
  return _mm256_castsi256_ps(_mm256_and_si256(bf16_rounded_bits(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline float to_f(float v) { return v; }
inline float to_f(bf16 v) { return bf16_to_float(v); }
inline float round_scalar(float v, const float*) { return v; }
inline float round_scalar(float v, const bf16*) { return bf16_to_float(float_to_bf16(v)); }
inline void store1(float* p, float v) { *p = v; }
inline void store1(bf16* p, float v) { *p = float_to_bf16(v); }

template <typename T>
void rmsnorm_typed(const T* x, const T* w, T* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = out + r * dim;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8) {
      __m256 v = load8(xr + i);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    float sum_sq = _mm_cvtss_f32(s);
    for (; i < dim; ++i) sum_sq += to_f(xr[i]) * to_f(xr[i]);
    float inv = 1.f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= dim; i += 8)
      store8(yr + i, _mm256_mul_ps(load8(w + i), round_to(_mm256_mul_ps(load8(xr + i), vinv), xr)));
    for (; i < dim; ++i) store1(yr + i, to_f(w[i]) * round_scalar(to_f(xr[i]) * inv, xr));
  }
}
}  // namespace

void rmsnorm(const void* x, const void* weight, void* out, int64_t rows, int64_t dim, float eps, DType dtype) {
  if (dtype == DType::f32)
    rmsnorm_typed(static_cast<const float*>(x), static_cast<const float*>(weight), static_cast<float*>(out), rows, dim, eps);
  else
    rmsnorm_typed(static_cast<const bf16*>(x), static_cast<const bf16*>(weight), static_cast<bf16*>(out), rows, dim, eps);
}

}  // namespace shrike::avx2
