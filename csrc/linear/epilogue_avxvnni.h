// The lane type of tile_walk_x86.h for AVX-VNNI: one tile per ymm, 256-bit VEX vpdpbusd.
// Internal linkage on purpose: compiled with AVX-VNNI flags, never merged with other ISAs' code.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "linear/epilogue_avx2.h"

namespace shrike::avxvnni {
namespace {

// VEX code has 16 ymm registers: 4 rows x 2 tiles keeps 8 accumulators, the weight vectors and
// the row broadcasts in registers; decode rows take 4 tiles to hide the vpdpbusd latency.
struct YmmLanes {
  using I = __m256i;
  using F = __m256;
  static constexpr int kTiles = 1, kLanes = 8;
  static constexpr int kDecodeTiles = 4, kPrefillRows = 4, kPrefillTiles = 2;
  static I load(const uint8_t* const* w, int64_t offset) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[0] + offset));
  }
  static I load_i16(const uint8_t* const* w, int64_t offset) {
    return _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[0] + offset)));
  }
  static F load_f16(const uint8_t* const* w, int64_t offset) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[0] + offset)));
  }
  static F load_i8(const uint8_t* const* w, int64_t offset) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[0] + offset))));
  }
  // Written as asm so acc is updated in place and each broadcast is used once: from intrinsics
  // GCC copies accumulators and hoists the broadcasts, which spills 16 ymm registers.
  static void dpbusd(I& acc, I u, const int8_t* q) {
    __m256i b;
    __asm__("vpbroadcastd %2, %1\n\t%{vex%} vpdpbusd %1, %3, %0"
            : "+x"(acc), "=&x"(b)
            : "m"(*reinterpret_cast<const int32_t*>(q)), "x"(u));
  }
  static I low4(I v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0f)); }
  static I high4(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f)); }
  static I flip(I v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
  // ((v >> S) & 3) << 4 per byte, S even: the 16-bit shifts move no bit across a byte under the mask
  template <int S>
  static I bits_at4(I v) {
    I shifted = S <= 4 ? _mm256_slli_epi16(v, 4 - S) : _mm256_srli_epi16(v, S - 4);
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x30));
  }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  // table[idx] per byte for indices 0..15, table: 16 bytes in every 128-bit lane
  static I lookup16(I table, I idx) { return _mm256_shuffle_epi8(table, idx); }
  static I broadcast16(const uint8_t* p) { return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I splat(int32_t v) { return _mm256_set1_epi32(v); }
  static F splat(float v) { return _mm256_set1_ps(v); }
  static F as_float(I v) { return _mm256_castsi256_ps(v); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F load_acc(const float* p) { return _mm256_load_ps(p); }
  static void store_acc(float* p, F v) { _mm256_store_ps(p, v); }
  static F load_bias(const float* bias, int64_t col, int valid) { return avx2::load_bias(bias, col, valid); }
  static void store_row(void* out, DType dt, int64_t offset, F y, int valid) {
    avx2::store_row(out, dt, offset, y, valid);
  }
};

}  // namespace
}  // namespace shrike::avxvnni
