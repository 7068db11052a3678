// Grouped linear layers y[M, N] = x[M, K] . W[N, K]^T (+ bias) whose weights keep the blocks of
// llama.cpp's GGUF quant types as they are: int8 (or 4-bit) values in groups of G = 16 or 32
// consecutive K of an output row, each group with a scale and, optionally, a min:
//   W[n, j] = scale[n, g] * w[n, j] - min[n, g]      (g = j / G)
// 4-bit values are 0..15 with mins (Q4_1, Q4_K) and -8..7 without (Q4_0); 6-bit values 0..63 with mins
// (Q5_1, Q5_K: 0..31) and -32..31 without (Q6_K; Q5_0: -16..15); or, for a codebook weight (IQ4_NL,
// IQ4_XS), 4-bit indices of kGroupedCodebook's 16 int8 levels, without mins. Scales and mins are held
// (GroupedParams) as float32; as fp16 where every one of the weight is exact in fp16 (the types whose
// blocks hold fp16 scales: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); or factored as the K-quants and IQ4_XS store
// them: an fp16 d (and dmin) per superblock of 256 K of a row times an int8 factor per group,
// scale = float(d) * float(factor), a product of 11 and 8 significant bits and so exact in float32.
// Every type of shrike.convert.gguf_blocks holds exactly in one of these forms (that module says how).
//
// The activations are quantized as llama.cpp's Q8_0: symmetric int8 per block of 32 K of a row,
// x_scale = max|x| / 127, q = round_half_even(x * (127 / max|x|)) (0 for an all-zero block). Per weight
// group the dot product is exact in int32 and groups are combined in fp32 in K order:
//   acc = fma(float(isum_g), scale[n, g] * x_scale[m, b], acc)       (b = the group's 32-block)
//   acc = fma(x_min[m, g], min[n, g], acc)                           (with mins only)
//   y = acc + (bias[n] or 0)
// where x_min[m, g] = -float(sum of q over the group) * x_scale[m, b], computed once per row, and
// scale and min are first made float32 exactly (widened from fp16, or the factored product).
// Every variant follows these float steps exactly, so all agree bit for bit with the reference.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

constexpr int64_t kGroupedActivationBlock = 32;
constexpr int64_t kGroupedSuperblock = 256;  // K of a factored weight's d and dmin
// The int8 levels a codebook weight's 4-bit indices select (IQ4_NL and IQ4_XS's non-linear grid).
constexpr int8_t kGroupedCodebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

enum class GroupedParams : int { kFloat32 = 0, kFloat16 = 1, kFactored = 2 };

struct GroupedWeight {
  const uint8_t* packed = nullptr;  // grouped_layout.h
  int64_t n = 0, k = 0;
  int64_t group = 32;  // 16 or 32
  int bits = 8;        // 8: int8 values; 4: 0..15 with mins, -8..7 without; 6: 0..63 with mins, -32..31 without
  bool has_min = false;
  bool codebook = false;  // bits 4 without mins only: a stored nibble i is the value kGroupedCodebook[i]
  GroupedParams params = GroupedParams::kFloat32;  // how scales and mins are held
};

// x: (m, k) float32/bfloat16; bias (n,) float32 or null; out (m, n) with rows out_stride apart (0: n), so
// the parts of a fused layer can each write their own columns of one output. Requires k % 32 == 0.
void grouped_linear(const void* x, DType x_dtype, int64_t m, const GroupedWeight& w, const float* bias, void* out,
                    DType out_dtype, int64_t out_stride = 0);

// Activations quantized by the rule above.
struct GroupedRows {
  int8_t* q;           // (m, k)
  float* x_scale;      // (m, k / 32)
  int32_t* group_sum;  // (m, k / group) sums of q
  float* x_min;        // (m, k / group) -group_sum * x_scale
};
void grouped_quantize(const void* x, DType x_dtype, int64_t m, int64_t k, int64_t group, const GroupedRows& rows);

struct GroupedProblem {
  const int8_t* q;
  const float* x_scale;
  const int32_t* group_sum;
  const float* x_min;
  GroupedWeight w;
  const float* bias;
  void* out;
  DType out_dtype;
  int64_t m;
  int64_t out_stride;  // elements from one output row to the next
};

// isa_name of the variant that runs an m-row call at the active level.
const char* grouped_variant(int64_t m);

#define SHRIKE_DECLARE_GROUPED_TILES void grouped_tiles(const GroupedProblem& p, int64_t tile_begin, int64_t tile_end);
// Rows [r0, r1) of x quantized by the rule above; every variant gives the same bytes and floats.
#define SHRIKE_DECLARE_GROUPED_QUANTIZE \
  void grouped_quantize_rows(const void* x, DType x_dtype, int64_t r0, int64_t r1, int64_t k, int64_t group, \
                             const GroupedRows& rows);
namespace ref { SHRIKE_DECLARE_GROUPED_TILES SHRIKE_DECLARE_GROUPED_QUANTIZE }
namespace avx2 { SHRIKE_DECLARE_GROUPED_TILES SHRIKE_DECLARE_GROUPED_QUANTIZE }
namespace avxvnni { SHRIKE_DECLARE_GROUPED_TILES }
namespace avx512vnni { SHRIKE_DECLARE_GROUPED_TILES }
namespace dotprod { SHRIKE_DECLARE_GROUPED_TILES }
#undef SHRIKE_DECLARE_GROUPED_TILES
#undef SHRIKE_DECLARE_GROUPED_QUANTIZE

}  // namespace shrike
