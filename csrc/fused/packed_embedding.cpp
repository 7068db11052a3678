// The embedding rows of a table kept in a grouped weight, dequantized as the bf16 conversion of the
// same GGUF blocks holds them: value * scale (- min) in float32, rounded to bf16, widened for a
// float32 model, then scaled as embedding() scales. Built with -ffp-contract=off (kernels.cmake): a
// fused multiply-subtract would round once where the conversion rounds twice.
#include <vector>

#include "common/bf16.h"
#include "fused/fused.h"
#include "grouped_linear/grouped_layout.h"
#include "linear/layout.h"

namespace shrike {
namespace {

// Row `row` of grouped tiles (grouped_layout.h): value * scale - min.
void grouped_row(const GroupedWeight& w, int64_t row, float* out) {
  const int r = static_cast<int>(row % kTileRows);
  const uint8_t* tile = w.packed + row / kTileRows * grouped_tile_bytes(w);
  for (int64_t g = 0; g < w.k / w.group; ++g) {
    const uint8_t* group = tile + grouped_group_offset(w, g);
    const int64_t g0 = g * w.group;
    float scale, min;
    grouped_scale_min(w, tile, g, r, scale, min);
    for (int64_t j = 0; j < w.group; ++j) {
      float w_value = static_cast<float>(grouped_value(w, group, r, j)) * scale;
      out[g0 + j] = w.has_min ? w_value - min : w_value;
    }
  }
}

}  // namespace

void packed_embedding(const int64_t* token_ids, int64_t tokens, const GroupedWeight& table, void* out, float scale,
                      DType dtype) {
  std::vector<float> row(static_cast<size_t>(table.k));
  for (int64_t t = 0; t < tokens; ++t) {
    grouped_row(table, token_ids[t], row.data());
    for (int64_t j = 0; j < table.k; ++j) {
      bf16 held = float_to_bf16(row[j]);  // the conversion's bf16 value
      if (dtype == DType::f32) {
        float v = bf16_to_float(held);
        static_cast<float*>(out)[t * table.k + j] = scale == 1.0f ? v : v * scale;
      } else {
        static_cast<bf16*>(out)[t * table.k + j] =
            scale == 1.0f ? held : float_to_bf16(bf16_to_float(held) * scale);
      }
    }
  }
}

}  // namespace shrike
