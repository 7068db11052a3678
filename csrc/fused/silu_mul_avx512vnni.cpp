// silu(gate) * up, 16 lanes at a time. The portable loop in fused.cpp calls libm's expf per element,
// which made silu*up a tenth of a W4A8 prefill; here exp comes from a range reduction to
// |r| <= ln2 / 2 and a degree-7 polynomial (error below 1e-8 relative before rounding), so results
// may differ from the portable loop in the last float bit (bf16: one ulp, rarely). Every element,
// the tail included, takes the same vector steps, so a row's result never depends on its neighbours.
#include <immintrin.h>

#include "common/bf16.h"
#include "fused/fused.h"

namespace shrike::avx512vnni {

namespace {

inline __m512 exp16(__m512 x) {
  // Past these bounds expf is 0 (denormals aside) or inf already; clamping keeps n within scalef's range.
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(89.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 in two parts; n * high is exact for |n| < 256.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const bf16* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The top 16 bits of each lane are the bf16 of float_to_bf16 (round to nearest even; NaN kept NaN).
inline __m512i bf16_bits(__m512 v) {
  __m512i b = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, b, _mm512_set1_epi32(0x400000));
}

inline __m512 round_to(const float*, __m512 v) { return v; }
inline __m512 round_to(const bf16*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_bits(v), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

inline void store16(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
inline void store16(bf16* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits(v), 16)));
}

template <typename T>
void rows_typed(const T* gate_up, T* out, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = gate_up + r * 2 * width;
    const T* up = gate + width;
    T* o = out + r * width;
    for (int64_t i = 0; i < width; i += 16) {
      const __mmask16 m = width - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (width - i)) - 1);
      __m512 g = load16(gate + i, m);
      __m512 act = round_to(o, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
      store16(o + i, m, _mm512_mul_ps(act, load16(up + i, m)));
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

}  // namespace shrike::avx512vnni
