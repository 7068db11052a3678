// Dynamic per-row (per-token) int8 quantization of activations.
//
// Asymmetric, for W4A8, following the KleidiAI qai8dxp rule: the range [min, max] is widened
// to include 0, inv = 255 / (max - min) (1 when the range is empty), scale = 1 / inv, the zero
// point is chosen from the end with the smaller error, clamped to [-128, 127] and rounded to
// nearest even; q = clamp(round_half_away(x * inv) + zero, -128, 127), so x ~ (q - zero) * scale.
// Also returns the sum of q over each group of G values, which the GEMM needs to undo the +8
// offset of the stored weights.
//
// Symmetric, for W8A8, as vLLM's CPU path: scale = max|x| / 127, inv = 1 / scale (0 for an all
// zero row), q = round_half_even(x * inv), clamped to [-127, 127] (never reaches -128; keeping
// |q| <= 127 is what lets x86's maddubs sign trick run without int16 saturation).
#pragma once
#include <cstdint>

#include "common/bf16.h"
#include "common/dtype.h"

namespace shrike {

struct AsymRows {
  int8_t* q;           // (rows, K)
  float* scale;        // (rows,)
  int32_t* zero;       // (rows,)
  int32_t* group_sum;  // (rows, K / group)
};

struct SymRows {
  int8_t* q;     // (rows, K)
  float* scale;  // (rows,)
};

// x: (rows, K) float32 or bfloat16, contiguous; K % 16 == 0 and K % group == 0.
void quantize_asym(const void* x, DType dtype, int64_t rows, int64_t k, int64_t group, const AsymRows& out);
void quantize_sym(const void* x, DType dtype, int64_t rows, int64_t k, const SymRows& out);

// Per-variant kernels for float or bf16 rows; the dispatcher picks the element type.
#define SHRIKE_DECLARE_ACT_QUANT                                                                        \
  template <typename T>                                                                                 \
  void quantize_asym(const T* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out);          \
  template <typename T>                                                                                 \
  void quantize_sym(const T* x, int64_t rows, int64_t k, const SymRows& out);

namespace ref { SHRIKE_DECLARE_ACT_QUANT }
namespace avx2 { SHRIKE_DECLARE_ACT_QUANT }
namespace neon { SHRIKE_DECLARE_ACT_QUANT }
namespace sve2 { SHRIKE_DECLARE_ACT_QUANT }

#undef SHRIKE_DECLARE_ACT_QUANT

// Each variant's file instantiates its kernels for both element types, with its own ISA flags.
#define SHRIKE_INSTANTIATE_ACT_QUANT                                                                        \
  template void quantize_asym(const float* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out); \
  template void quantize_asym(const bf16* x, int64_t rows, int64_t k, int64_t group, const AsymRows& out);  \
  template void quantize_sym(const float* x, int64_t rows, int64_t k, const SymRows& out);                  \
  template void quantize_sym(const bf16* x, int64_t rows, int64_t k, const SymRows& out);

}  // namespace shrike
