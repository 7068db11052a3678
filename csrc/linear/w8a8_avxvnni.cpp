// W8A8 with 256-bit VEX vpdpbusd (AVX-VNNI): one tile (8 output columns) x 4 K per ymm. The
// kernel is tile_walk_x86.h's, shared with AVX-512 VNNI.
#include "linear/epilogue_avxvnni.h"
#include "linear/tile_walk_x86.h"

namespace shrike::avxvnni {

void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end) {
  w8a8_walk<YmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avxvnni
