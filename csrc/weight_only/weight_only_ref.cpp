// Portable reference: dequantize one element at a time, then dense_linear's reduction order.
#include <cmath>
#include <initializer_list>

#include "weight_only/weight_only_kernels.h"

namespace shrike::ref {

namespace {
constexpr int64_t kBlockK = 32;
constexpr int kLanes = 16;

float x_element(const WeightOnlyProblem& p, int64_t i) {
  return p.x_dtype == DType::f32 ? static_cast<const float*>(p.x)[i]
                                 : bf16_to_float(static_cast<const bf16*>(p.x)[i]);
}

float w_element(const WeightOnlyWeight& w, int64_t c, int64_t j) {
  int64_t at = c * w.k + j;
  unsigned u = w.bits == 4 ? (w.q[at / 2] >> (4 * (at & 1))) & 15u : w.q[at];
  int64_t g = weight_only_group(w, c, j);
  return std::fma(static_cast<float>(u), w.scale[g], w.offset[g]);
}

float dot(const WeightOnlyProblem& p, int64_t r, int64_t c) {
  const int64_t k = p.w.k;
  float acc[kLanes] = {};
  for (int64_t b = 0; b < k; b += kBlockK)
    for (int j = 0; j < kLanes; ++j)
      for (int64_t kk : {b + 2 * j + 1, b + 2 * j}) acc[j] = std::fma(x_element(p, r * k + kk), w_element(p.w, c, kk), acc[j]);
  for (int half = kLanes / 2; half >= 1; half /= 2)
    for (int j = 0; j < half; ++j) acc[j] += acc[j + half];
  return acc[0];
}
}  // namespace

void weight_only_block(const WeightOnlyProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) weight_only_store(p, r, c, dot(p, r, c));
}

}  // namespace shrike::ref
