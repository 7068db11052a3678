// The packed layout of grouped weights (grouped_linear.h), shared by the kernels and the packing code.
//
// Output rows in tiles of 8 as for W4A8/W8A8 (linear/layout.h; N padded, padded rows all zero);
// per tile and group g of G K-values, in K order:
//   bits 8: (G/4, 8, 4) int8    byte (s, r, j) = w[r][gG+4s+j]
//   bits 4: (G/8, 8, 4) uint8   byte (s, r, j) = u[r][gG+8s+j] | u[r][gG+8s+4+j] << 4
//           u = w (0..15) with mins, u = w + 8 without
//   (8,) scales, then (8,) mins when the weight has them; float32, or fp16 with f16_params.
// 4-bit nibbles are unsigned, so x86 feeds them to vpdpbusd as they are; int8 values are flipped to
// w + 128; the activations' group sums remove the 128 (or the 8).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/f16.h"
#include "grouped_linear/grouped_linear.h"
#include "linear/layout.h"

namespace shrike {

inline int64_t grouped_value_bytes(int64_t group, int bits) { return group * kTileRows * bits / 8; }
// Bytes of one tile's 8 scales (and of its 8 mins).
inline int64_t grouped_param_bytes(const GroupedWeight& w) { return kTileRows * (w.f16_params ? 2 : 4); }
inline int64_t grouped_group_bytes(const GroupedWeight& w) {
  return grouped_value_bytes(w.group, w.bits) + grouped_param_bytes(w) * (w.has_min ? 2 : 1);
}
// What a group's integer dot over the stored bytes needs times the activations' group sum added to be
// the dot over the values: -8 for 4-bit values without mins (stored w + 8), else 0. (The x86 kernels
// add their own -128 for int8 values, which they flip to unsigned.)
inline int32_t grouped_stored_offset(const GroupedWeight& w) { return w.bits == 4 && !w.has_min ? -8 : 0; }
// Scale (or min) i of the 8 at `params`, as float32.
inline float grouped_param(const uint8_t* params, int i, bool f16_params) {
  if (f16_params) {
    f16 h;
    std::memcpy(&h, params + 2 * i, 2);
    return f16_to_float(h);
  }
  float v;
  std::memcpy(&v, params + 4 * i, 4);
  return v;
}
inline int64_t grouped_tile_bytes(const GroupedWeight& w) { return w.k / w.group * grouped_group_bytes(w); }
inline int64_t grouped_packed_bytes(const GroupedWeight& w) { return tile_count(w.n) * grouped_tile_bytes(w); }

// Checks the shape (throws std::invalid_argument) and packs w (n, k) int8 with scale and min (n, k / group)
// float32 (min null unless has_min) into packed; with f16_params every scale and min must be exact in fp16.
void grouped_pack(const int8_t* w, const float* scale, const float* min, const GroupedWeight& shape, uint8_t* packed);
// The inverse: values, scale and min (when has_min) of shape.packed.
void grouped_unpack(const GroupedWeight& packed, int8_t* w, float* scale, float* min);
void check_grouped_shape(const GroupedWeight& w);

}  // namespace shrike
