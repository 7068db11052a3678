// bf16 weights packed once at load as the AMX-BF16 kernel's weight operand (DenseLayout::tiles):
// tdpbf16ps takes B as 16 rows of K pairs x 16 columns x 2, so each panel of 16 outputs is stored
// as (kp / 2, 16, 2) bf16 with kp = k rounded up to a multiple of 32, and the panels follow each
// other: element (c, j) of W (n, k) sits at ((c / 16) * kp / 2 + j / 2) * 32 + (c % 16) * 2 + j % 2.
// Outputs past n and K past k are zeros, so a 32-K tile is always a whole 1 KiB operand.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/bf16.h"

namespace shrike {

constexpr int64_t kDenseTileK = 32;      // K per tdpbf16ps (16 pairs)
constexpr int64_t kDensePanelCols = 16;  // outputs per panel

inline int64_t dense_tiles_k(int64_t k) { return (k + kDenseTileK - 1) / kDenseTileK * kDenseTileK; }
inline int64_t dense_panels(int64_t n) { return (n + kDensePanelCols - 1) / kDensePanelCols; }
inline size_t dense_tiles_elements(int64_t n, int64_t k) {
  return static_cast<size_t>(dense_panels(n) * kDensePanelCols * dense_tiles_k(k));
}

// Packs panels [first, first + count) of w (n, k) row-major into `panels` (count * 16 * kp).
void dense_pack_panels(const bf16* w, int64_t n, int64_t k, int64_t first, int64_t count, bf16* panels);
// The whole weight, over the thread pool; `tiles` holds dense_tiles_elements(n, k).
void dense_pack_tiles(const bf16* w, int64_t n, int64_t k, bf16* tiles);
// The inverse: tiles back to (n, k) row-major.
void dense_unpack_tiles(const bf16* tiles, int64_t n, int64_t k, bf16* w);

}  // namespace shrike
