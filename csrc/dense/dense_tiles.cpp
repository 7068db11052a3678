// Packing of bf16 weights into the tile layout (dense_tiles.h): a transposition of K pairs.
#include "dense/dense_tiles.h"

#include <algorithm>
#include <cstring>

#include "runtime/threadpool.h"

namespace shrike {

void dense_pack_panels(const bf16* w, int64_t n, int64_t k, int64_t first, int64_t count, bf16* panels) {
  const int64_t kp = dense_tiles_k(k);
  for (int64_t p = 0; p < count; ++p) {
    // Pair by pair, so that each 64-byte row of the panel is written once while its 16 weight rows
    // are read in step.
    uint32_t* panel = reinterpret_cast<uint32_t*>(panels + p * kDensePanelCols * kp);
    const int64_t c0 = (first + p) * kDensePanelCols, cols = std::clamp<int64_t>(n - c0, 0, kDensePanelCols);
    for (int64_t j = 0; j < kp; j += 2) {
      uint32_t* pairs = panel + (j / 2) * kDensePanelCols;
      if (cols == kDensePanelCols && j + 2 <= k) {  // a whole pair of every row: 4 bytes each
        for (int64_t c = 0; c < kDensePanelCols; ++c) std::memcpy(pairs + c, w + (c0 + c) * k + j, 4);
        continue;
      }
      for (int64_t c = 0; c < kDensePanelCols; ++c) {  // the edges: outputs past n, K past k are zeros
        bf16 pair[2] = {0, 0};
        for (int64_t e = 0; e < 2 && c < cols && j + e < k; ++e) pair[e] = w[(c0 + c) * k + j + e];
        std::memcpy(pairs + c, pair, sizeof(pair));
      }
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
