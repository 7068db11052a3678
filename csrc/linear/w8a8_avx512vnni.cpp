// W8A8 with 512-bit vpdpbusd: two adjacent tiles (16 output columns) x 4 K per zmm. The kernel is
// tile_walk_x86.h's, shared with AVX-VNNI.
#include "linear/epilogue_avx512.h"
#include "linear/tile_walk_x86.h"

namespace shrike::avx512vnni {

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  w8a8_walk<ZmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avx512vnni
