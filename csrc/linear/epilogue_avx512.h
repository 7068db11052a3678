// Shared by the AVX-512 tile kernels, which hold two adjacent 8-row tiles in one zmm (16 output
// columns): pair loads from the two tiles' streams, and bias loads and output stores for up to
// 16 columns of one row.
// Internal linkage on purpose: these are compiled with AVX-512 flags and must never be merged
// with a same-named inline function from a translation unit built for another ISA.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace shrike::avx512vnni {
namespace {

// 32 bytes at `offset` of tile a (lanes 0-7) and of tile b (lanes 8-15).
inline __m512i load_pair(const uint8_t* a, const uint8_t* b, int64_t offset) {
  __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + offset));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offset)), 1);
}

// 8 int16 at `offset` of tile a and of tile b, sign-extended to 16 int32 lanes.
inline __m512i load_pair_i16(const uint8_t* a, const uint8_t* b, int64_t offset) {
  __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + offset));
  __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offset)), 1);
  return _mm512_cvtepi16_epi32(both);
}

// acc += dot products of the unsigned bytes u with the four int8 at q repeated in every lane.
// Written as asm so the activations stay an embedded-broadcast memory operand and acc is
// updated in place: from intrinsics GCC hoists every broadcast into a register and copies
// accumulators, which spills the 8-row blocks.
inline void dpbusd_broadcast(__m512i& acc, __m512i u, const int8_t* q) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(q)));
}

inline __mmask16 first_lanes(int valid) { return static_cast<__mmask16>((1u << valid) - 1); }

inline __m512 load_bias(const float* bias, int64_t col, int valid) {
  return bias ? _mm512_maskz_loadu_ps(first_lanes(valid), bias + col) : _mm512_setzero_ps();
}

// Stores the first `valid` of 16 outputs at out[offset]; bf16 rounds to nearest even like
// float_to_bf16 does for finite values (the AVX2 kernels do the same).
inline void store_row(void* out, DType dt, int64_t offset, __m512 y, int valid) {
  __mmask16 mask = first_lanes(valid);
  if (dt == DType::f32) return _mm512_mask_storeu_ps(static_cast<float*>(out) + offset, mask, y);
  __m512i b = _mm512_castps_si512(y);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + offset, mask, _mm512_cvtepi32_epi16(rounded));
}

// The lane type of tile_walk_x86.h: two adjacent tiles per zmm. 32 registers hold 8 rows x 2
// vectors of accumulators in prefill; decode rows take 8 tiles to hide the vpdpbusd latency.
struct ZmmLanes {
  using I = __m512i;
  using F = __m512;
  static constexpr int kTiles = 2, kLanes = 16;
  static constexpr int kDecodeTiles = 8, kPrefillRows = 8, kPrefillTiles = 4;
  static I load(const uint8_t* const* w, int64_t offset) { return load_pair(w[0], w[1], offset); }
  static I load_i16(const uint8_t* const* w, int64_t offset) { return load_pair_i16(w[0], w[1], offset); }
  static F load_f16(const uint8_t* const* w, int64_t offset) {
    __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[0] + offset));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo),
                                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[1] + offset)), 1));
  }
  static F load_i8(const uint8_t* const* w, int64_t offset) {
    __m128i both = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[0] + offset)),
                                      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[1] + offset)));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(both));
  }
  static void dpbusd(I& acc, I u, const int8_t* q) { dpbusd_broadcast(acc, u, q); }
  static I low4(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0f)); }
  static I high4(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f)); }
  static I flip(I v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
  // ((v >> S) & 3) << 4 per byte, S even: the 16-bit shifts move no bit across a byte under the mask
  template <int S>
  static I bits_at4(I v) {
    I shifted = S <= 4 ? _mm512_slli_epi16(v, 4 - S) : _mm512_srli_epi16(v, S - 4);
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0x30));
  }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  // table[idx] per byte for indices 0..15, table: 16 bytes in every 128-bit lane
  static I lookup16(I table, I idx) { return _mm512_shuffle_epi8(table, idx); }
  static I broadcast16(const uint8_t* p) { return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I splat(int32_t v) { return _mm512_set1_epi32(v); }
  static F splat(float v) { return _mm512_set1_ps(v); }
  static F as_float(I v) { return _mm512_castsi512_ps(v); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F load_acc(const float* p) { return _mm512_load_ps(p); }
  static void store_acc(float* p, F v) { _mm512_store_ps(p, v); }
  static F load_bias(const float* bias, int64_t col, int valid) { return avx512vnni::load_bias(bias, col, valid); }
  static void store_row(void* out, DType dt, int64_t offset, F y, int valid) {
    avx512vnni::store_row(out, dt, offset, y, valid);
  }
};

}  // namespace
}  // namespace shrike::avx512vnni
