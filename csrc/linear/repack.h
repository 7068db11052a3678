// Conversion between compressed-tensors checkpoint layouts and the packed tiles (layout.h).
// All functions throw std::invalid_argument on values or shapes the layout cannot hold.
#pragma once
#include <cstdint>

namespace shrike {

// w: (n, k) int8 in [-8, 7]; scales: (n, k / group) float32; packed: w4a8_packed_bytes(n, k, group)
void w4a8_pack_int8(const int8_t* w, const float* scales, int64_t n, int64_t k, int64_t group, uint8_t* packed);
// compressed-tensors pack-quantized: (n, k / 8) int32, element i of a word at bits 4i, stored + 8.
void w4a8_pack_int32(const int32_t* w, const float* scales, int64_t n, int64_t k, int64_t group, uint8_t* packed);
void w4a8_unpack(const uint8_t* packed, int64_t n, int64_t k, int64_t group, int8_t* w, float* scales);

// w: (n, k) int8; scales: (n,) float32; packed: w8a8_packed_bytes(n, k)
void w8a8_pack(const int8_t* w, const float* scales, int64_t n, int64_t k, uint8_t* packed);
void w8a8_unpack(const uint8_t* packed, int64_t n, int64_t k, int8_t* w, float* scales);

}  // namespace shrike
