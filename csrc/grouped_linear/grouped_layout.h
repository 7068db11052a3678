// The packed layout of grouped weights (grouped_linear.h), shared by the kernels and the packing code.
//
// Output rows in tiles of 8 as for W4A8/W8A8 (linear/layout.h; N padded, padded rows all zero);
// per tile and group g of G K-values, in K order:
//   bits 8: (G/4, 8, 4) int8    byte (s, r, j) = w[r][gG+4s+j]
//   bits 4: (G/8, 8, 4) uint8   byte (s, r, j) = w[r][gG+8s+j] | w[r][gG+8s+4+j] << 4   (w in 0..15)
//   (8,) float32 scales, then (8,) float32 mins when the weight has them.
// 4-bit values are unsigned, so x86 feeds them to vpdpbusd as they are; int8 values are flipped to
// w + 128 and the activations' group sums remove the 128.
#pragma once
#include <cstdint>

#include "grouped_linear/grouped_linear.h"
#include "linear/layout.h"

namespace shrike {

inline int64_t grouped_value_bytes(int64_t group, int bits) { return group * kTileRows * bits / 8; }
inline int64_t grouped_group_bytes(int64_t group, int bits, bool has_min) {
  return grouped_value_bytes(group, bits) + 4 * kTileRows * (has_min ? 2 : 1);
}
inline int64_t grouped_tile_bytes(const GroupedWeight& w) {
  return w.k / w.group * grouped_group_bytes(w.group, w.bits, w.has_min);
}
inline int64_t grouped_packed_bytes(const GroupedWeight& w) { return tile_count(w.n) * grouped_tile_bytes(w); }

// Checks the shape (throws std::invalid_argument) and packs w (n, k) int8 with scale and min (n, k / group)
// float32 (min null unless has_min) into packed.
void grouped_pack(const int8_t* w, const float* scale, const float* min, const GroupedWeight& shape, uint8_t* packed);
// The inverse: values, scale and min (when has_min) of shape.packed.
void grouped_unpack(const GroupedWeight& packed, int8_t* w, float* scale, float* min);
void check_grouped_shape(const GroupedWeight& w);

}  // namespace shrike
