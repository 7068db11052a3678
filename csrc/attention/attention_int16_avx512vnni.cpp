// AVX-512 VNNI kernel of the int16-dot walk (attention/int16_walk.h): bf16 queries over an int8 cache,
// q . k and w . v both by vpdpwssd. Bit for bit its scalar model, attention_int16_ref.cpp.
// head_dim % 32 == 0 and <= 256 (the int32 dot of 256 int16 x int8 products cannot overflow).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "attention/exp_avx512.h"
#include "attention/int16_walk.h"
#include "common/bf16_avx512.h"

namespace shrike::avx512vnni_int16 {
namespace {

using namespace int16_walk;
using avx512::load16;
using avx512::store16;

inline __m512i load_i16(const int16_t* p) { return _mm512_loadu_si512(p); }
// acc += pairwise int16 products of x and the 32 int16 at p, summed into int32 lanes. Written as asm because GCC
// models the intrinsic as three-operand and copied each accumulator to a fresh register every step. The two loops
// that use it are kept out of line: inlined into the walk, whose constants GCC hoists into registers, their
// accumulators spilled to the stack (the walk ran 15-20% slower).
inline void dot_pairs(__m512i& acc, __m512i x, const int16_t* p) {
  __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "m"(*reinterpret_cast<const __m512i*>(p)));
}
// 32 int8 values as int16.
inline __m512i widen(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Lane u of the result is the sum of the lanes of a[u], for 8 vectors.
inline __m256i transpose_sum8(const __m512i* a) {
  __m256i h[8];
  for (int u = 0; u < 8; ++u) h[u] = _mm256_add_epi32(_mm512_castsi512_si256(a[u]), _mm512_extracti64x4_epi64(a[u], 1));
  __m256i s01 = _mm256_hadd_epi32(h[0], h[1]), s23 = _mm256_hadd_epi32(h[2], h[3]);
  __m256i s45 = _mm256_hadd_epi32(h[4], h[5]), s67 = _mm256_hadd_epi32(h[6], h[7]);
  __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

// q16 of one row into q16 (d), returns qf.
float quantize_query(const bf16* q, float scale, int64_t d, int16_t* q16) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 16)
    amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_mul_ps(load16(q + c), _mm512_set1_ps(scale))));
  const float qf = _mm512_reduce_max_ps(amax) / kLevels;
  for (int64_t c = 0; c < d; c += 16) {
    __m512i x = _mm512_setzero_si512();
    if (qf > 0.f) {
      x = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_mul_ps(load16(q + c), _mm512_set1_ps(scale)), _mm512_set1_ps(qf)));
      x = _mm512_max_epi32(_mm512_min_epi32(x, _mm512_set1_epi32(32767)), _mm512_set1_epi32(-32767));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + c), _mm512_cvtepi32_epi16(x));
  }
  return qf;
}

// The tile's keys [first, n) widened to int16, its values as key pairs, and their scales (0 for the other keys;
// their int16 keys are left as they were and never weigh: p = 0, w16 = 0).
// Word 2i of a pair vector is column i of the even key (word i of its widened row), word 2i + 1 that of the odd
// key (word 32 + i of the two rows side by side): kPairLow for columns 0-15, kPairHigh for 16-31.
alignas(64) constexpr int16_t kPairLow[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
alignas(64) constexpr int16_t kPairHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

void gather_tile(const PagedAttentionArgs& a, const AttentionWorkItem& w, int64_t t0, int64_t first, int64_t n,
                 const Scratch& s) {
  const int64_t d = a.head_dim;
  int64_t offset[kTileKeys];
  tile_rows(a, w, t0, first, n, offset);
  const int8_t* key_cache = static_cast<const int8_t*>(a.key_cache);
  const int8_t* value_cache = static_cast<const int8_t*>(a.value_cache);
  for (int64_t j = 0; j < kTileKeys; ++j) s.key_scale[j] = s.value_scale[j] = 0.f;
  for (int64_t j = first; j < n; ++j) {
    const int8_t* row = key_cache + offset[j];
    for (int64_t c = 0; c < d; c += 32) _mm512_storeu_si512(s.keys + j * d + c, widen(row + c));
    s.key_scale[j] = kv_int8_scale(row, d);
    s.value_scale[j] = kv_int8_scale(value_cache + offset[j], d);
  }
  const __m512i low = _mm512_load_si512(kPairLow), high = _mm512_load_si512(kPairHigh);
  for (int64_t j = first / 2 * 2; j < n; j += 2) {
    const int8_t* even = j >= first ? value_cache + offset[j] : nullptr;
    const int8_t* odd = j + 1 < n ? value_cache + offset[j + 1] : nullptr;
    int16_t* pairs = s.value_pairs + j * d;  // pair j / 2: (d, 2)
    for (int64_t c = 0; c < d; c += 32) {
      const __m512i e = even ? widen(even + c) : _mm512_setzero_si512();
      const __m512i o = odd ? widen(odd + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(pairs + 2 * c, _mm512_permutex2var_epi16(e, low, o));
      _mm512_storeu_si512(pairs + 2 * c + 32, _mm512_permutex2var_epi16(e, high, o));
    }
  }
}

// The tile's int32 dots q16 . k_j for 32 keys (keys outside [first, n): whatever, masked by the caller).
__attribute__((noinline)) void query_key_dots(const int16_t* q16, const int16_t* keys, int64_t first, int64_t n,
                                              int64_t d, __m512i* dot) {
  __m256i part[4];
  for (int b = 0; b < 4; ++b) {
    if (8 * b >= n || 8 * b + 8 <= first) {
      part[b] = _mm256_setzero_si256();
      continue;
    }
    __m512i acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm512_setzero_si512();
    for (int64_t c = 0; c < d; c += 32) {
      const __m512i qv = load_i16(q16 + c);
      for (int u = 0; u < 8; ++u) dot_pairs(acc[u], qv, keys + (8 * b + u) * d + c);
    }
    part[b] = transpose_sum8(acc);
  }
  dot[0] = _mm512_inserti64x4(_mm512_castsi256_si512(part[0]), part[1], 1);
  dot[1] = _mm512_inserti64x4(_mm512_castsi256_si512(part[2]), part[3], 1);
}

// acc[0 .. 16 NV) = fma(acc, rescale, float(sum over pairs of w16 . v) x wf). The NV accumulators are separate
// variables: as an array GCC kept them on the stack (a load and a store around every vpdpwssd).
template <int NV>
__attribute__((noinline)) void accumulate_slice(float* acc, const int16_t* pairs, int64_t d,
                                                const int32_t* weight_pairs, int64_t first_pair, int64_t n_pairs,
                                                float rescale, float weight_factor) {
  static_assert(NV == 2 || NV == 4 || NV == 8);
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  for (int64_t i = first_pair; i < n_pairs; ++i) {
    const __m512i wv = _mm512_set1_epi32(weight_pairs[i]);
    const int16_t* p = pairs + i * 2 * d;
    dot_pairs(s0, wv, p), dot_pairs(s1, wv, p + 32);
    if constexpr (NV > 2) dot_pairs(s2, wv, p + 64), dot_pairs(s3, wv, p + 96);
    if constexpr (NV > 4) {
      dot_pairs(s4, wv, p + 128), dot_pairs(s5, wv, p + 160), dot_pairs(s6, wv, p + 192), dot_pairs(s7, wv, p + 224);
    }
  }
  const __m512i sum[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  for (int u = 0; u < NV; ++u) {
    const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[u]), _mm512_set1_ps(weight_factor));
    _mm512_storeu_ps(acc + 16 * u, _mm512_fmadd_ps(_mm512_loadu_ps(acc + 16 * u), _mm512_set1_ps(rescale), part));
  }
}

// The sum of the 32 lanes of p0, p1 in tile_sum's order (attention_int16_ref.cpp).
inline float tile_sum(__m512 p0, __m512 p1) {
  const __m512 t = _mm512_add_ps(p0, p1);
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
  const __m128 x4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 x2 = _mm_add_ps(x4, _mm_movehl_ps(x4, x4));
  return _mm_cvtss_f32(_mm_add_ss(x2, _mm_shuffle_ps(x2, x2, 1)));
}

// One row of the item through the tile at t0 (n keys, of which it sees mask).
void walk_row(const Scratch& s, int64_t r, int64_t d, int64_t first, int64_t n, uint32_t mask) {
  const __mmask16 m0 = static_cast<__mmask16>(mask), m1 = static_cast<__mmask16>(mask >> 16);
  __m512i dot[2];
  query_key_dots(s.q + r * d, s.keys, first, n, d, dot);
  const __m512 qf = _mm512_set1_ps(s.query_factor[r]);
  const __m512 s0 = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[0]), _mm512_mul_ps(qf, _mm512_loadu_ps(s.key_scale)));
  const __m512 s1 = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[1]), _mm512_mul_ps(qf, _mm512_loadu_ps(s.key_scale + 16)));
  const float tile_max = std::max(_mm512_mask_reduce_max_ps(m0, s0), _mm512_mask_reduce_max_ps(m1, s1));
  const float old_max = s.row_max[r], new_max = std::max(old_max, tile_max);
  const float rescale = _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(old_max - new_max)));
  const __m512 p0 = _mm512_maskz_mov_ps(m0, exp_nonpositive(_mm512_sub_ps(s0, _mm512_set1_ps(new_max))));
  const __m512 p1 = _mm512_maskz_mov_ps(m1, exp_nonpositive(_mm512_sub_ps(s1, _mm512_set1_ps(new_max))));
  s.row_sum[r] = std::fma(s.row_sum[r], rescale, tile_sum(p0, p1));
  s.row_max[r] = new_max;
  const __m512 w0 = _mm512_maskz_mul_ps(m0, p0, _mm512_loadu_ps(s.value_scale));
  const __m512 w1 = _mm512_maskz_mul_ps(m1, p1, _mm512_loadu_ps(s.value_scale + 16));
  const float weight_max = std::max(0.f, std::max(_mm512_reduce_max_ps(w0), _mm512_reduce_max_ps(w1)));
  const float weight_factor = weight_max / kLevels;
  __m512i w16_0 = _mm512_setzero_si512(), w16_1 = _mm512_setzero_si512();
  if (weight_factor > 0.f) {
    const __m512 wf = _mm512_set1_ps(weight_factor);
    const __m512i top = _mm512_set1_epi32(32767);
    w16_0 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_div_ps(w0, wf)), top);
    w16_1 = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_div_ps(w1, wf)), top);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.weights), _mm512_cvtepi32_epi16(w16_0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s.weights + 16), _mm512_cvtepi32_epi16(w16_1));
  const int32_t* weight_pairs = reinterpret_cast<const int32_t*>(s.weights);
  const int64_t first_pair = first / 2, n_pairs = (n + 1) / 2;
  float* acc = s.acc + r * d;
  auto slice = [&](auto columns, int64_t c) {  // columns / 16 accumulators in registers
    accumulate_slice<decltype(columns)::value / 16>(acc + c, s.value_pairs + 2 * c, d, weight_pairs, first_pair,
                                                    n_pairs, rescale, weight_factor);
  };
  int64_t c = 0;
  for (; c + 128 <= d; c += 128) slice(std::integral_constant<int, 128>{}, c);
  if (c + 64 <= d) slice(std::integral_constant<int, 64>{}, c), c += 64;
  if (c < d) slice(std::integral_constant<int, 32>{}, c);
}

}  // namespace

void attend(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const int64_t d = a.head_dim, rows = w.q_count * (a.num_heads / a.num_kv_heads);
  Scratch s;
  lay_out_scratch(rows, d, scratch, s);
  const RowKeys item = start_item(a, w, s, quantize_query);
  const int64_t key_begin = item.lo, key_end = item.hi;
  for (int64_t t0 = first_tile(key_begin); t0 < key_end; t0 += kTileKeys) {
    const int64_t first = std::max<int64_t>(0, key_begin - t0), n = std::min(kTileKeys, key_end - t0);
    gather_tile(a, w, t0, first, n, s);
    for (int64_t r = 0; r < rows; ++r) {
      const RowKeys k = row_keys(a, w, r);
      const int64_t lo = std::max(k.lo, t0) - t0, hi = std::min(k.hi, t0 + n) - t0;
      if (lo >= hi) continue;
      const uint32_t mask = static_cast<uint32_t>(((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1));
      walk_row(s, r, d, first, n, mask);
    }
  }
  finish_item(a, w, s, [d](bf16* out, const float* acc, float factor) {
    const __m512 f = _mm512_set1_ps(factor);
    for (int64_t c = 0; c < d; c += 16) store16(out + c, _mm512_mul_ps(_mm512_loadu_ps(acc + c), f));
  });
}

}  // namespace shrike::avx512vnni_int16
