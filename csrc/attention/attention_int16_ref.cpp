// Scalar model of the int16-dot attention walk (attention_int16_avx512vnni.cpp, arithmetic in
// attention/int16_walk.h): the same operations in the same order, one row and one lane at a time, so the
// kernel must match it bit for bit. Integer sums are exact in any order. Compiled without floating-point
// contraction (kernels.cmake), so that only the std::fma calls here are fused.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/exp_scalar.h"
#include "attention/int16_walk.h"
#include "common/bf16.h"

namespace shrike {

int64_t int16_attention_scratch_floats(int64_t rows, int64_t head_dim) {
  int16_walk::Scratch unused;
  return int16_walk::lay_out_scratch(rows, head_dim, nullptr, unused);
}

namespace int16_ref {
namespace {

using namespace int16_walk;

// q16 and qf of one query row (d bf16 values).
float quantize_query(const bf16* q, float scale, int64_t d, int16_t* q16) {
  float amax = 0.f;
  for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(bf16_to_float(q[c]) * scale));
  const float qf = amax / kLevels;
  for (int64_t c = 0; c < d; ++c) {
    const float x = qf > 0.f ? std::nearbyint(bf16_to_float(q[c]) * scale / qf) : 0.f;
    q16[c] = static_cast<int16_t>(std::clamp(x, -kLevels, kLevels));
  }
  return qf;
}

// The sum of a tile's 32 weights in the kernel's order: halves of 16, 8, 4, 2 lanes added lane by lane.
float tile_sum(const float* p) {
  float t[16];
  for (int i = 0; i < 16; ++i) t[i] = p[i] + p[i + 16];
  for (int width = 8; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) t[i] = t[i] + t[i + width];
  return t[0];
}

}  // namespace

void attend(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const int64_t d = a.head_dim, rows = w.q_count * (a.num_heads / a.num_kv_heads);
  Scratch s;
  lay_out_scratch(rows, d, scratch, s);
  const RowKeys item = start_item(a, w, s, quantize_query);
  const int64_t key_begin = item.lo, key_end = item.hi;
  for (int64_t t0 = first_tile(key_begin); t0 < key_end; t0 += kTileKeys) {
    const int64_t first = std::max<int64_t>(0, key_begin - t0), n = std::min(kTileKeys, key_end - t0);
    int64_t offset[kTileKeys];
    tile_rows(a, w, t0, first, n, offset);
    const int8_t* key_row[kTileKeys];
    const int8_t* value_row[kTileKeys];
    for (int64_t j = 0; j < kTileKeys; ++j) {
      const bool read = j >= first && j < n;
      key_row[j] = read ? static_cast<const int8_t*>(a.key_cache) + offset[j] : nullptr;
      value_row[j] = read ? static_cast<const int8_t*>(a.value_cache) + offset[j] : nullptr;
      s.key_scale[j] = read ? kv_int8_scale(key_row[j], d) : 0.f;
      s.value_scale[j] = read ? kv_int8_scale(value_row[j], d) : 0.f;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const RowKeys k = row_keys(a, w, r);
      if (std::max(k.lo, t0) >= std::min(k.hi, t0 + n)) continue;
      bool seen[kTileKeys];
      float score[kTileKeys], p[kTileKeys], weight[kTileKeys];
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < kTileKeys; ++j) {
        seen[j] = t0 + j >= k.lo && t0 + j < k.hi;
        if (!seen[j]) continue;
        int32_t dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += int32_t{s.q[r * d + c]} * key_row[j][c];
        score[j] = static_cast<float>(dot) * (s.query_factor[r] * s.key_scale[j]);
        tile_max = std::max(tile_max, score[j]);
      }
      const float new_max = std::max(s.row_max[r], tile_max);
      const float rescale = exp_nonpositive_scalar(s.row_max[r] - new_max);
      float weight_max = 0.f;
      for (int64_t j = 0; j < kTileKeys; ++j) {
        p[j] = seen[j] ? exp_nonpositive_scalar(score[j] - new_max) : 0.f;
        weight[j] = seen[j] ? p[j] * s.value_scale[j] : 0.f;
        weight_max = std::max(weight_max, weight[j]);
      }
      s.row_sum[r] = std::fma(s.row_sum[r], rescale, tile_sum(p));
      s.row_max[r] = new_max;
      const float weight_factor = weight_max / kLevels;
      int32_t w16[kTileKeys];
      for (int64_t j = 0; j < kTileKeys; ++j) {
        const float level = weight_factor > 0.f ? std::nearbyint(weight[j] / weight_factor) : 0.f;
        w16[j] = static_cast<int32_t>(std::min(level, kLevels));
      }
      for (int64_t c = 0; c < d; ++c) {
        int32_t pv = 0;
        for (int64_t j = first; j < n; ++j) pv += w16[j] * value_row[j][c];
        float& acc = s.acc[r * d + c];
        acc = std::fma(acc, rescale, static_cast<float>(pv) * weight_factor);
      }
    }
  }
  finish_item(a, w, s, [d](bf16* out, const float* acc, float factor) {
    for (int64_t c = 0; c < d; ++c) out[c] = float_to_bf16(acc[c] * factor);
  });
}

}  // namespace int16_ref
}  // namespace shrike
