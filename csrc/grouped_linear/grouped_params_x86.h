// A tile's 8 scales (or mins) in a ymm, in each of the weight's parameter forms (grouped_layout.h).
// Internal linkage on purpose: each ISA file compiles this with its own target flags.
#pragma once
#include <immintrin.h>

#include "grouped_linear/grouped_layout.h"

namespace shrike {
namespace {

// The 8 fp16 at p (a factored superblock's d or dmin) as float32.
inline __m256 load_header(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// A factored group's 8 scales (or mins): the superblock's d (or dmin), already widened, times the int8 factors.
inline __m256 factored_params(const uint8_t* params, __m256 d) {  // exact in float32
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(params)))));
}

// params: the group's 8 values; header: the superblock's 8 fp16 d (or dmin), read when factored.
inline __m256 load_params(const uint8_t* params, const uint8_t* header, GroupedParams form) {
  if (form == GroupedParams::kFloat16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(params)));
  if (form == GroupedParams::kFactored) return factored_params(params, load_header(header));
  return _mm256_loadu_ps(reinterpret_cast<const float*>(params));
}

}  // namespace
}  // namespace shrike
