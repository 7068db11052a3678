// silu(gate) * up, 8 lanes at a time, for CPUs without AVX-512 (the portable loop's expf per
// element was as slow there as it was before silu_mul_avx512vnni.cpp). exp uses the same range
// reduction and degree-7 polynomial as that file; 2^n is built in the exponent field, where
// n = 128 gives inf as scalef does. The tail is copied into a full vector, so every element takes
// the same steps and a row's result never depends on its width.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/bf16_avx2.h"
#include "fused/fused.h"

namespace shrike::avx2 {

namespace {

inline __m256 exp8(__m256 x) {
  // Below -87.3 exp is under the smallest normal float and adds nothing to 1 + exp; above 89 it is inf.
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(89.f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}

inline __m256 round_to(const float*, __m256 v) { return v; }
inline __m256 round_to(const bf16*, __m256 v) {
  __m256i rounded = _mm256_and_si256(bf16_rounded_bits(v), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  // NaN stays NaN (the increment could carry a NaN's payload into the sign or clear it)
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

template <typename T>
inline __m256 silu_times_up(const T* gate, const T* up, const T* out_type) {
  __m256 g = load8(gate);
  __m256 act = round_to(out_type, _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)))));
  return _mm256_mul_ps(act, load8(up));
}

template <typename T>
void rows_typed(const T* gate_up, T* out, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * width;
    const T* up = gate + width;
    T* o = out + r * width;
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) store8(o + i, silu_times_up(gate + i, up + i, o));
    if (i < width) {
      const int64_t left = width - i;
      T g[8] = {}, u[8] = {}, y[8];
      std::memcpy(g, gate + i, left * sizeof(T));
      std::memcpy(u, up + i, left * sizeof(T));
      store8(y, silu_times_up(g, u, o));
      std::memcpy(o + i, y, left * sizeof(T));
    }
  }
}

}  // namespace

void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype) {
  if (dtype == DType::f32)
    rows_typed(static_cast<const float*>(gate_up), static_cast<float*>(out), rows, width);
  else
    rows_typed(static_cast<const bf16*>(gate_up), static_cast<bf16*>(out), rows, width);
}

}  // namespace shrike::avx2
