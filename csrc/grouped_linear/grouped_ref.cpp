// Portable scalar reference: defines the semantics every SIMD variant must reproduce exactly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/bf16.h"
#include "grouped_linear/grouped_layout.h"

namespace shrike::ref {

namespace {
void store(void* out, DType dt, int64_t i, float v) {
  if (dt == DType::f32) static_cast<float*>(out)[i] = v;
  else static_cast<bf16*>(out)[i] = float_to_bf16(v);
}

template <class T>
float as_float(T v) {
  if constexpr (std::is_same_v<T, float>) return v; else return bf16_to_float(v);
}

template <class T>
void quantize_rows(const T* x, int64_t r0, int64_t r1, int64_t k, int64_t group, const GroupedRows& out) {
  const int64_t blocks = k / kGroupedActivationBlock, groups = k / group;
  for (int64_t i = r0; i < r1; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = i * k + b * kGroupedActivationBlock;
      float amax = 0.f;
      for (int64_t j = 0; j < kGroupedActivationBlock; ++j) amax = std::max(amax, std::abs(as_float(x[first + j])));
      const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      out.x_scale[i * blocks + b] = scale;
      for (int64_t j = 0; j < kGroupedActivationBlock; ++j)
        out.q[first + j] = static_cast<int8_t>(std::clamp(std::nearbyint(as_float(x[first + j]) * inv), -127.f, 127.f));
    }
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t j = 0; j < group; ++j) sum += out.q[i * k + g * group + j];
      out.group_sum[i * groups + g] = sum;
      out.x_min[i * groups + g] = -static_cast<float>(sum) * out.x_scale[i * blocks + g * group / kGroupedActivationBlock];
    }
  }
}
}  // namespace

void grouped_quantize_rows(const void* x, DType x_dtype, int64_t r0, int64_t r1, int64_t k, int64_t group,
                           const GroupedRows& rows) {
  if (x_dtype == DType::f32) return quantize_rows(static_cast<const float*>(x), r0, r1, k, group, rows);
  quantize_rows(static_cast<const bf16*>(x), r0, r1, k, group, rows);
}

void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end) {
  const GroupedWeight& wt = p.w;
  const int64_t groups = wt.k / wt.group, blocks = wt.k / kGroupedActivationBlock;
  std::vector<int32_t> w(kTileRows * wt.group);  // (8, group)
  std::vector<float> acc(p.m * kTileRows);       // (m, 8)
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile = wt.packed + t * grouped_tile_bytes(wt);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* group = tile + grouped_group_offset(wt, g);
      for (int r = 0; r < kTileRows; ++r)
        for (int64_t j = 0; j < wt.group; ++j) w[r * wt.group + j] = grouped_value(wt, group, r, j);
      float scale[kTileRows], min[kTileRows];
      for (int r = 0; r < kTileRows; ++r) grouped_scale_min(wt, tile, g, r, scale[r], min[r]);
      const int64_t b = g * wt.group / kGroupedActivationBlock;
      for (int64_t i = 0; i < p.m; ++i) {
        const int8_t* q = p.q + i * wt.k + g * wt.group;
        for (int r = 0; r < kTileRows; ++r) {
          int32_t isum = 0;
          for (int64_t j = 0; j < wt.group; ++j) isum += q[j] * w[r * wt.group + j];
          float& a = acc[i * kTileRows + r];
          a = std::fma(static_cast<float>(isum), scale[r] * p.x_scale[i * blocks + b], a);
          if (wt.has_min) a = std::fma(p.x_min[i * groups + g], min[r], a);
        }
      }
    }
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t r = 0; r < kTileRows && t * kTileRows + r < wt.n; ++r) {
        int64_t col = t * kTileRows + r;
        store(p.out, p.out_dtype, i * p.out_stride + col, acc[i * kTileRows + r] + (p.bias ? p.bias[col] : 0.f));
      }
  }
}

}  // namespace shrike::ref
