// Shared by the AMX tile kernels: the tile configuration and the output block shape.
// Internal linkage on purpose: compiled with AMX flags, never merged with other ISAs' code.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace shrike::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Every tile 16 rows x 64 bytes: tmm0-3 int32 accumulators (16 x 16), tmm4-5 activations
// (16 rows x 64 K), tmm6-7 weights (16 K quads x 16 columns x 4 K).
inline void configure_tiles() {
  TileConfig config{};
  config.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    config.rows[i] = 16;
    config.colsb[i] = 64;
  }
  _tile_loadconfig(&config);
}

constexpr int64_t kBlockTiles = 4;  // 32 output columns: two column pairs of 8-row tiles

}  // namespace
}  // namespace shrike::amx
