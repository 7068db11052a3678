// The AMX tile configuration the tile kernels load (palette 1): every tile register is 64 bytes wide,
// registers [0, short_tiles) hold `rows` rows and the rest 16. The configuration is per thread, so a
// kernel loads it on entry and releases the tile state when done.
// Internal linkage on purpose: included only by *_amx.cpp files, compiled with AMX flags.
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

inline void configure_tiles(int rows = 16, int short_tiles = 0) {
  TileConfig config{};
  config.palette_id = 1;
  for (int i = 0; i < 8; ++i) {
    config.rows[i] = static_cast<uint8_t>(i < short_tiles ? rows : 16);
    config.colsb[i] = 64;
  }
  _tile_loadconfig(&config);
}

}  // namespace
}  // namespace shrike::amx
