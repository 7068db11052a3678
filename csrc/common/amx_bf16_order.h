// The arithmetic of one AMX tdpbf16ps accumulation, written out for the scalar references of
// the kernels that run on it (dense GEMM, attention), so that those references give the tile
// unit's bits and every AMX-BF16 kernel can be tested for equality, not closeness.
//
// Probed on Sapphire Rapids (0 mismatches in 1.3 M outputs, simpler orders mismatch 9-37%):
// for each output element, one instruction takes up to 16 pairs of K (a row of A, a row pair of
// B) and computes
//   even = fma chain over the pairs' even elements, starting from 0, in K order
//   odd  = fma chain over the odd elements, likewise
//   c    = c + (even + odd)
// with denormal inputs (including the incoming c) read as zero and every result flushed to zero.
// A longer K is a sequence of such instructions, each adding into c.
#pragma once
#include <cmath>
#include <cstdint>

namespace shrike {
namespace {

inline float amx_flush(float x) { return std::fabs(x) < 1.17549435e-38f ? std::copysign(0.f, x) : x; }

// c plus one tdpbf16ps step over `pairs` (<= 16) pairs: a[2i], a[2i + 1] against b[2i], b[2i + 1]
// (a, b: values already of bf16 precision, given as floats).
inline float amx_bf16_step(float c, const float* a, const float* b, int pairs) {
  float even = 0.f, odd = 0.f;
  for (int i = 0; i < pairs; ++i) {
    even = amx_flush(std::fma(amx_flush(a[2 * i]), amx_flush(b[2 * i]), even));
    odd = amx_flush(std::fma(amx_flush(a[2 * i + 1]), amx_flush(b[2 * i + 1]), odd));
  }
  return amx_flush(amx_flush(c) + amx_flush(even + odd));
}

}  // namespace
}  // namespace shrike
