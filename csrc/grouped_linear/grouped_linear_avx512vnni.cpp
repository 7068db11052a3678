// Grouped linear with 512-bit vpdpbusd: two adjacent tiles (16 output columns) per zmm.
#include "linear/epilogue_avx512.h"
#include "grouped_linear/grouped_walk_x86.h"

namespace shrike::avx512vnni {

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  grouped_walk<ZmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avx512vnni
