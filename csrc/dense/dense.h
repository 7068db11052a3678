// Unquantized linear layers y[M, N] = x[M, K] . W[N, K]^T (+ bias) on bf16 or fp32 weights, used
// for the lm_head and every layer a checkpoint keeps in 16/32-bit floats.
//
// Batch-invariant: every output element is reduced over K in one fixed order that depends only
// on K and on the variant (dense_kernels.h: the lanes order, or the AMX tile order for bf16 x bf16
// at the amx level), never on M, on the row's position in the batch, or on how work is split over
// threads. A row's result is therefore the same whether it runs alone or with other rows.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace shrike {

// How the weight is stored. rows: (n, k) row-major, float32 or bfloat16. tiles: bfloat16 packed by
// dense_pack_tiles (dense_tiles.h), the operand layout of the AMX-BF16 kernel, which reads it as is
// (a rows weight it packs panel by panel on every call). Below the amx level a tiles weight runs on
// the scalar reference of the tile order: same bits, far slower.
enum class DenseLayout { rows, tiles };

// x: (m, k) float32/bfloat16, contiguous (bfloat16 for a tiles weight); w: see DenseLayout, w_dtype
// float32 or bfloat16; bias: (n,) float32 or null; out: (m, n) float32/bfloat16.
void dense_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                  const float* bias, void* out, DType out_dtype, DenseLayout w_layout = DenseLayout::rows);

// The variant dense_linear runs for these operand dtypes at the active kernel level (an Isa name;
// "amx" is the tile order, every other one the lanes order).
const char* dense_variant(DType x_dtype, DType w_dtype);

}  // namespace shrike
