// Portable reference of the tile order (dense_kernels.h): one tdpbf16ps step per 32 K, written
// with common/amx_bf16_order.h, reading the weight in either layout.
#include "common/amx_bf16_order.h"
#include "dense/dense_kernels.h"
#include "dense/dense_tiles.h"

namespace shrike::ref {

namespace {
float weight_at(const DenseProblem& p, int64_t c, int64_t j) {
  const bf16* w = static_cast<const bf16*>(p.w);
  if (p.w_layout == DenseLayout::rows) return bf16_to_float(w[c * p.k + j]);
  const int64_t panel_elements = kDensePanelCols * dense_tiles_k(p.k);
  return bf16_to_float(w[(c / kDensePanelCols) * panel_elements + (j / 2) * 2 * kDensePanelCols +
                         (c % kDensePanelCols) * 2 + j % 2]);
}

float dot(const DenseProblem& p, int64_t r, int64_t c) {
  const bf16* x = static_cast<const bf16*>(p.x) + r * p.k;
  float acc = 0.f;
  for (int64_t t = 0; t < p.k; t += kDenseTileK) {
    float a[kDenseTileK] = {}, b[kDenseTileK] = {};
    for (int64_t j = t; j < t + kDenseTileK && j < p.k; ++j) {
      a[j - t] = bf16_to_float(x[j]);
      b[j - t] = weight_at(p, c, j);
    }
    acc = amx_bf16_step(acc, a, b, kDenseTileK / 2);
  }
  return acc;
}
}  // namespace

void dense_tile_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) dense_store(p, r, c, dot(p, r, c));
}

}  // namespace shrike::ref
