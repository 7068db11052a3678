// NEON activation quantization; also used by the i8mm variant (its CPUs all have NEON).
#include <arm_neon.h>

#include "common/bf16_neon.h"
#include "quant/act_params.h"
#include "quant/act_quant.h"

namespace shrike::neon {

namespace {
inline int8x8_t narrow8(int32x4_t a, int32x4_t b) { return vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))); }
}  // namespace

template <typename T>
void quantize_asym(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    float32x4_t lo = load4(xr), hi = lo;
    for (int64_t i = 4; i < k; i += 4) {
      lo = vminq_f32(lo, load4(xr + i));
      hi = vmaxq_f32(hi, load4(xr + i));
    }
    AsymParams p = asym_params(vminvq_f32(lo), vmaxvq_f32(hi));
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    const int32x4_t zero = vdupq_n_s32(p.zero);
    int8_t* q = out.q + r * k;
    for (int64_t g = 0; g < k / group; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * group; i < (g + 1) * group; i += 8) {
        // vcvta rounds half away from zero, like std::round.
        int32x4_t a = vaddq_s32(vcvtaq_s32_f32(vmulq_n_f32(load4(xr + i), p.inv)), zero);
        int32x4_t b = vaddq_s32(vcvtaq_s32_f32(vmulq_n_f32(load4(xr + i + 4), p.inv)), zero);
        int8x8_t packed = narrow8(a, b);
        vst1_s8(q + i, packed);
        sum += vaddlv_s8(packed);
      }
      out.group_sum[r * (k / group) + g] = sum;
    }
  }
}

template <typename T>
void quantize_sym(const T* x, int64_t rows, int64_t k, const SymRows& out) {
  const int32x4_t qmax = vdupq_n_s32(127), qmin = vdupq_n_s32(-127);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    float32x4_t amax = vdupq_n_f32(0.f);
    for (int64_t i = 0; i < k; i += 4) amax = vmaxq_f32(amax, vabsq_f32(load4(xr + i)));
    SymParams p = sym_params(vmaxvq_f32(amax));
    out.scale[r] = p.scale;
    for (int64_t i = 0; i < k; i += 8) {
      // vcvtn rounds half to even.
      int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(load4(xr + i), p.inv));
      int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(load4(xr + i + 4), p.inv));
      a = vmaxq_s32(vminq_s32(a, qmax), qmin);
      b = vmaxq_s32(vminq_s32(b, qmax), qmin);
      vst1_s8(out.q + r * k + i, narrow8(a, b));
    }
  }
}

SHRIKE_INSTANTIATE_ACT_QUANT

}  // namespace shrike::neon
