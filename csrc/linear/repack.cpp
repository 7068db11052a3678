#include "linear/repack.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "linear/layout.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

void check_w4a8_shape(int64_t k, int64_t group) {
  if (group != 32 && group != 64 && group != 128)
    throw std::invalid_argument("w4a8: group size must be 32, 64 or 128, got " + std::to_string(group));
  if (k % group != 0)
    throw std::invalid_argument("w4a8: K=" + std::to_string(k) + " is not a multiple of the group size " +
                                std::to_string(group));
}

// nibble(row, col) returns the stored value w + 8 in [0, 15].
template <typename Nibble>
void pack_w4a8_tiles(Nibble nibble, const float* scales, int64_t n, int64_t k, int64_t group, uint8_t* packed) {
  const int64_t groups = k / group;
  runtime::parallel_for(tile_count(n), [&](int64_t t) {
    uint8_t* block = packed + t * w4a8_tile_bytes(k, group);
    for (int64_t g = 0; g < groups; ++g, block += w4a8_group_bytes(group)) {
      float scale[kTileRows] = {};
      int16_t sum[kTileRows] = {};
      for (int r = 0; r < kTileRows; ++r) {
        int64_t row = t * kTileRows + r;
        for (int64_t s = 0; s < group / 8; ++s)
          for (int j = 0; j < 4; ++j) {
            int64_t col = g * group + 8 * s + j;
            uint8_t lo = row < n ? nibble(row, col) : 8, hi = row < n ? nibble(row, col + 4) : 8;
            block[(s * kTileRows + r) * 4 + j] = static_cast<uint8_t>(lo | hi << 4);
            sum[r] = static_cast<int16_t>(sum[r] + lo + hi - 16);
          }
        if (row < n) scale[r] = scales[row * groups + g];
      }
      std::memcpy(block + 4 * group, scale, sizeof(scale));
      std::memcpy(block + 4 * group + sizeof(scale), sum, sizeof(sum));
    }
  });
}

}  // namespace

void w4a8_pack_int8(const int8_t* w, const float* scales, int64_t n, int64_t k, int64_t group, uint8_t* packed) {
  check_w4a8_shape(k, group);
  for (int64_t i = 0; i < n * k; ++i)
    if (w[i] < -8 || w[i] > 7)
      throw std::invalid_argument("w4a8: int8 weight " + std::to_string(w[i]) + " at flat index " + std::to_string(i) +
                                  " is outside the int4 range [-8, 7]");
  pack_w4a8_tiles([&](int64_t r, int64_t c) { return static_cast<uint8_t>(w[r * k + c] + 8); }, scales, n, k, group,
                  packed);
}

void w4a8_pack_int32(const int32_t* w, const float* scales, int64_t n, int64_t k, int64_t group, uint8_t* packed) {
  check_w4a8_shape(k, group);
  pack_w4a8_tiles(
      [&](int64_t r, int64_t c) {
        uint32_t word = static_cast<uint32_t>(w[r * (k / 8) + c / 8]);
        return static_cast<uint8_t>(word >> (4 * (c % 8)) & 15);
      },
      scales, n, k, group, packed);
}

void w4a8_unpack(const uint8_t* packed, int64_t n, int64_t k, int64_t group, int8_t* w, float* scales) {
  check_w4a8_shape(k, group);
  const int64_t groups = k / group;
  for (int64_t row = 0; row < n; ++row) {
    int64_t t = row / kTileRows, r = row % kTileRows;
    const uint8_t* block = packed + t * w4a8_tile_bytes(k, group);
    for (int64_t g = 0; g < groups; ++g, block += w4a8_group_bytes(group)) {
      for (int64_t s = 0; s < group / 8; ++s)
        for (int j = 0; j < 4; ++j) {
          uint8_t byte = block[(s * kTileRows + r) * 4 + j];
          w[row * k + g * group + 8 * s + j] = static_cast<int8_t>((byte & 15) - 8);
          w[row * k + g * group + 8 * s + 4 + j] = static_cast<int8_t>((byte >> 4) - 8);
        }
      std::memcpy(scales + row * groups + g, block + 4 * group + r * sizeof(float), sizeof(float));
    }
  }
}

void w8a8_pack(const int8_t* w, const float* scales, int64_t n, int64_t k, uint8_t* packed) {
  if (k % 16 != 0) throw std::invalid_argument("w8a8: K=" + std::to_string(k) + " is not a multiple of 16");
  runtime::parallel_for(tile_count(n), [&](int64_t t) {
    uint8_t* tile = packed + t * w8a8_tile_bytes(k);
    float scale[kTileRows] = {};
    for (int r = 0; r < kTileRows; ++r) {
      int64_t row = t * kTileRows + r;
      for (int64_t c = 0; c < k; ++c)
        tile[(c / 4 * kTileRows + r) * 4 + c % 4] = row < n ? static_cast<uint8_t>(w[row * k + c]) : 0;
      if (row < n) scale[r] = scales[row];
    }
    std::memcpy(tile + kTileRows * k, scale, sizeof(scale));
  });
}

void w8a8_unpack(const uint8_t* packed, int64_t n, int64_t k, int8_t* w, float* scales) {
  if (k % 16 != 0) throw std::invalid_argument("w8a8: K=" + std::to_string(k) + " is not a multiple of 16");
  for (int64_t row = 0; row < n; ++row) {
    int64_t t = row / kTileRows, r = row % kTileRows;
    const uint8_t* tile = packed + t * w8a8_tile_bytes(k);
    for (int64_t c = 0; c < k; ++c) w[row * k + c] = static_cast<int8_t>(tile[(c / 4 * kTileRows + r) * 4 + c % 4]);
    std::memcpy(scales + row, tile + kTileRows * k + r * sizeof(float), sizeof(float));
  }
}

}  // namespace shrike
