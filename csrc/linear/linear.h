// Low-bit linear layers y[M, N] = x[M, K] . W[N, K]^T (+ bias) on packed weights (layout.h).
//
// W4A8: W int4 with one scale per `group` consecutive K of an output row; x quantized per row
// (asymmetric int8, quant/act_quant.h). Per group the dot product of (q - zero) with the
// weights is accumulated exactly in int32; groups are combined in fp32 in K order:
//   acc = fma(float(isum_g), w_scale[n, g], acc);   y = fma(acc, x_scale[m], bias[n] or 0)
// W8A8: W int8 with one scale per row; x quantized per row (symmetric int8):
//   y = fma(float(isum), x_scale[m] * w_scale[n], bias[n] or 0)
// Every variant follows these float steps exactly, so all variants agree bit for bit with the
// scalar reference (integer sums are exact; the float operations and their order are fixed).
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

// x: (m, k) float32/bfloat16; packed: see layout.h; bias: (n,) float32 or null; out: (m, n).
// Requires k % group == 0, group in {32, 64, 128}.
void w4a8_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const uint8_t* packed, int64_t n,
                 int64_t group, const float* bias, void* out, DType out_dtype);
// Requires k % 16 == 0.
void w8a8_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const uint8_t* packed, int64_t n,
                 const float* bias, void* out, DType out_dtype);

// isa_name of the variant whose kernels run an m-row call with this k and W4A8 group (0 for
// W8A8) at the active level (levels without kernels of their own run those of the level below).
const char* linear_variant(int64_t m, int64_t k, int64_t group);

// Quantized activations plus everything else one tile kernel call needs.
struct W4A8Problem {
  const int8_t* q;             // (m, k)
  const float* x_scale;        // (m,)
  const int32_t* x_zero;       // (m,)
  const int32_t* x_group_sum;  // (m, k / group)
  const int8_t* q_tiles;       // (m / 16, k / 64, 16, 64) q as AMX activation tiles, set when the amx kernel runs
  const uint8_t* packed;
  const float* bias;  // (n,) or null
  void* out;          // (m, n)
  DType out_dtype;
  int64_t m, n, k, group;
};

struct W8A8Problem {
  const int8_t* q;       // (m, k)
  const float* x_scale;  // (m,)
  const int32_t* x_sum;  // (m,) sum of q over k, for kernels that offset the weights to unsigned
  const int8_t* q_tiles;  // (m / 16, k / 64, 16, 64) q as AMX activation tiles, set when the amx kernel runs
  const uint8_t* packed;
  const float* bias;
  void* out;
  DType out_dtype;
  int64_t m, n, k;
};

// The GEMM alone, on activations quantized already (by the rule above, e.g. where they were
// produced); w4a8_linear and w8a8_linear are quantize-then-this.
void w4a8_linear_quantized(const W4A8Problem& p);
void w8a8_linear_quantized(const W8A8Problem& p);

// Each variant computes all m rows for output tiles [tile_begin, tile_end).
#define SHRIKE_DECLARE_LINEAR_TILES                                              \
  void w4a8_tiles(const W4A8Problem& p, int64_t tile_begin, int64_t tile_end); \
  void w8a8_tiles(const W8A8Problem& p, int64_t tile_begin, int64_t tile_end);

namespace ref { SHRIKE_DECLARE_LINEAR_TILES }
namespace avx2 { SHRIKE_DECLARE_LINEAR_TILES }
namespace avxvnni { SHRIKE_DECLARE_LINEAR_TILES }
namespace avx512vnni { SHRIKE_DECLARE_LINEAR_TILES }
namespace amx {  // k % 64 == 0 (whole activation tiles) and W4A8 groups of 64 or 128; rows past m / 16 * 16 run avx512vnni
SHRIKE_DECLARE_LINEAR_TILES
}
namespace dotprod { SHRIKE_DECLARE_LINEAR_TILES }
namespace i8mm { SHRIKE_DECLARE_LINEAR_TILES }
namespace sve2 { SHRIKE_DECLARE_LINEAR_TILES }

#undef SHRIKE_DECLARE_LINEAR_TILES

}  // namespace shrike
