// What the weight_only_linear dispatcher (weight_only.cpp) hands to each ISA variant. Every
// variant dequantizes W as weight_only.h says and reduces over K in dense_linear's order
// (dense/dense_kernels.h): 16 lanes, blocks of 32, pair 2j+1 then 2j, lanes summed pairwise.
#pragma once
#include <cstdint>

#include "common/bf16.h"
#include "common/dtype.h"
#include "common/register_blocks.h"
#include "weight_only/weight_only.h"

namespace shrike {

struct WeightOnlyProblem {
  const void* x;  // (m, k), columns already in W's order
  DType x_dtype;
  WeightOnlyWeight w;
  const float* bias;  // (n,) or null
  void* out;  // (m, n)
  DType out_dtype;
  int64_t m;
};

// Each variant computes rows [r0, r1) x outputs [c0, c1).
#define SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK \
  void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1);

namespace ref { SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK }
namespace avx2 { SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK }
namespace avx512vnni { SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK }
namespace dotprod { SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK }

#undef SHRIKE_DECLARE_WEIGHT_ONLY_BLOCK

namespace {
// Internal linkage: each ISA translation unit keeps its own copy.
inline void weight_only_store(const WeightOnlyProblem& p, int64_t r, int64_t c, float sum) {
  float y = p.bias ? sum + p.bias[c] : sum;
  if (p.out_dtype == DType::f32)
    static_cast<float*>(p.out)[r * p.w.n + c] = y;
  else
    static_cast<bf16*>(p.out)[r * p.w.n + c] = float_to_bf16(y);
}

// The call's activation type and weight bits as values: typed(XT{}, BlockCount<BITS>{}).
template <typename Typed>
inline void with_weight_only_types(const WeightOnlyProblem& p, Typed typed) {
  const bool xf = p.x_dtype == DType::f32;
  if (p.w.bits == 4) return xf ? typed(float{}, BlockCount<4>{}) : typed(bf16{}, BlockCount<4>{});
  return xf ? typed(float{}, BlockCount<8>{}) : typed(bf16{}, BlockCount<8>{});
}

// Index of the (scale, offset) pair of output c for the K block starting at b.
inline int64_t weight_only_group(const WeightOnlyWeight& w, int64_t c, int64_t b) {
  return c * (w.k / w.group) + b / w.group;
}
}  // namespace

}  // namespace shrike
