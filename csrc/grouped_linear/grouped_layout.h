// The packed layout of grouped weights (grouped_linear.h), shared by the kernels and the packing code.
//
// Output rows in tiles of 8 as for W4A8/W8A8 (linear/layout.h; N padded, padded rows all zero);
// per tile and group g of G K-values, in K order:
//   bits 8: (G/4, 8, 4) int8    byte (s, r, j) = w[r][gG+4s+j]
//   bits 4: (G/8, 8, 4) uint8   byte (s, r, j) = u[r][gG+8s+j] | u[r][gG+8s+4+j] << 4
//           u = w (0..15) with mins, u = w + 8 without; a codebook weight's u is the index of w in
//           kGroupedCodebook
//   bits 6: the low nibbles of u as for bits 4, then a plane of the top 2 bits of each u,
//           (G/16, 8, 4) uint8   byte (s, r, j) = sum over i < 4 of (u[r][gG+16s+4i+j] >> 4) << 2i
//           u = w (0..63) with mins, u = w + 32 without: the 8-K step of a nibble load takes bits 0-3 of
//           its 16-K pair's high-bit byte (even steps) or bits 4-7 (odd steps), low nibbles first
//   (8,) scales, then (8,) mins when the weight has them: float32, fp16, or int8 factors when factored.
// Factored weights open each superblock (256 K: 8 groups of 32 or 16 of 16) with a header of the tile's
// (8,) fp16 d, then (8,) fp16 dmin with mins; a group's scale is d * factor, its min dmin * factor.
// 4- and 6-bit values are unsigned, so x86 feeds them to vpdpbusd as they are; int8 values are flipped to
// w + 128, and codebook indices looked up (vpshufb) as level + 128; the activations' group sums remove
// the 128 (or the 8, or the 32).
#pragma once
#include <cstdint>
#include <cstring>

#include "common/f16.h"
#include "grouped_linear/grouped_linear.h"
#include "linear/layout.h"

namespace shrike {

// kGroupedCodebook + 128: the unsigned byte x86's vpdpbusd takes for each codebook index.
struct CodebookBytes {
  uint8_t level[16];
};
constexpr CodebookBytes grouped_codebook_plus_128() {
  CodebookBytes t{};
  for (int i = 0; i < 16; ++i) t.level[i] = static_cast<uint8_t>(kGroupedCodebook[i] + 128);
  return t;
}
inline constexpr CodebookBytes kGroupedCodebookUnsigned = grouped_codebook_plus_128();

inline int64_t grouped_value_bytes(int64_t group, int bits) { return group * kTileRows * bits / 8; }
inline bool grouped_factored(const GroupedWeight& w) { return w.params == GroupedParams::kFactored; }
// Bytes of one tile's 8 scales (and of its 8 mins) in a group.
inline int64_t grouped_param_bytes(const GroupedWeight& w) {
  return kTileRows * (w.params == GroupedParams::kFloat32 ? 4 : w.params == GroupedParams::kFloat16 ? 2 : 1);
}
inline int64_t grouped_group_bytes(const GroupedWeight& w) {
  return grouped_value_bytes(w.group, w.bits) + grouped_param_bytes(w) * (w.has_min ? 2 : 1);
}
// Bytes of a factored superblock's header (d, and dmin with mins), 0 for the other forms.
inline int64_t grouped_header_bytes(const GroupedWeight& w) {
  return grouped_factored(w) ? kTileRows * 2 * (w.has_min ? 2 : 1) : 0;
}
// Whether a header comes before group g's values in the stream.
inline bool grouped_opens_superblock(const GroupedWeight& w, int64_t g) {
  return grouped_factored(w) && g * w.group % kGroupedSuperblock == 0;
}
inline int64_t grouped_tile_bytes(const GroupedWeight& w) {
  return w.k / w.group * grouped_group_bytes(w) + (grouped_factored(w) ? w.k / kGroupedSuperblock * grouped_header_bytes(w) : 0);
}
inline int64_t grouped_packed_bytes(const GroupedWeight& w) { return tile_count(w.n) * grouped_tile_bytes(w); }
// Byte offsets, within a tile, of group g's values and of its superblock's header (factored only).
inline int64_t grouped_header_offset(const GroupedWeight& w, int64_t g) {
  const int64_t per = kGroupedSuperblock / w.group;
  return g / per * (grouped_header_bytes(w) + per * grouped_group_bytes(w));
}
inline int64_t grouped_group_offset(const GroupedWeight& w, int64_t g) {
  if (!grouped_factored(w)) return g * grouped_group_bytes(w);
  return grouped_header_offset(w, g) + grouped_header_bytes(w) + g % (kGroupedSuperblock / w.group) * grouped_group_bytes(w);
}
// What a group's integer dot over the stored bytes needs times the activations' group sum added to be
// the dot over the values: -8 for 4-bit and -32 for 6-bit values without mins (stored w + 8, w + 32),
// else 0. (The x86 kernels add their own -128 for int8 values, which they flip to unsigned.)
inline int32_t grouped_stored_offset(const GroupedWeight& w) {
  return w.has_min || w.bits == 8 || w.codebook ? 0 : w.bits == 4 ? -8 : -32;
}
// The lowest value a weight of these bits holds (its values span 2^bits from there).
inline int grouped_lowest_value(const GroupedWeight& w) { return w.bits == 8 ? -128 : grouped_stored_offset(w); }
// Value j of row r in the group whose values start at `group` (the stored byte, less the stored offset).
inline int grouped_value(const GroupedWeight& w, const uint8_t* group, int r, int64_t j) {
  if (w.bits == 8) return static_cast<int8_t>(group[(j / 4 * kTileRows + r) * 4 + j % 4]);
  const uint8_t byte = group[(j / 8 * kTileRows + r) * 4 + j % 4];
  int u = j % 8 < 4 ? byte & 15 : byte >> 4;
  if (w.codebook) return kGroupedCodebook[u];
  if (w.bits == 6) {
    const uint8_t top = group[grouped_value_bytes(w.group, 4) + (j / 16 * kTileRows + r) * 4 + j % 4];
    u |= (top >> (2 * (j % 16 / 4)) & 3) << 4;
  }
  return u + grouped_stored_offset(w);
}
// Scale (or min) i of the 8 at `params` as float32; `header` is the superblock's 8 fp16 d (or dmin) of a
// factored weight.
inline float grouped_param(const uint8_t* params, const uint8_t* header, int i, GroupedParams form) {
  if (form == GroupedParams::kFloat32) {
    float v;
    std::memcpy(&v, params + 4 * i, 4);
    return v;
  }
  f16 h;
  std::memcpy(&h, (form == GroupedParams::kFloat16 ? params : header) + 2 * i, 2);
  if (form == GroupedParams::kFloat16) return f16_to_float(h);
  return f16_to_float(h) * static_cast<float>(static_cast<int8_t>(params[i]));
}
// Scale and min (0 without mins) of row r of the tile at `tile`, group g.
inline void grouped_scale_min(const GroupedWeight& w, const uint8_t* tile, int64_t g, int r, float& scale, float& min) {
  const uint8_t* params = tile + grouped_group_offset(w, g) + grouped_value_bytes(w.group, w.bits);
  const uint8_t* header = grouped_factored(w) ? tile + grouped_header_offset(w, g) : nullptr;
  scale = grouped_param(params, header, r, w.params);
  min = w.has_min ? grouped_param(params + grouped_param_bytes(w), header ? header + 2 * kTileRows : nullptr, r, w.params)
                  : 0.0f;
}

// Checks the shape (throws std::invalid_argument) and packs w (n, k) int8 with scale and min (n, k / group)
// float32 (min null unless has_min) into packed. fp16 params: every scale and min must be exact in fp16.
// Factored: d and dmin (n, k / 256) float32, each exact in fp16 (dmin null unless has_min), and every scale
// (min) d (dmin) times an integer in -128..127.
void grouped_pack(const int8_t* w, const float* scale, const float* min, const float* d, const float* dmin,
                  const GroupedWeight& shape, uint8_t* packed);
// The inverse: values, scale and min (when has_min) of shape.packed.
void grouped_unpack(const GroupedWeight& packed, int8_t* w, float* scale, float* min);
void check_grouped_shape(const GroupedWeight& w);

}  // namespace shrike
