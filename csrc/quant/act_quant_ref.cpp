#include <algorithm>
#include <cmath>

#include "common/bf16.h"
#include "quant/act_params.h"
#include "quant/act_quant.h"

namespace shrike::ref {

namespace {
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }
}  // namespace

template <typename T>
void quantize_asym(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    float lo = load(xr, 0), hi = lo;
    for (int64_t i = 1; i < k; ++i) {
      lo = std::min(lo, load(xr, i));
      hi = std::max(hi, load(xr, i));
    }
    AsymParams p = asym_params(lo, hi);
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    int8_t* q = out.q + r * k;
    for (int64_t g = 0; g < k / group; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        int32_t v = static_cast<int32_t>(std::round(load(xr, i) * p.inv)) + p.zero;
        q[i] = static_cast<int8_t>(std::min(std::max(v, -128), 127));
        sum += q[i];
      }
      out.group_sum[r * (k / group) + g] = sum;
    }
  }
}

template <typename T>
void quantize_sym(const T* x, int64_t rows, int64_t k, const SymRows& out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    float amax = 0.f;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(load(xr, i)));
    SymParams p = sym_params(amax);
    out.scale[r] = p.scale;
    for (int64_t i = 0; i < k; ++i) {
      float v = std::nearbyint(load(xr, i) * p.inv);
      out.q[r * k + i] = static_cast<int8_t>(std::min(std::max(v, -127.f), 127.f));
    }
  }
}

SHRIKE_INSTANTIATE_ACT_QUANT

}  // namespace shrike::ref
