// Packing of bf16 weights into the tile layout (dense_tiles.h): a transposition of K pairs.
#include "dense/dense_tiles.h"

#include <algorithm>
#include <cstring>

#include "runtime/threadpool.h"

namespace shrike {

void dense_pack_panels(const bf16* w, int64_t n, int64_t k, int64_t first, int64_t count, bf16* panels) {
  const int64_t kp = dense_tiles_k(k);
  std::memset(panels, 0, static_cast<size_t>(count * kDensePanelCols * kp) * sizeof(bf16));
  for (int64_t p = 0; p < count; ++p) {
    bf16* panel = panels + p * kDensePanelCols * kp;
    const int64_t c0 = (first + p) * kDensePanelCols;
    for (int64_t c = c0; c < std::min(n, c0 + kDensePanelCols); ++c) {
      const bf16* row = w + c * k;
      bf16* column = panel + (c - c0) * 2;
      // One pair (4 bytes) per step: rows of odd k start off a 4-byte boundary, hence memcpy.
      for (int64_t j = 0; j + 1 < k; j += 2) std::memcpy(column + j * kDensePanelCols, row + j, 2 * sizeof(bf16));
      if (k % 2) column[(k - 1) * kDensePanelCols] = row[k - 1];
    }
  }
}

void dense_pack_tiles(const bf16* w, int64_t n, int64_t k, bf16* tiles) {
  constexpr int64_t kPanelsPerTask = 16;
  const int64_t panels = dense_panels(n), panel_elements = kDensePanelCols * dense_tiles_k(k);
  runtime::parallel_for((panels + kPanelsPerTask - 1) / kPanelsPerTask, [&](int64_t t) {
    const int64_t first = t * kPanelsPerTask;
    dense_pack_panels(w, n, k, first, std::min(kPanelsPerTask, panels - first), tiles + first * panel_elements);
  });
}

void dense_unpack_tiles(const bf16* tiles, int64_t n, int64_t k, bf16* w) {
  const int64_t kp = dense_tiles_k(k);
  for (int64_t c = 0; c < n; ++c) {
    const bf16* column = tiles + (c / kDensePanelCols) * kDensePanelCols * kp + (c % kDensePanelCols) * 2;
    for (int64_t j = 0; j < k; ++j) w[c * k + j] = column[(j / 2) * 2 * kDensePanelCols + j % 2];
  }
}

}  // namespace shrike
