#include <arm_sve.h>

#include "common/bf16.h"
#include "quant/act_params.h"
#include "quant/act_quant.h"

namespace shrike::sve2 {

namespace {
inline svfloat32_t load(svbool_t pg, const float* p) { return svld1_f32(pg, p); }
inline svfloat32_t load(svbool_t pg, const bf16* p) {
  return svreinterpret_f32_u32(svlsl_n_u32_x(pg, svld1uh_u32(pg, p), 16));
}

inline float first(const float* p) { return *p; }
inline float first(const bf16* p) { return bf16_to_float(*p); }
}  // namespace

template <typename T>
void quantize_asym(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out) {
  const int64_t step = svcntw();
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    svfloat32_t vmin = svdup_n_f32(first(xr)), vmax = vmin;
    for (int64_t i = 0; i < k; i += step) {
      svbool_t pg = svwhilelt_b32(i, k);
      svfloat32_t v = load(pg, xr + i);
      vmin = svmin_f32_m(pg, vmin, v);
      vmax = svmax_f32_m(pg, vmax, v);
    }
    AsymParams p = asym_params(svminv_f32(svptrue_b32(), vmin), svmaxv_f32(svptrue_b32(), vmax));
    out.scale[r] = p.scale;
    out.zero[r] = p.zero;
    int8_t* q = out.q + r * k;
    for (int64_t g = 0; g < k / group; ++g) {
      int64_t sum = 0;
      for (int64_t i = g * group; i < (g + 1) * group; i += step) {
        svbool_t pg = svwhilelt_b32(i, (g + 1) * group);
        // rinta rounds half away from zero, like std::round.
        svfloat32_t v = svrinta_f32_x(pg, svmul_n_f32_x(pg, load(pg, xr + i), p.inv));
        svint32_t qi = svadd_n_s32_x(pg, svcvt_s32_f32_x(pg, v), p.zero);
        qi = svmin_n_s32_x(pg, svmax_n_s32_x(pg, qi, -128), 127);
        svst1b_s32(pg, q + i, qi);
        sum += svaddv_s32(pg, qi);
      }
      out.group_sum[r * (k / group) + g] = static_cast<int32_t>(sum);
    }
  }
}

template <typename T>
void quantize_sym(const T* x, int64_t rows, int64_t k, const SymRows& out) {
  const int64_t step = svcntw();
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * k;
    svfloat32_t amax = svdup_n_f32(0.f);
    for (int64_t i = 0; i < k; i += step) {
      svbool_t pg = svwhilelt_b32(i, k);
      amax = svmax_f32_m(pg, amax, svabs_f32_x(pg, load(pg, xr + i)));
    }
    SymParams p = sym_params(svmaxv_f32(svptrue_b32(), amax));
    out.scale[r] = p.scale;
    for (int64_t i = 0; i < k; i += step) {
      svbool_t pg = svwhilelt_b32(i, k);
      // rintn rounds half to even.
      svfloat32_t v = svrintn_f32_x(pg, svmul_n_f32_x(pg, load(pg, xr + i), p.inv));
      svint32_t qi = svmin_n_s32_x(pg, svmax_n_s32_x(pg, svcvt_s32_f32_x(pg, v), -127), 127);
      svst1b_s32(pg, out.q + r * k + i, qi);
    }
  }
}

SHRIKE_INSTANTIATE_ACT_QUANT

}  // namespace shrike::sve2
