// Unquantized linear layers y[M, N] = x[M, K] . W[N, K]^T (+ bias) on bf16 or fp32 weights, used
// for the lm_head and every layer a checkpoint keeps in 16/32-bit floats.
//
// Batch-invariant: every output element is reduced over K in one fixed order that depends only
// on K, never on M, on the row's position in the batch, or on how work is split over threads.
// A row's result is therefore the same whether it runs alone or with other rows.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

// x: (m, k) float32/bfloat16, contiguous; w: (n, k) row-major, contiguous, w_dtype float32 or
// bfloat16; bias: (n,) float32 or null; out: (m, n) float32/bfloat16.
void dense_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                  const float* bias, void* out, DType out_dtype);

}  // namespace shrike
