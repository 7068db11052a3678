// The embedding rows of a table kept in a packed linear weight, dequantized as the bf16 conversion
// of the same GGUF blocks holds them: value * scale (- min) in float32, rounded to bf16, widened
// for a float32 model, then scaled as embedding() scales. Built with -ffp-contract=off
// (kernels.cmake): a fused multiply-subtract would round once where the conversion rounds twice.
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/bf16.h"
#include "fused/fused.h"
#include "grouped_linear/grouped_layout.h"
#include "linear/layout.h"

namespace shrike {
namespace {

// Row `row` of W4A8 tiles (linear/layout.h): (nibble - 8) * scale.
void w4a8_row(const PackedTable& t, int64_t row, float* out) {
  const int64_t r = row % kTileRows;
  const uint8_t* group = t.packed + row / kTileRows * w4a8_tile_bytes(t.k, t.group);
  for (int64_t g0 = 0; g0 < t.k; g0 += t.group, group += w4a8_group_bytes(t.group)) {
    float scale;
    std::memcpy(&scale, group + 4 * t.group + 4 * r, 4);
    for (int64_t j = 0; j < t.group; ++j) {
      uint8_t byte = group[(j / 8 * kTileRows + r) * 4 + j % 4];
      int nibble = j % 8 < 4 ? byte & 15 : byte >> 4;
      out[g0 + j] = static_cast<float>(nibble - 8) * scale;
    }
  }
}

// Row `row` of grouped tiles (grouped_layout.h): value * scale - min.
void grouped_row(const PackedTable& t, int64_t row, float* out) {
  const GroupedWeight w{t.packed, t.n, t.k, t.group, t.bits, t.has_min};
  const int64_t r = row % kTileRows;
  const uint8_t* group = t.packed + row / kTileRows * grouped_tile_bytes(w);
  for (int64_t g0 = 0; g0 < t.k; g0 += t.group, group += grouped_group_bytes(t.group, t.bits, t.has_min)) {
    const uint8_t* params = group + grouped_value_bytes(t.group, t.bits);
    float scale, min = 0.0f;
    std::memcpy(&scale, params + 4 * r, 4);
    if (t.has_min) std::memcpy(&min, params + 4 * kTileRows + 4 * r, 4);
    for (int64_t j = 0; j < t.group; ++j) {
      int value;
      if (t.bits == 8) {
        value = static_cast<int8_t>(group[(j / 4 * kTileRows + r) * 4 + j % 4]);
      } else {
        uint8_t byte = group[(j / 8 * kTileRows + r) * 4 + j % 4];
        value = j % 8 < 4 ? byte & 15 : byte >> 4;
      }
      float w_value = static_cast<float>(value) * scale;
      out[g0 + j] = t.has_min ? w_value - min : w_value;
    }
  }
}

}  // namespace

void check_packed_table(const PackedTable& t) {
  if (t.n <= 0 || t.k <= 0 || t.group <= 0 || t.k % t.group)
    throw std::invalid_argument("packed embedding: the table's K must be a positive multiple of its group");
  if (t.format == PackedTable::w4a8 ? t.bits != 4 || t.has_min : t.bits != 4 && t.bits != 8)
    throw std::invalid_argument("packed embedding: bits must be 4 for W4A8 tiles and 4 or 8 for grouped ones");
}

int64_t packed_table_bytes(const PackedTable& t) {
  if (t.format == PackedTable::w4a8) return w4a8_packed_bytes(t.n, t.k, t.group);
  return grouped_packed_bytes(GroupedWeight{t.packed, t.n, t.k, t.group, t.bits, t.has_min});
}

void packed_embedding(const int64_t* token_ids, int64_t tokens, const PackedTable& table, void* out, float scale,
                      DType dtype) {
  std::vector<float> row(static_cast<size_t>(table.k));
  for (int64_t t = 0; t < tokens; ++t) {
    if (table.format == PackedTable::w4a8)
      w4a8_row(table, token_ids[t], row.data());
    else
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
