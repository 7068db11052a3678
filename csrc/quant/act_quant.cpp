#include <algorithm>
#include <cmath>

#include "common/isa.h"
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

template <typename T>
void quantize_asym_rows(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  switch (active_isa()) {
#if defined(SHRIKE_X86)
    case Isa::avx2:
    case Isa::avxvnni:
    case Isa::avx512vnni:
    case Isa::avx512bf16:
    case Isa::amx: return avx2::quantize_asym(x, rows, k, group, out);
#elif defined(SHRIKE_AARCH64)
    case Isa::dotprod:
    case Isa::i8mm: return neon::quantize_asym(x, rows, k, group, out);
    case Isa::sve2: return sve2::quantize_asym(x, rows, k, group, out);
#endif
    default: return ref::quantize_asym(x, rows, k, group, out);
  }
}

template <typename T>
void quantize_sym_rows(const T* x, int64_t rows, int64_t k, const SymRows& out) {
  switch (active_isa()) {
#if defined(SHRIKE_X86)
    case Isa::avx2:
    case Isa::avxvnni:
    case Isa::avx512vnni:
    case Isa::avx512bf16:
    case Isa::amx: return avx2::quantize_sym(x, rows, k, out);
#elif defined(SHRIKE_AARCH64)
    case Isa::dotprod:
    case Isa::i8mm: return neon::quantize_sym(x, rows, k, out);
    case Isa::sve2: return sve2::quantize_sym(x, rows, k, out);
#endif
    default: return ref::quantize_sym(x, rows, k, out);
  }
}

}  // namespace

void quantize_asym(const void* x, DType dtype, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  if (dtype == DType::f32) return quantize_asym_rows(static_cast<const float*>(x), rows, k, group, out);
  quantize_asym_rows(static_cast<const bf16*>(x), rows, k, group, out);
}

void quantize_sym(const void* x, DType dtype, int64_t rows, int64_t k, const SymRows& out) {
  if (dtype == DType::f32) return quantize_sym_rows(static_cast<const float*>(x), rows, k, out);
  quantize_sym_rows(static_cast<const bf16*>(x), rows, k, out);
}

}  // namespace shrike
