// Shared by the AVX2 tile kernels: the activation broadcast, and bias loads and output stores
// for one row of an 8-column tile.
// Internal linkage on purpose: these are compiled with AVX2 flags and must never be merged
// with a same-named inline function from a translation unit built for another ISA.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/bf16_avx2.h"
#include "common/dtype.h"

namespace shrike::avx2 {
namespace {

// Four int8 activations (4 consecutive K) repeated in every 32-bit lane.
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// GCC reassociates integer adds: a row's chain of pair-sum updates becomes a tree whose many
// maddubs results are all live at once, and they spill to the stack (the kernel ran at a third
// of its instruction bound). An empty asm on the accumulator after each update keeps the chain.
inline void pin_in_register(__m256i& v) { __asm__("" : "+x"(v)); }

inline __m256 load_bias(const float* bias, int64_t col, int valid) {
  if (!bias) return _mm256_setzero_ps();
  if (valid == 8) return _mm256_loadu_ps(bias + col);
  float tmp[8] = {};
  std::memcpy(tmp, bias + col, valid * sizeof(float));
  return _mm256_loadu_ps(tmp);
}

// Stores the first `valid` of 8 outputs at out[offset].
inline void store_row(void* out, DType dt, int64_t offset, __m256 y, int valid) {
  if (dt == DType::f32) {
    float* dst = static_cast<float*>(out) + offset;
    if (valid == 8) return _mm256_storeu_ps(dst, y);
    float tmp[8];
    _mm256_storeu_ps(tmp, y);
    std::memcpy(dst, tmp, valid * sizeof(float));
  } else {
    uint16_t* dst = static_cast<uint16_t*>(out) + offset;
    if (valid == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), to_bf16(y));
    uint16_t tmp[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), to_bf16(y));
    std::memcpy(dst, tmp, valid * sizeof(uint16_t));
  }
}

}  // namespace
}  // namespace shrike::avx2
