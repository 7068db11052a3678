// Weight-only quantized linear layers (W4A16 / W8A16): y[M, N] = x[M, K] . W[N, K]^T (+ bias) with
// int4 or int8 weights and 16/32-bit float activations. Weights are dequantized in registers;
// activations are never quantized.
//
// W[c, j] = fma(u, scale[c, g], offset[c, g]) in float32, where u is the stored unsigned integer
// (int4: value + 8, two per byte, low nibble first; int8: value + 128), g = j / group and
// offset = -zero * scale with `zero` in the same unsigned range. With bf16/fp16 scales the fma
// is exact: W is the checkpoint's dequantized weight, not rounded to 16 bits.
// The dot products then follow dense_linear's reduction order (dense/dense_kernels.h), so a
// weight-only layer gives exactly the bits dense_linear gives on the dequantized float32 weight,
// and is batch-invariant in the same way.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

struct WeightOnlyWeight {
  const uint8_t* q = nullptr;  // (n, k / 2) int4 nibbles or (n, k) int8, unsigned
  const float* scale = nullptr;  // (n, k / group)
  const float* offset = nullptr;  // (n, k / group): -zero * scale
  // (k,) or null. Act-order checkpoints are reordered at load so that groups are contiguous;
  // column j of W then multiplies x[:, perm[j]].
  const int32_t* perm = nullptr;
  int bits = 4;  // 4 or 8
  int64_t n = 0, k = 0, group = 0;  // k % 32 == 0, group % 32 == 0, k % group == 0
};

// x: (m, k) float32/bfloat16, contiguous; bias: (n,) float32 or null; out: (m, n) float32/bfloat16.
void weight_only_linear(const void* x, DType x_dtype, int64_t m, const WeightOnlyWeight& w, const float* bias,
                        void* out, DType out_dtype);

}  // namespace shrike
