// Portable scalar reference: defines the semantics every SIMD variant must reproduce exactly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/bf16.h"
#include "linear/layout.h"
#include "linear/linear.h"

namespace shrike::ref {

namespace {
void store(void* out, DType dt, int64_t i, float v) {
  if (dt == DType::f32) static_cast<float*>(out)[i] = v;
  else static_cast<bf16*>(out)[i] = float_to_bf16(v);
}

// One group of one tile as signed weights, (8, group).
void decode_group(const uint8_t* block, int64_t group, int8_t* w) {
  for (int64_t s = 0; s < group / 8; ++s)
    for (int r = 0; r < kTileRows; ++r)
      for (int j = 0; j < 4; ++j) {
        uint8_t byte = block[(s * kTileRows + r) * 4 + j];
        w[r * group + 8 * s + j] = static_cast<int8_t>((byte & 15) - 8);
        w[r * group + 8 * s + 4 + j] = static_cast<int8_t>((byte >> 4) - 8);
      }
}
}  // namespace

void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  const int64_t groups = p.k / p.group;
  std::vector<int8_t> w(kTileRows * p.group);  // (8, group)
  std::vector<float> acc(p.m * kTileRows);     // (m, 8)
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* block = p.packed + t * w4a8_tile_bytes(p.k, p.group);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t g = 0; g < groups; ++g, block += w4a8_group_bytes(p.group)) {
      decode_group(block, p.group, w.data());
      float scale[kTileRows];
      std::memcpy(scale, block + 4 * p.group, sizeof(scale));
      for (int64_t i = 0; i < p.m; ++i) {
        const int8_t* q = p.q + i * p.k + g * p.group;
        for (int r = 0; r < kTileRows; ++r) {
          int32_t isum = 0;
          for (int64_t j = 0; j < p.group; ++j) isum += (q[j] - p.x_zero[i]) * w[r * p.group + j];
          acc[i * kTileRows + r] = std::fma(static_cast<float>(isum), scale[r], acc[i * kTileRows + r]);
        }
      }
    }
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t r = 0; r < kTileRows && t * kTileRows + r < p.n; ++r) {
        int64_t col = t * kTileRows + r;
        float y = std::fma(acc[i * kTileRows + r], p.x_scale[i], p.bias ? p.bias[col] : 0.f);
        store(p.out, p.out_dtype, i * p.n + col, y);
      }
  }
}

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  std::vector<int8_t> w(kTileRows * p.k);  // (8, K)
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = p.packed + t * w8a8_tile_bytes(p.k);  // (K/4, 8, 4) int8, then 8 scales
    for (int64_t k = 0; k < p.k; ++k)
      for (int r = 0; r < kTileRows; ++r) w[r * p.k + k] = static_cast<int8_t>(tile[(k / 4 * kTileRows + r) * 4 + k % 4]);
    float scale[kTileRows];
    std::memcpy(scale, tile + kTileRows * p.k, sizeof(scale));
    for (int64_t i = 0; i < p.m; ++i) {
      const int8_t* q = p.q + i * p.k;
      for (int64_t r = 0; r < kTileRows && t * kTileRows + r < p.n; ++r) {
        int32_t isum = 0;
        for (int64_t k = 0; k < p.k; ++k) isum += q[k] * w[r * p.k + k];
        int64_t col = t * kTileRows + r;
        float y = std::fma(static_cast<float>(isum), p.x_scale[i] * scale[r], p.bias ? p.bias[col] : 0.f);
        store(p.out, p.out_dtype, i * p.n + col, y);
      }
    }
  }
}

}  // namespace shrike::ref
