#include <algorithm>
#include <cmath>

#include "common/variants.h"
#include "quant/act_params.h"
#include "quant/act_quant.h"

namespace shrike {

AsymParams asym_params(float row_min, float row_max) {
  const float qmin = -128.f, qmax = 127.f;
  float lo = std::min(0.f, row_min), hi = std::max(0.f, row_max);
  float inv = lo == hi ? 1.f : (qmax - qmin) / (hi - lo);
  float scale = 1.f / inv;
  float lo_scaled = lo * inv, hi_scaled = hi * inv;
  float zero = qmin + lo_scaled + (qmax + hi_scaled) > 0 ? qmin - lo_scaled : qmax - hi_scaled;
  zero = std::min(std::max(zero, qmin), qmax);
  return {inv, scale, static_cast<int32_t>(std::lrintf(zero))};
}

SymParams sym_params(float row_absmax) {
  float scale = row_absmax / 127.f;
  return {scale > 0.f ? 1.f / scale : 0.f, scale};
}

namespace {

struct ActQuantKernels {
  void (*asym_f32)(const float*, int64_t, int64_t, int64_t, const AsymRows&);
  void (*asym_bf16)(const bf16*, int64_t, int64_t, int64_t, const AsymRows&);
  void (*sym_f32)(const float*, int64_t, int64_t, const SymRows&);
  void (*sym_bf16)(const bf16*, int64_t, int64_t, const SymRows&);
};
#define SHRIKE_ACT_QUANT_KERNELS(ns) \
  ActQuantKernels { ns::quantize_asym<float>, ns::quantize_asym<bf16>, ns::quantize_sym<float>, ns::quantize_sym<bf16> }
struct NoCall {};

const Variant<ActQuantKernels, NoCall> kActQuant[] = {
#if defined(SHRIKE_X86)
    {Isa::avx2, SHRIKE_ACT_QUANT_KERNELS(avx2)},
#elif defined(SHRIKE_AARCH64)
    {Isa::sve2, SHRIKE_ACT_QUANT_KERNELS(sve2)},
    {Isa::dotprod, SHRIKE_ACT_QUANT_KERNELS(neon)},
#endif
    {Isa::scalar, SHRIKE_ACT_QUANT_KERNELS(ref)},
};
#undef SHRIKE_ACT_QUANT_KERNELS

const ActQuantKernels& act_quant_kernels() { return pick_variant(kActQuant, NoCall{}).fn; }

}  // namespace

void quantize_asym(const void* x, DType dtype, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  if (dtype == DType::f32) return act_quant_kernels().asym_f32(static_cast<const float*>(x), rows, k, group, out);
  act_quant_kernels().asym_bf16(static_cast<const bf16*>(x), rows, k, group, out);
}

void quantize_sym(const void* x, DType dtype, int64_t rows, int64_t k, const SymRows& out) {
  if (dtype == DType::f32) return act_quant_kernels().sym_f32(static_cast<const float*>(x), rows, k, out);
  act_quant_kernels().sym_bf16(static_cast<const bf16*>(x), rows, k, out);
}

OpVariants act_quant_variants() { return describe_variants("activation_quant", kActQuant); }

}  // namespace shrike
