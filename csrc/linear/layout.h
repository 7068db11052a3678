// Packed weight layouts, shared by every kernel variant and by the repacking code.
//
// Output rows are grouped in tiles of 8 (N is padded up; padded rows have zero weights and
// zero scales). A tile's bytes are contiguous and tiles follow each other, so a GEMV over a
// range of tiles reads one sequential stream.
//
// W4A8, group size G, per tile and group g, (4G + 48) bytes:
//   (G/8, 8, 4) uint8   byte (s, r, j) = (w[r][gG+8s+j] + 8) | (w[r][gG+8s+4+j] + 8) << 4
//   (8,) float32        group scales
//   (8,) int16          group sums of the signed weights, for the activation zero point
// Keeping w + 8 unsigned lets x86 feed it to maddubs as the unsigned operand and Arm feed it
// to sdot/smmla as non-negative int8; the +8 is removed with the activation group sums.
//
// W8A8, per tile, (8K + 32) bytes:
//   (K/4, 8, 4) int8    byte (s, r, j) = w[r][4s+j]
//   (8,) float32        row scales
#pragma once
#include <cstdint>

namespace shrike {

constexpr int64_t kTileRows = 8;

inline int64_t tile_count(int64_t n) { return (n + kTileRows - 1) / kTileRows; }

inline int64_t w4a8_group_bytes(int64_t group) { return 4 * group + 48; }
inline int64_t w4a8_tile_bytes(int64_t k, int64_t group) { return k / group * w4a8_group_bytes(group); }
inline int64_t w4a8_packed_bytes(int64_t n, int64_t k, int64_t group) {
  return tile_count(n) * w4a8_tile_bytes(k, group);
}

inline int64_t w8a8_tile_bytes(int64_t k) { return kTileRows * k + 32; }
inline int64_t w8a8_packed_bytes(int64_t n, int64_t k) { return tile_count(n) * w8a8_tile_bytes(k); }

}  // namespace shrike
