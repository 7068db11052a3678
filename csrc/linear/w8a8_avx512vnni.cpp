// W8A8 with 512-bit vpdpbusd. Decode (one or two rows) walks one tile at a time as one sequential
// stream (decode_avx512.h); more rows take tile_walk_x86.h's register blocks shared with AVX-VNNI:
// two adjacent tiles (16 output columns) x 4 K per zmm.
#include "linear/decode_avx512.h"
#include "linear/epilogue_avx512.h"
#include "linear/tile_walk_x86.h"

namespace shrike::avx512vnni {

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  if (p.m <= 2) return w8a8_decode(p, tile_begin, tile_end);
  w8a8_walk<ZmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avx512vnni
