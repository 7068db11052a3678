// Grouped linear with 256-bit VEX vpdpbusd: one 8-row tile per ymm.
#include "linear/epilogue_avxvnni.h"
#include "grouped_linear/grouped_walk_x86.h"

namespace shrike::avxvnni {

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  grouped_walk<YmmLanes>(p, tile_begin, tile_end);
}

}  // namespace shrike::avxvnni
