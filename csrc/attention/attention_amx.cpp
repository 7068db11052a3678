// AMX attention walk (attention/amx_walk.h): bf16 queries over a bf16 or int8 cache, head_dim % 32 == 0.
// Tile registers: tmm0-3 fp32 (or, for int8 scores, int32) accumulators (16 x 16), tmm4-5 A operands (16 rows
// x 64 bytes: keys, then P), tmm6-7 B operands (16 rows x 16 columns x 4 bytes: queries, then values).
// attention_amx_ref.cpp performs the same operations in scalar code; compiled, like it, without
// floating-point contraction (kernels.cmake), so only the fused multiply-adds written here are fused.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "attention/amx_walk.h"
#include "attention/exp_avx512.h"
#include "attention/kv_int8.h"
#include "common/amx_tile_config.h"  // configure_tiles: every tile register 16 rows x 64 bytes

namespace shrike::amx {
namespace {

using namespace amx_walk;

// Where a 16-key sub-tile's rows are for the A operand: straight in the cache, or in k_rows.
struct KeyRows {
  const void* rows = nullptr;  // bf16 or int8 rows; nullptr: no key of the sub-tile is walked
  int64_t stride_bytes = 0;
};

// Row-block geometry and cache addressing of one work item.
struct Walk {
  const PagedAttentionArgs& a;
  const AttentionWorkItem& w;
  int64_t d, group, token0, head_row;  // head_row: cache elements of one (slot, head)
  Scratch s;

  const void* cache_row(const void* cache, int64_t p) const {
    const int64_t e = (slot_of(a, w.seq, p) * a.num_kv_heads + w.kv_head) * head_row;
    return a.cache_dtype == DType::i8 ? static_cast<const void*>(static_cast<const int8_t*>(cache) + e)
                                      : static_cast<const void*>(static_cast<const bf16*>(cache) + e);
  }
};

// The rows' queries as Q^T in B layout, per 16-row tile g: q_t[g][i][lane] = the pair (q[2i], q[2i + 1])
// of row 16g + lane, as 32-bit units; lanes past the rows are 0.
void pack_queries(const Walk& k, const ItemRows& b) {
  const int64_t pairs = k.d / 2;
  uint32_t* q_t = reinterpret_cast<uint32_t*>(k.s.q_t);
  std::memset(q_t, 0, (b.rows + kRowBlock - 1) / kRowBlock * kRowBlock * pairs * sizeof(uint32_t));
  const bf16* q = static_cast<const bf16*>(k.a.q);
  for (int64_t i = 0; i < b.rows; ++i) {
    const int64_t r = b.first_row + i, t = r / k.group, g = r % k.group;
    const bf16* row = q + ((k.token0 + t) * k.a.num_heads + k.w.kv_head * k.group + g) * k.d;
    uint32_t* dst = q_t + (i / 16) * pairs * 16 + i % 16;
    for (int64_t j = 0; j < pairs; ++j) std::memcpy(dst + j * 16, row + 2 * j, 4);
  }
}

// 16 floats from 16 bf16.
inline __m512 load_bf16(const bf16* src) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// int8 cache: each row's query as two int8 terms (amx_walk.h) in tdpbssd's B layout, per 16-row tile g:
// byte (c / 4, lane, c % 4) of the tile's hi and lo arrays holds dimension c of row 16g + lane; dimensions
// past head_dim and lanes past the rows are 0. query_factor[i] = qf / 128 of row i (0 past the rows).
void pack_queries_int8(const Walk& k, const ItemRows& b) {
  const int64_t d = k.d, dp = padded64(d);
  int8_t* hi = reinterpret_cast<int8_t*>(k.s.q_t);
  int8_t* lo = hi + kItemRows * dp;
  const int64_t used = (b.rows + 15) / 16 * 16 * dp;
  std::memset(hi, 0, used);
  std::memset(lo, 0, used);
  std::memset(k.s.query_factor, 0, kItemRows * sizeof(float));
  const bf16* q = static_cast<const bf16*>(k.a.q);
  const __m512i hi_max = _mm512_set1_epi32(127), lo_max = _mm512_set1_epi32(1 << (kQueryLowBits - 1));
  for (int64_t i = 0; i < b.rows; ++i) {
    const int64_t r = b.first_row + i, t = r / k.group, g = r % k.group;
    const bf16* row = q + ((k.token0 + t) * k.a.num_heads + k.w.kv_head * k.group + g) * d;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t c = 0; c < d; c += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(load_bf16(row + c)));
    const float qf = _mm512_reduce_max_ps(amax) / 127.f;
    k.s.query_factor[i] = qf / kQueryLowScale;
    if (!(qf > 0.f)) continue;
    const int64_t at = (i / 16) * 16 * dp + (i % 16) * 4;
    for (int64_t c = 0; c < d; c += 16) {
      const __m512 x = _mm512_div_ps(load_bf16(row + c), _mm512_set1_ps(qf));
      __m512i h = _mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      h = _mm512_max_epi32(_mm512_min_epi32(h, hi_max), _mm512_sub_epi32(_mm512_setzero_si512(), hi_max));
      const __m512 rest = _mm512_mul_ps(_mm512_sub_ps(x, _mm512_cvtepi32_ps(h)), _mm512_set1_ps(kQueryLowScale));
      __m512i l = _mm512_cvt_roundps_epi32(rest, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      l = _mm512_max_epi32(_mm512_min_epi32(l, lo_max), _mm512_sub_epi32(_mm512_setzero_si512(), lo_max));
      alignas(16) int8_t hb[16], lb[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(hb), _mm512_cvtepi32_epi8(h));
      _mm_store_si128(reinterpret_cast<__m128i*>(lb), _mm512_cvtepi32_epi8(l));
      for (int quad = 0; quad < 4; ++quad) {
        std::memcpy(hi + at + (c / 4 + quad) * 64, hb + 4 * quad, 4);
        std::memcpy(lo + at + (c / 4 + quad) * 64, lb + 4 * quad, 4);
      }
    }
  }
}

inline __m256i bits(__m256bh v) { return (__m256i)v; }

// The A operand of sub-tile u of the tile at t0, and each walked key's score factor (softmax scale,
// times its int8 scale). Keys outside [key_begin, key_end) are never seen by a row: their rows
// are whatever the cache holds (a direct load) or zeros. int8 rows are loaded as the cache holds them
// when a sub-tile lies in one block and head_dim is a multiple of 64, else copied, zero-padded, to k_rows.
KeyRows key_rows(const Walk& k, const ItemRows& b, int64_t t0, int u) {
  const int64_t first = t0 + u * kSubTileKeys;
  const int64_t begin = std::max(first, b.key_begin), end = std::min(first + kSubTileKeys, b.key_end);
  if (begin >= end) return {};
  float* factor = k.s.key_factor + u * kSubTileKeys;
  const bool in_one_block = k.a.block_size % kSubTileKeys == 0;
  const int64_t stride = k.a.num_kv_heads * k.head_row;  // cache elements from one slot's row to the next
  if (k.a.cache_dtype == DType::i8) {
    const int64_t dp = padded64(k.d);
    if (in_one_block && dp == k.d) {
      const int8_t* rows = static_cast<const int8_t*>(k.cache_row(k.a.key_cache, first));
      for (int64_t j = 0; j < kSubTileKeys; ++j)
        factor[j] = first + j >= begin && first + j < end ? kv_int8_scale(rows + j * stride, k.d) * k.a.scale : 0.f;
      return {rows, stride};
    }
    int8_t* rows = reinterpret_cast<int8_t*>(k.s.k_rows) + u * kSubTileKeys * dp;
    for (int64_t j = 0; j < kSubTileKeys; ++j) {
      int8_t* dst = rows + j * dp;
      const int64_t p = first + j;
      std::memset(dst, 0, dp);
      factor[j] = 0.f;
      if (p < begin || p >= end) continue;
      const int8_t* src = static_cast<const int8_t*>(k.cache_row(k.a.key_cache, p));
      std::memcpy(dst, src, k.d);
      factor[j] = kv_int8_scale(src, k.d) * k.a.scale;
    }
    return {rows, dp};
  }
  if (in_one_block) {
    for (int64_t j = 0; j < kSubTileKeys; ++j) factor[j] = k.a.scale;
    return {k.cache_row(k.a.key_cache, first), stride * 2};
  }
  bf16* rows = k.s.k_rows + u * kSubTileKeys * k.d;
  for (int64_t j = 0; j < kSubTileKeys; ++j) {
    bf16* dst = rows + j * k.d;
    const int64_t p = first + j;
    factor[j] = k.a.scale;
    if (p < begin || p >= end) std::memset(dst, 0, k.d * sizeof(bf16));
    else std::memcpy(dst, k.cache_row(k.a.key_cache, p), k.d * sizeof(bf16));
  }
  return {rows, k.d * 2};
}

// s_t (32 keys x 32 rows) = K . Q^T of row block `block` for the walked sub-tiles; `two` row tiles when
// the block has more than 16 rows.
template <bool two>
void key_scores(const Walk& k, const KeyRows* keys, int64_t block) {
  const int64_t pairs = k.d / 2;
  const bf16* q0 = k.s.q_t + block * kRowBlock * k.d;
  const bf16* q1 = q0 + pairs * 32;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < k.d; c += 32) {  // 32 of head_dim per instruction: B rows are pairs c/2 .. c/2 + 15
    _tile_loadd(6, q0 + c * 16, 64);
    if (two) _tile_loadd(7, q1 + c * 16, 64);
    if (keys[0].rows) {
      _tile_loadd(4, static_cast<const bf16*>(keys[0].rows) + c, keys[0].stride_bytes);
      _tile_dpbf16ps(0, 4, 6);
      if (two) _tile_dpbf16ps(1, 4, 7);
    }
    if (keys[1].rows) {
      _tile_loadd(5, static_cast<const bf16*>(keys[1].rows) + c, keys[1].stride_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if (two) _tile_dpbf16ps(3, 5, 7);
    }
  }
  float* s_t = k.s.s_t;  // tile (u, g) holds keys 16u.., rows 16g..
  constexpr int64_t ld = kRowBlock * 4;
  if (keys[0].rows) {
    _tile_stored(0, s_t, ld);
    if (two) _tile_stored(1, s_t + 16, ld);
  }
  if (keys[1].rows) {
    _tile_stored(2, s_t + 16 * kRowBlock, ld);
    if (two) _tile_stored(3, s_t + 16 * kRowBlock + 16, ld);
  }
}

// int8 cache: the scores of the item's 16-row tile g over the walked sub-tiles, into s_t's columns
// 16 (g % 2) .. + 15 as float(128 (K . hi) + K . lo) x qf / 128 (softmax_step applies the key factor).
void key_scores_int8(const Walk& k, const KeyRows* keys, int64_t g) {
  const int64_t dp = padded64(k.d);
  const int8_t* hi = reinterpret_cast<const int8_t*>(k.s.q_t) + g * 16 * dp;
  const int8_t* lo = hi + kItemRows * dp;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < dp; c += 64) {  // 64 of head_dim per instruction: B rows are quads c/4 .. c/4 + 15
    _tile_loadd(6, hi + c * 16, 64);
    _tile_loadd(7, lo + c * 16, 64);
    if (keys[0].rows) {
      _tile_loadd(4, static_cast<const int8_t*>(keys[0].rows) + c, keys[0].stride_bytes);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
    }
    if (keys[1].rows) {
      _tile_loadd(5, static_cast<const int8_t*>(keys[1].rows) + c, keys[1].stride_bytes);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
  }
  int32_t* s_hi = k.s.s_int;  // (32 keys, 16 rows)
  int32_t* s_lo = s_hi + kTileKeys * 16;
  const __m512 query_factor = _mm512_loadu_ps(k.s.query_factor + 16 * g);
  float* s_t = k.s.s_t + 16 * (g % 2);
  for (int u = 0; u < 2; ++u) {
    if (!keys[u].rows) continue;
    if (u == 0) {
      _tile_stored(0, s_hi, 64);
      _tile_stored(1, s_lo, 64);
    } else {
      _tile_stored(2, s_hi + 16 * 16, 64);
      _tile_stored(3, s_lo + 16 * 16, 64);
    }
    for (int64_t j = u * kSubTileKeys; j < (u + 1) * kSubTileKeys; ++j) {
      const __m512i whole = _mm512_add_epi32(_mm512_slli_epi32(_mm512_loadu_si512(s_hi + j * 16), kQueryLowBits),
                                             _mm512_loadu_si512(s_lo + j * 16));
      _mm512_storeu_ps(s_t + j * kRowBlock, _mm512_mul_ps(_mm512_cvtepi32_ps(whole), query_factor));
    }
  }
}

// The bytes of bf16(m) for m = 0 .. 127, as two 128-entry tables, and the order in which 64 int8 of a row
// are taken so that interleaving them in 128-bit lanes leaves the pairs in column order.
struct Int8ToBf16 {
  __m512i low0, low1, high0, high1, order;
};

struct Int8ToBf16Bytes {
  alignas(64) uint8_t low[128], high[128], order[64];
  Int8ToBf16Bytes() {
    for (int m = 0; m < 128; ++m) {
      const bf16 v = float_to_bf16(static_cast<float>(m));
      low[m] = static_cast<uint8_t>(v & 0xff), high[m] = static_cast<uint8_t>(v >> 8);
    }
    // Lane L, byte b of the taken row: column 16 (b / 4) + 4L + b % 4, so that its bytes 0-7 (8-15) become,
    // after two unpack steps, columns 0-31 (32-63) in order.
    for (int pos = 0; pos < 64; ++pos) order[pos] = static_cast<uint8_t>(16 * (pos % 16 / 4) + 4 * (pos / 16) + pos % 4);
  }
};

Int8ToBf16 int8_to_bf16_tables() {
  static const Int8ToBf16Bytes bytes;
  return {_mm512_load_si512(bytes.low), _mm512_load_si512(bytes.low + 64), _mm512_load_si512(bytes.high),
          _mm512_load_si512(bytes.high + 64), _mm512_load_si512(bytes.order)};
}

// Columns c .. c + 63 (`n` of them, 32 or 64) of two int8 rows x and y (nullptr: zeros) as bf16 pairs
// (x_c, y_c) at dst: exact, by table lookup of |v| and its sign bit.
inline void widen_pairs(const Int8ToBf16& t, const int8_t* x, const int8_t* y, int64_t n, bf16* dst) {
  const __mmask64 mask = n == 64 ? ~0ull : (1ull << n) - 1;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i words[2][2];  // [row][half]: bf16 of the row, lane-interleaved
  const int8_t* src[2] = {x, y};
  for (int e = 0; e < 2; ++e) {
    const __m512i v = src[e] ? _mm512_permutexvar_epi8(t.order, _mm512_maskz_loadu_epi8(mask, src[e])) : _mm512_setzero_si512();
    const __m512i m = _mm512_abs_epi8(v);
    const __m512i low = _mm512_permutex2var_epi8(t.low0, m, t.low1);
    const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.high0, m, t.high1), v, sign, 0xf8);  // a | (b & c)
    words[e][0] = _mm512_unpacklo_epi8(low, high);
    words[e][1] = _mm512_unpackhi_epi8(low, high);
  }
  _mm512_storeu_si512(dst, _mm512_unpacklo_epi16(words[0][0], words[1][0]));
  _mm512_storeu_si512(dst + 32, _mm512_unpackhi_epi16(words[0][0], words[1][0]));
  if (n == 32) return;
  _mm512_storeu_si512(dst + 64, _mm512_unpacklo_epi16(words[0][1], words[1][1]));
  _mm512_storeu_si512(dst + 96, _mm512_unpackhi_epi16(words[0][1], words[1][1]));
}

// v_pairs[i] (d, 2) = values of keys 2i and 2i + 1 of the tile interleaved; keys outside the walked range
// are zeros (their P is 0, and what the cache holds there may not be finite). For int8, the values as
// integers (exact in bf16), their scales and reciprocals in value_scale and value_scale_inverse.
void pack_values(const Walk& k, const ItemRows& b, int64_t t0, const Int8ToBf16& widen) {
  const int64_t d = k.d;
  const bool int8 = k.a.cache_dtype == DType::i8;
  const __m512i lo_pairs = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                            6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_pairs = _mm512_add_epi16(lo_pairs, _mm512_set1_epi16(16));
  for (int64_t i = 0; i < kTileKeys / 2; ++i) {
    const void* src[2];
    for (int e = 0; e < 2; ++e) {
      const int64_t p = t0 + 2 * i + e;
      const bool walked = p >= b.key_begin && p < b.key_end;
      src[e] = walked ? k.cache_row(k.a.value_cache, p) : nullptr;
      if (!int8) continue;
      const float scale = walked ? kv_int8_scale(static_cast<const int8_t*>(src[e]), d) : 0.f;
      k.s.value_scale[2 * i + e] = scale;
      k.s.value_scale_inverse[2 * i + e] = scale > 0.f ? 1.f / scale : 0.f;
    }
    bf16* dst = k.s.v_pairs + i * 2 * d;
    if (!src[0] && !src[1]) {
      std::memset(dst, 0, 2 * d * sizeof(bf16));
      continue;
    }
    if (!int8) {
      const bf16* x = static_cast<const bf16*>(src[0]);
      const bf16* y = static_cast<const bf16*>(src[1]);
      for (int64_t c = 0; c < d; c += 32) {
        const __m512i xv = x ? _mm512_loadu_si512(x + c) : _mm512_setzero_si512();
        const __m512i yv = y ? _mm512_loadu_si512(y + c) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + 2 * c, _mm512_permutex2var_epi16(xv, lo_pairs, yv));
        _mm512_storeu_si512(dst + 2 * c + 32, _mm512_permutex2var_epi16(xv, hi_pairs, yv));
      }
      continue;
    }
    const int8_t* x = static_cast<const int8_t*>(src[0]);
    const int8_t* y = static_cast<const int8_t*>(src[1]);
    for (int64_t c = 0; c < d; c += 64)
      widen_pairs(widen, x ? x + c : nullptr, y ? y + c : nullptr, std::min<int64_t>(64, d - c), dst + 2 * c);
  }
}

// r[i] (16 x 32-bit) becomes column i of the matrix whose rows were r.
inline void transpose16(__m512i* r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c], lane l: column 4l + c of rows i .. i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44), y1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    t[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// The online-softmax step of rows 16g .. 16g + 15 (one lane each; g counts 16-row tiles of the item) over
// the tile at t0, whose scores are in s_t: updates the rows' running max and sum, leaves their rescale
// factors and writes their P (bf16) to p.
void softmax_step(const Walk& k, const ItemRows& b, int64_t t0, int64_t g) {
  const __m512i lo = _mm512_loadu_si512(b.lo + 16 * g), hi = _mm512_loadu_si512(b.hi + 16 * g);
  const int64_t block = g / 2;
  const int64_t j_begin = std::max<int64_t>(0, b.begin[block] - t0), j_end = std::min<int64_t>(kTileKeys, b.end[block] - t0);
  float* s_t = k.s.s_t + 16 * (g % 2);
  __mmask16 seen[kTileKeys];
  __m512 tile_max = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < kTileKeys; ++j) {
    if (j < j_begin || j >= j_end) {
      seen[j] = 0;
      continue;
    }
    const __m512i key = _mm512_set1_epi32(static_cast<int32_t>(t0 + j));
    seen[j] = _mm512_cmpge_epi32_mask(key, lo) & _mm512_cmplt_epi32_mask(key, hi);
    const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(s_t + j * kRowBlock), _mm512_set1_ps(k.s.key_factor[j]));
    _mm512_storeu_ps(s_t + j * kRowBlock, s);
    tile_max = _mm512_mask_max_ps(tile_max, seen[j], tile_max, s);
  }
  const __m512 old_max = _mm512_loadu_ps(k.s.row_max + 16 * g);
  const __m512 new_max = _mm512_max_ps(old_max, tile_max);
  const __m512 rescale = exp_nonpositive(_mm512_sub_ps(old_max, new_max));
  _mm512_storeu_ps(k.s.row_max + 16 * g, new_max);
  _mm512_storeu_ps(k.s.rescale + 16 * g, rescale);

  const bool int8 = k.a.cache_dtype == DType::i8;
  // Word 2i + 1 of a and of b (the upper half of lane i: its bf16 truncation) side by side.
  const __m512i upper_halves = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19, 49, 17, 47,
                                                15, 45, 13, 43, 11, 41, 9, 39, 7, 37, 5, 35, 3, 33, 1);
  const __m512 upper = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(0xffff0000u)));
  __m512 sum = _mm512_setzero_ps();
  __m512i pairs[2][kTileKeys / 2];  // pairs[h][i], lane r: P's high (h 0) or low part of row r, keys 2i, 2i + 1
  for (int64_t i = 0; i < kTileKeys / 2; ++i) {
    __m512 part[2][2];  // [h][e]: part h of key 2i + e, of bf16 precision
    for (int e = 0; e < 2; ++e) {
      const int64_t j = 2 * i + e;
      part[0][e] = part[1][e] = _mm512_setzero_ps();
      if (!seen[j]) continue;
      const __m512 p = _mm512_maskz_mov_ps(seen[j], exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s_t + j * kRowBlock), new_max)));
      const float scale = int8 ? k.s.value_scale[j] : 1.f;
      const __m512 w = int8 ? _mm512_mul_ps(p, _mm512_set1_ps(scale)) : p;
      part[0][e] = _mm512_and_ps(w, upper);
      part[1][e] = _mm512_and_ps(_mm512_sub_ps(w, part[0][e]), upper);  // w - high is exact
      // The sum takes the weights as the tile unit reads them (high + low is exact), so that a value
      // shared by all keys comes out exact.
      const __m512 read = _mm512_add_ps(part[0][e], part[1][e]);
      if (!int8) sum = _mm512_add_ps(sum, read);
      else sum = _mm512_add_ps(sum, scale > 0.f ? _mm512_mul_ps(read, _mm512_set1_ps(k.s.value_scale_inverse[j])) : p);
    }
    for (int h = 0; h < 2; ++h)
      pairs[h][i] = _mm512_permutex2var_epi16(_mm512_castps_si512(part[h][0]), upper_halves, _mm512_castps_si512(part[h][1]));
  }
  const __m512 old_sum = _mm512_loadu_ps(k.s.row_sum + 16 * g);
  _mm512_storeu_ps(k.s.row_sum + 16 * g, _mm512_fmadd_ps(old_sum, rescale, sum));
  for (int h = 0; h < 2; ++h) {
    transpose16(pairs[h]);
    bf16* p = k.s.p + h * kRowBlock * kTileKeys + 16 * (g % 2) * kTileKeys;
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(p + r * kTileKeys, pairs[h][r]);
  }
}

// acc = fma(acc, rescale, P . V) for the rows of row block `block` (P . V in a fresh accumulator per tile,
// 32 columns of head_dim at a time).
template <bool two>
void accumulate_values(const Walk& k, const ItemRows& b, int64_t block) {
  const int64_t d = k.d, first = block * kRowBlock, rows = std::min(kRowBlock, b.rows - first);
  float* pv = k.s.pv;
  constexpr int64_t ld = 32 * 4;
  const bf16* high = k.s.p;
  const bf16* low = k.s.p + kRowBlock * kTileKeys;
  for (int64_t c = 0; c < d; c += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, k.s.v_pairs + 2 * c, d * 4);
    _tile_loadd(7, k.s.v_pairs + 2 * c + 32, d * 4);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (const bf16* part : {high, low}) {  // C = (0 + high . V) + low . V
      _tile_loadd(4, part, kTileKeys * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, part + 16 * kTileKeys, kTileKeys * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, pv, ld);
    _tile_stored(1, pv + 16, ld);
    if (two) {
      _tile_stored(2, pv + 16 * 32, ld);
      _tile_stored(3, pv + 16 * 32 + 16, ld);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 rescale = _mm512_set1_ps(k.s.rescale[first + r]);
      float* acc = k.s.acc + (first + r) * d + c;
      _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_loadu_ps(acc), rescale, _mm512_loadu_ps(pv + r * 32)));
      _mm512_storeu_ps(acc + 16, _mm512_fmadd_ps(_mm512_loadu_ps(acc + 16), rescale, _mm512_loadu_ps(pv + r * 32 + 16)));
    }
  }
}

// The walk of the item's rows (up to 128): every key tile is read and packed once, then serves each row block.
void walk_rows(const Walk& k, const ItemRows& b, const Int8ToBf16& widen) {
  const bool int8 = k.a.cache_dtype == DType::i8;
  if (int8) pack_queries_int8(k, b);
  else pack_queries(k, b);
  for (int64_t r = 0; r < kItemRows; ++r) {
    k.s.row_max[r] = -std::numeric_limits<float>::infinity();
    k.s.row_sum[r] = 0.f;
  }
  std::memset(k.s.acc, 0, b.rows * k.d * sizeof(float));
  const int64_t blocks = (b.rows + kRowBlock - 1) / kRowBlock;
  for (int64_t t0 = first_tile(b); t0 < b.key_end; t0 += kTileKeys) {
    const KeyRows keys[2] = {key_rows(k, b, t0, 0), key_rows(k, b, t0, 1)};
    pack_values(k, b, t0, widen);
    for (int64_t block = 0; block < blocks; ++block) {
      if (!block_in_tile(b, block, t0)) continue;
      const bool two = b.rows - block * kRowBlock > 16;
      if (int8) {
        key_scores_int8(k, keys, 2 * block);
        softmax_step(k, b, t0, 2 * block);
        if (two) {
          key_scores_int8(k, keys, 2 * block + 1);
          softmax_step(k, b, t0, 2 * block + 1);
        }
      } else {
        if (two) key_scores<true>(k, keys, block);
        else key_scores<false>(k, keys, block);
        softmax_step(k, b, t0, 2 * block);
        if (two) softmax_step(k, b, t0, 2 * block + 1);
      }
      if (two) accumulate_values<true>(k, b, block);
      else accumulate_values<false>(k, b, block);
    }
  }
}

// The rows' results: out rows bf16(acc / sum), or (acc, max, sum) per row for the split-K merge.
void finish_rows(const Walk& k, const ItemRows& b) {
  const int64_t d = k.d;
  for (int64_t i = 0; i < b.rows; ++i) {
    const int64_t r = b.first_row + i;
    const float* acc = k.s.acc + i * d;
    if (k.w.partial) {
      float* p = k.w.partial + r * (d + 2);
      std::memcpy(p, acc, d * sizeof(float));
      p[d] = k.s.row_max[i], p[d + 1] = k.s.row_sum[i];
      continue;
    }
    const __m512 factor = _mm512_set1_ps(1.f / k.s.row_sum[i]);
    bf16* out = static_cast<bf16*>(k.a.out) + ((k.token0 + r / k.group) * k.a.num_heads + k.w.kv_head * k.group + r % k.group) * d;
    for (int64_t c = 0; c < d; c += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                          bits(_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(acc + c), factor))));
  }
}

}  // namespace

void attend(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t head_row = a.cache_dtype == DType::i8 ? kv_int8_row_bytes(a.head_dim) : a.head_dim;
  const Walk k{a, w, a.head_dim, group, a.query_start[w.seq] + w.q_begin, head_row, scratch_at(scratch, a.head_dim)};
  const Int8ToBf16 widen = int8_to_bf16_tables();
  configure_tiles();
  for (int64_t first = 0; first < w.q_count * group; first += kItemRows) {
    const ItemRows b = item_rows(a, w, first);
    walk_rows(k, b, widen);
    finish_rows(k, b);
  }
  _tile_release();
}

}  // namespace shrike::amx
