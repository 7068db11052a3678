// Dispatch of the grouped linear: quantize the activations in blocks of 32, then spread output
// tiles over the thread pool; packing and unpacking of the layout.
#include "grouped_linear/grouped_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/variants.h"
#include "grouped_linear/grouped_layout.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using GroupedTiles = void (*)(const GroupedProblem&, int64_t, int64_t);
using GroupedQuantize = void (*)(const void*, DType, int64_t, int64_t, int64_t, int64_t, const GroupedRows&);

struct GroupedKernels {
  GroupedTiles tiles;
  GroupedQuantize quantize;  // the vpdpbusd levels imply AVX2, whose quantizer they share
};

struct GroupedCall {
  int64_t m;
};

const Variant<GroupedKernels, GroupedCall> kGrouped[] = {
#if defined(SHRIKE_X86)
    {Isa::avx512vnni, {avx512vnni::grouped_tiles, avx2::grouped_quantize_rows}},
    {Isa::avxvnni, {avxvnni::grouped_tiles, avx2::grouped_quantize_rows}},
    {Isa::avx2, {avx2::grouped_tiles, avx2::grouped_quantize_rows}},
#elif defined(SHRIKE_AARCH64)
    {Isa::dotprod, {dotprod::grouped_tiles, ref::grouped_quantize_rows}},
#endif
    {Isa::scalar, {ref::grouped_tiles, ref::grouped_quantize_rows}},
};

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which threads cost more than they save
constexpr int64_t kQuantRows = 16;

// As linear/linear.cpp: many small chunks for decode, chunks that stay in L2 for prefill.
int64_t tiles_per_task(int64_t tiles, int64_t m) {
  int64_t cap = m <= 4 ? 16 : 4;
  return std::max<int64_t>(2, std::min(cap, tiles / (runtime::num_threads() * 8)) & ~int64_t{1});
}

struct Workspace {
  std::vector<int8_t> q;
  std::vector<float> x_scale, x_min;
  std::vector<int32_t> group_sum;
};

}  // namespace

void check_grouped_shape(const GroupedWeight& w) {
  if (w.group != 16 && w.group != 32)
    throw std::invalid_argument("grouped: group size must be 16 or 32, got " + std::to_string(w.group));
  if (w.bits != 4 && w.bits != 6 && w.bits != 8) throw std::invalid_argument("grouped: bits must be 4, 6 or 8");
  if (w.codebook && (w.bits != 4 || w.has_min))
    throw std::invalid_argument("grouped: a codebook weight has 4-bit indices and no mins");
  if (w.k <= 0 || w.k % kGroupedActivationBlock != 0)
    throw std::invalid_argument("grouped: K=" + std::to_string(w.k) + " is not a positive multiple of 32");
  const int form = static_cast<int>(w.params);
  if (form < 0 || form > 2) throw std::invalid_argument("grouped: params must be 0 (float32), 1 (fp16) or 2 (factored)");
  if (grouped_factored(w) && w.k % kGroupedSuperblock != 0)
    throw std::invalid_argument("grouped: factored params need K to be a multiple of 256, got K=" + std::to_string(w.k));
}

const char* grouped_variant(int64_t m) { return isa_name(pick_variant(kGrouped, GroupedCall{m}).level); }

OpVariants grouped_variants() { return describe_variants("grouped_linear", kGrouped); }

namespace {
void quantize_with(GroupedQuantize quantize, const void* x, DType x_dtype, int64_t m, int64_t k, int64_t group,
                   const GroupedRows& rows) {
  if (m * k < kSerialWork) return quantize(x, x_dtype, 0, m, k, group, rows);
  runtime::parallel_for((m + kQuantRows - 1) / kQuantRows, [&](int64_t t) {
    quantize(x, x_dtype, t * kQuantRows, std::min(m, (t + 1) * kQuantRows), k, group, rows);
  });
}
}  // namespace

void grouped_quantize(const void* x, DType x_dtype, int64_t m, int64_t k, int64_t group, const GroupedRows& rows) {
  quantize_with(pick_variant(kGrouped, GroupedCall{m}).fn.quantize, x, x_dtype, m, k, group, rows);
}

void grouped_linear(const void* x, DType x_dtype, int64_t m, const GroupedWeight& w, const float* bias, void* out,
                    DType out_dtype, int64_t out_stride) {
  check_grouped_shape(w);
  if (out_stride == 0) out_stride = w.n;
  if (out_stride < w.n) throw std::invalid_argument("grouped: output rows must be at least N apart");
  if (m == 0 || w.n == 0) return;
  static thread_local Workspace ws;
  const int64_t k = w.k, groups = k / w.group;
  ws.q.resize(m * k);
  ws.x_scale.resize(m * (k / kGroupedActivationBlock));
  ws.group_sum.resize(m * groups);
  ws.x_min.resize(m * groups);
  const GroupedKernels& kernels = pick_variant(kGrouped, GroupedCall{m}).fn;
  quantize_with(kernels.quantize, x, x_dtype, m, k, w.group,
                {ws.q.data(), ws.x_scale.data(), ws.group_sum.data(), ws.x_min.data()});
  GroupedProblem p{ws.q.data(), ws.x_scale.data(), ws.group_sum.data(), ws.x_min.data(), w, bias, out, out_dtype, m,
                   out_stride};
  const GroupedTiles kernel = kernels.tiles;
  const int64_t tiles = tile_count(w.n);
  if (m * w.n * k < kSerialWork) return kernel(p, 0, tiles);
  const int64_t per_task = tiles_per_task(tiles, m);
  runtime::parallel_for((tiles + per_task - 1) / per_task,
                        [&](int64_t t) { kernel(p, t * per_task, std::min(tiles, (t + 1) * per_task)); });
}

namespace {
// The int8 factor f whose product d * f has v's bits, or false. A zero d takes 0 or -1, whichever gives v's
// sign of zero (Q6_K's d * sc is -0 for a zero d and a negative sc).
bool exact_factor(float v, float d, int8_t* out) {
  const float f = d == 0.0f ? (std::signbit(v) == std::signbit(d) ? 0.0f : -1.0f) : std::nearbyint(v / d);
  if (!(f >= -128.0f && f <= 127.0f)) return false;
  const float product = d * f;
  if (std::memcmp(&product, &v, 4) != 0) return false;
  *out = static_cast<int8_t>(f);
  return true;
}

// Writes `v` (8 rows) at `at` in the weight's parameter form; `header` holds the superblock's d (or dmin).
void store_params(const GroupedWeight& w, const float* v, const float* header, uint8_t* at) {
  for (int r = 0; r < kTileRows; ++r) {
    if (w.params == GroupedParams::kFloat32) {
      std::memcpy(at + 4 * r, &v[r], 4);
    } else if (w.params == GroupedParams::kFloat16) {
      f16 h = 0;
      float_to_f16_exact(v[r], &h);
      std::memcpy(at + 2 * r, &h, 2);
    } else {
      int8_t f = 0;
      exact_factor(v[r], header[r], &f);
      at[r] = static_cast<uint8_t>(f);
    }
  }
}

void check_params(const GroupedWeight& shape, const float* scale, const float* min, const float* d, const float* dmin) {
  const int64_t n = shape.n, groups = shape.k / shape.group, per = kGroupedSuperblock / shape.group;
  if (grouped_factored(shape) != (d != nullptr) || (grouped_factored(shape) && shape.has_min != (dmin != nullptr)))
    throw std::invalid_argument("grouped: pass d (and dmin with mins) exactly for factored params");
  f16 h;
  int8_t f;
  for (int64_t i = 0; i < n * groups; ++i) {
    if (shape.params == GroupedParams::kFloat16 &&
        (!float_to_f16_exact(scale[i], &h) || (min && !float_to_f16_exact(min[i], &h))))
      throw std::invalid_argument("grouped: a scale or min is not exact in fp16; pack with float32 params");
    if (grouped_factored(shape)) {
      const int64_t sb = i / groups * (shape.k / kGroupedSuperblock) + i % groups / per;
      if (!float_to_f16_exact(d[sb], &h) || (dmin && !float_to_f16_exact(dmin[sb], &h)))
        throw std::invalid_argument("grouped: a superblock d or dmin is not exact in fp16");
      if (!exact_factor(scale[i], d[sb], &f) || (min && !exact_factor(min[i], dmin[sb], &f)))
        throw std::invalid_argument("grouped: a scale or min is not its superblock's d times an int8 factor");
    }
  }
}
}  // namespace

void grouped_pack(const int8_t* w, const float* scale, const float* min, const float* d, const float* dmin,
                  const GroupedWeight& shape, uint8_t* packed) {
  check_grouped_shape(shape);
  const int64_t n = shape.n, k = shape.k, group = shape.group, groups = k / group, superblocks = k / kGroupedSuperblock;
  if (shape.has_min != (min != nullptr)) throw std::invalid_argument("grouped: mins given without has_min or missing");
  const int lowest = grouped_lowest_value(shape), highest = lowest + (1 << shape.bits) - 1;
  const int stored_add = -grouped_stored_offset(shape);
  int codebook_index[256];  // value + 128 -> its level's index, -1 for a value that is no level
  std::fill(std::begin(codebook_index), std::end(codebook_index), -1);
  for (int i = 0; i < 16; ++i) codebook_index[kGroupedCodebook[i] + 128] = i;
  if (shape.codebook) {
    for (int64_t i = 0; i < n * k; ++i)
      if (codebook_index[w[i] + 128] < 0)
        throw std::invalid_argument("grouped: value " + std::to_string(w[i]) + " is not one of the codebook's levels");
  } else if (shape.bits != 8)
    for (int64_t i = 0; i < n * k; ++i)
      if (w[i] < lowest || w[i] > highest)
        throw std::invalid_argument("grouped: " + std::to_string(shape.bits) + "-bit value " + std::to_string(w[i]) +
                                    " is outside " + std::to_string(lowest) + ".." + std::to_string(highest));
  check_params(shape, scale, min, d, dmin);
  const int64_t param_bytes = grouped_param_bytes(shape);
  runtime::parallel_for(tile_count(n), [&](int64_t t) {
    uint8_t* tile = packed + t * grouped_tile_bytes(shape);
    float sd[kTileRows] = {}, md[kTileRows] = {};  // the superblock's d and dmin per row
    for (int64_t g = 0; g < groups; ++g) {
      if (grouped_opens_superblock(shape, g))
        for (int r = 0; r < kTileRows; ++r) {
          const int64_t row = t * kTileRows + r, sb = row * superblocks + g * group / kGroupedSuperblock;
          sd[r] = row < n ? d[sb] : 0.0f, md[r] = row < n && dmin ? dmin[sb] : 0.0f;
          f16 hd = 0, hm = 0;
          float_to_f16_exact(sd[r], &hd), float_to_f16_exact(md[r], &hm);
          uint8_t* header = tile + grouped_header_offset(shape, g);
          std::memcpy(header + 2 * r, &hd, 2);
          if (shape.has_min) std::memcpy(header + 2 * (kTileRows + r), &hm, 2);
        }
      uint8_t* block = tile + grouped_group_offset(shape, g);
      float s[kTileRows] = {}, mn[kTileRows] = {};
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t row = t * kTileRows + r;
        auto stored = [&](int64_t j) {
          if (row >= n) return 0;
          const int value = w[row * k + g * group + j];
          return shape.codebook ? codebook_index[value + 128] : value + stored_add;
        };
        for (int64_t j = 0; j < group; ++j) {
          if (shape.bits == 8) {
            block[(j / 4 * kTileRows + r) * 4 + j % 4] = static_cast<uint8_t>(stored(j));
            continue;
          }
          if (j % 8 < 4)
            block[(j / 8 * kTileRows + r) * 4 + j % 4] = static_cast<uint8_t>((stored(j) & 15) | (stored(j + 4) & 15) << 4);
          if (shape.bits == 6 && j % 16 < 4) {
            int top = 0;
            for (int i = 0; i < 4; ++i) top |= (stored(j + 4 * i) >> 4) << 2 * i;
            block[grouped_value_bytes(group, 4) + (j / 16 * kTileRows + r) * 4 + j % 4] = static_cast<uint8_t>(top);
          }
        }
        if (row < n) {
          s[r] = scale[row * groups + g];
          if (min) mn[r] = min[row * groups + g];
        }
      }
      uint8_t* params = block + grouped_value_bytes(group, shape.bits);
      store_params(shape, s, sd, params);
      if (shape.has_min) store_params(shape, mn, md, params + param_bytes);
    }
  });
}

void grouped_unpack(const GroupedWeight& shape, int8_t* w, float* scale, float* min) {
  check_grouped_shape(shape);
  const int64_t k = shape.k, group = shape.group, groups = k / group;
  for (int64_t row = 0; row < shape.n; ++row) {
    const int r = static_cast<int>(row % kTileRows);
    const uint8_t* tile = shape.packed + row / kTileRows * grouped_tile_bytes(shape);
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* block = tile + grouped_group_offset(shape, g);
      for (int64_t j = 0; j < group; ++j) w[row * k + g * group + j] = static_cast<int8_t>(grouped_value(shape, block, r, j));
      float s, m;
      grouped_scale_min(shape, tile, g, r, s, m);
      scale[row * groups + g] = s;
      if (shape.has_min) min[row * groups + g] = m;
    }
  }
}

}  // namespace shrike
