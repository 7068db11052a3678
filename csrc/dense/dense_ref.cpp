// Portable reference: the reduction order of dense_kernels.h written out element by element.
#include <cmath>
#include <initializer_list>

#include "dense/dense_kernels.h"

namespace shrike::ref {

namespace {
float element(const void* base, DType dt, int64_t i) {
  return dt == DType::f32 ? static_cast<const float*>(base)[i] : bf16_to_float(static_cast<const bf16*>(base)[i]);
}

float dot(const DenseProblem& p, int64_t r, int64_t c) {
  float acc[kDenseLanes] = {};
  for (int64_t b = 0; b < p.k; b += kDenseBlockK) {
    for (int j = 0; j < kDenseLanes; ++j) {
      for (int64_t kk : {b + 2 * j + 1, b + 2 * j}) {
        bool pad = kk >= p.k;
        float xv = pad ? 0.f : element(p.x, p.x_dtype, r * p.k + kk);
        float wv = pad ? 0.f : element(p.w, p.w_dtype, c * p.k + kk);
        acc[j] = std::fma(xv, wv, acc[j]);
      }
    }
  }
  for (int half = kDenseLanes / 2; half >= 1; half /= 2)
    for (int j = 0; j < half; ++j) acc[j] += acc[j + half];
  return acc[0];
}
}  // namespace

void dense_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) dense_store(p, r, c, dot(p, r, c));
}

}  // namespace shrike::ref
