// LoRA: each row's low-rank update added into a linear's output, rows grouped by adapter.
//
// The adapters of one linear live in fixed slots (max_loras of them, up to max_rank each), so a
// recorded tape keeps pointing at the same memory while adapters load and unload. A linear fused
// from several checkpoint projections (q/k/v, gate/up) has one shrink matrix per part; part p's
// update lands in its own output columns.
#pragma once
#include <cstdint>

#include "common/dtype.h"
#include "common/variants.h"

namespace shrike::lora {

struct Slots {
  const float* shrink = nullptr;  // A: (max_loras, parts * max_rank, k), part p's rows at p * max_rank
  const float* expand = nullptr;  // B^T * scaling: (max_loras, max_rank, n)
  const int32_t* ranks = nullptr;  // (max_loras,) rank of the slot's adapter; 0: the slot adds nothing
  const int32_t* part_end = nullptr;  // (parts,) end output column of each part, the last being n
  int64_t max_loras = 0, max_rank = 0, parts = 0, n = 0, k = 0;
};

// out (rows, n) += for each row t whose slot s = row_slots[t] is >= 0:
//   for each part p, the part's columns of (x_t . A_{s,p}^T) . B_{s,p}^T * scaling
// computed in float32; x and out are float32 or bf16 (out rounded once after the add).
void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype);

OpVariants lora_variants();

// One implementation (lora_impl.h) compiled per level, without contracted multiply-adds, so every level
// gives the scalar reference's bits.
using ApplyFn = void (*)(const Slots&, const void*, DType, const int32_t*, int64_t, void*, DType);
namespace ref {
void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype);
}
namespace avx512vnni {
void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype);
}
namespace avx2 {
void apply(const Slots& w, const void* x, DType x_dtype, const int32_t* row_slots, int64_t rows, void* out,
           DType out_dtype);
}

}  // namespace shrike::lora
