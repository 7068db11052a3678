// aarch64 inner loops of the attention walk (attention_tiles.h) in plain NEON float code, shared
// by the dotprod variant and the sve2 variant (which replaces the int8 dequantization);
// head_dim % 4 == 0. Include only from aarch64 ISA files: internal linkage, as bf16_neon.h.
#pragma once
#include <arm_neon.h>

#include "attention/attention_tiles.h"
#include "common/bf16_neon.h"

namespace shrike::neon_attention {
namespace {

using neon::load4;
using neon::store4;

// Lane u of the result is the sum of the lanes of a[u].
inline float32x4_t transpose_sum4(const float32x4_t* a) {
  return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-5 polynomial), ~1 ulp.
// Inputs below -87.3 give ~1e-38 instead of a denormal or 0, which the softmax cannot tell apart.
inline float32x4_t exp_nonpositive(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
  float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  x = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  x = vfmsq_f32(x, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t y = vdupq_n_f32(1.9875691500e-4f);
  y = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), y, x);
  y = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), y, x);
  y = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), y, x);
  y = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), y, x);
  y = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), y, x);
  y = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.f)), y, vmulq_f32(x, x));
  int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(y, vreinterpretq_f32_s32(pow2n));
}

// acc[0 .. 4*NV) = acc * rescale + sum_j p[j] * v_j[0 .. 4*NV), the accumulators held in registers.
template <int NV>
inline void accumulate_slice(float* acc, float rescale, const float* p, const float* v, int64_t v_stride, int64_t n) {
  float32x4_t a[NV];
  for (int u = 0; u < NV; ++u) a[u] = vmulq_n_f32(load4(acc + 4 * u), rescale);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * v_stride;
    for (int u = 0; u < NV; ++u) a[u] = vfmaq_n_f32(a[u], load4(vj + 4 * u), p[j]);
  }
  for (int u = 0; u < NV; ++u) store4(acc + 4 * u, a[u]);
}

struct NeonVec {
  template <class T>
  static void load_scaled(const T* src, float scale, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 4) store4(dst + i, vmulq_n_f32(load4(src + i), scale));
  }
  static void to_float(const bf16* src, float* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 4) store4(dst + i, load4(src + i));
  }
  static void to_float(const int8_t* row, float* dst, int64_t d) {
    const float scale = kv_int8_scale(row, d);
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
      int16x8_t q = vmovl_s8(vld1_s8(row + i));
      store4(dst + i, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), scale));
      store4(dst + i + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q))), scale));
    }
    for (; i < d; ++i) dst[i] = static_cast<float>(row[i]) * scale;
  }
  static void query_key_scores(const float* q, const float* k, int64_t k_stride, int64_t n, int64_t d, float* scores) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {  // eight keys at once: one query load feeds eight FMAs
      float32x4_t a[8];
      for (int u = 0; u < 8; ++u) a[u] = vdupq_n_f32(0.f);
      for (int64_t i = 0; i < d; i += 4) {
        float32x4_t qv = load4(q + i);
        for (int u = 0; u < 8; ++u) a[u] = vfmaq_f32(a[u], qv, load4(k + (j + u) * k_stride + i));
      }
      store4(scores + j, transpose_sum4(a));
      store4(scores + j + 4, transpose_sum4(a + 4));
    }
    for (; j < n; ++j) {
      float32x4_t a = vdupq_n_f32(0.f);
      for (int64_t i = 0; i < d; i += 4) a = vfmaq_f32(a, load4(q + i), load4(k + j * k_stride + i));
      scores[j] = vaddvq_f32(a);
    }
  }
  static float exp_shifted(float* p, int64_t n, float shift) {
    float32x4_t vshift = vdupq_n_f32(shift), sum = vdupq_n_f32(0.f);
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      float32x4_t e = exp_nonpositive(vsubq_f32(load4(p + j), vshift));
      store4(p + j, e);
      sum = vaddq_f32(sum, e);
    }
    float rest = 0.f;
    if (j < n) {  // tail through a padded buffer, so every p comes from the same polynomial
      float tail[4];
      for (int t = 0; t < 4; ++t) tail[t] = j + t < n ? p[j + t] : shift;
      store4(tail, exp_nonpositive(vsubq_f32(load4(tail), vshift)));
      for (int64_t t = j; t < n; ++t) rest += (p[t] = tail[t - j]);
    }
    return vaddvq_f32(sum) + rest;
  }
  static void rescale_accumulate(float* acc, float rescale, const float* p, const float* v, int64_t v_stride, int64_t n,
                                 int64_t d) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) accumulate_slice<16>(acc + i, rescale, p, v + i, v_stride, n);
    if (i + 32 <= d) accumulate_slice<8>(acc + i, rescale, p, v + i, v_stride, n), i += 32;
    if (i + 16 <= d) accumulate_slice<4>(acc + i, rescale, p, v + i, v_stride, n), i += 16;
    if (i + 8 <= d) accumulate_slice<2>(acc + i, rescale, p, v + i, v_stride, n), i += 8;
    if (i < d) accumulate_slice<1>(acc + i, rescale, p, v + i, v_stride, n);
  }
  template <class T>
  static void store_scaled(const float* acc, float factor, T* dst, int64_t d) {
    for (int64_t i = 0; i < d; i += 4) store4(dst + i, vmulq_n_f32(load4(acc + i), factor));
  }
};

}  // namespace
}  // namespace shrike::neon_attention
