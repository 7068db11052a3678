// AMX-BF16 attention walk (attention/amx_walk.h): bf16 queries over a bf16 or int8 cache, head_dim % 32 == 0.
// Tile registers: tmm0-3 fp32 accumulators (16 x 16), tmm4-5 A operands (16 rows x 32 bf16: keys, then
// P), tmm6-7 B operands (16 pairs x 16 columns x 2 bf16: queries, then values).
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
  const bf16* rows = nullptr;  // nullptr: no key of the sub-tile is walked
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

inline __m512i bits(__m512bh v) { return (__m512i)v; }
inline __m256i bits(__m256bh v) { return (__m256i)v; }

// 32 bf16 from 32 int8 (exact).
inline __m512i widen32(const int8_t* src) {
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16))));
  return bits(_mm512_cvtne2ps_pbh(hi, lo));
}

// The A operand of sub-tile u of the tile at t0, and each walked key's score factor (softmax scale,
// times its int8 scale). Keys outside [key_begin, key_end) are never seen by a row: their rows
// are whatever the cache holds (a direct load) or zeros.
KeyRows key_rows(const Walk& k, const ItemRows& b, int64_t t0, int u) {
  const int64_t first = t0 + u * kSubTileKeys;
  const int64_t begin = std::max(first, b.key_begin), end = std::min(first + kSubTileKeys, b.key_end);
  if (begin >= end) return {};
  float* factor = k.s.key_factor + u * kSubTileKeys;
  const bool int8 = k.a.cache_dtype == DType::i8;
  if (!int8 && k.a.block_size % kSubTileKeys == 0) {  // the sub-tile lies in one block
    for (int64_t j = 0; j < kSubTileKeys; ++j) factor[j] = k.a.scale;
    return {static_cast<const bf16*>(k.cache_row(k.a.key_cache, first)), k.a.num_kv_heads * k.head_row * 2};
  }
  bf16* rows = k.s.k_rows + u * kSubTileKeys * k.d;
  for (int64_t j = 0; j < kSubTileKeys; ++j) {
    bf16* dst = rows + j * k.d;
    const int64_t p = first + j;
    if (p < begin || p >= end) {
      std::memset(dst, 0, k.d * sizeof(bf16));
      continue;
    }
    const void* src = k.cache_row(k.a.key_cache, p);
    if (!int8) {
      std::memcpy(dst, src, k.d * sizeof(bf16));
      factor[j] = k.a.scale;
      continue;
    }
    const int8_t* row = static_cast<const int8_t*>(src);
    for (int64_t i = 0; i < k.d; i += 32) _mm512_storeu_si512(dst + i, widen32(row + i));
    factor[j] = kv_int8_scale(row, k.d) * k.a.scale;
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
      _tile_loadd(4, keys[0].rows + c, keys[0].stride_bytes);
      _tile_dpbf16ps(0, 4, 6);
      if (two) _tile_dpbf16ps(1, 4, 7);
    }
    if (keys[1].rows) {
      _tile_loadd(5, keys[1].rows + c, keys[1].stride_bytes);
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

// v_pairs[i] (d, 2) = values of keys 2i and 2i + 1 of the tile interleaved; keys outside the walked range
// are zeros (their P is 0, and what the cache holds there may not be finite). For int8, the values as
// integers (exact in bf16), their scales and reciprocals in value_scale and value_scale_inverse.
void pack_values(const Walk& k, const ItemRows& b, int64_t t0) {
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
    for (int64_t c = 0; c < d; c += 16) {
      const __m128i xv = x ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c)) : _mm_setzero_si128();
      const __m128i yv = y ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(y + c)) : _mm_setzero_si128();
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(xv, yv)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(xv, yv)));
      _mm512_storeu_si512(dst + 2 * c, bits(_mm512_cvtne2ps_pbh(hi, lo)));
    }
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
void walk_rows(const Walk& k, const ItemRows& b) {
  pack_queries(k, b);
  for (int64_t r = 0; r < kItemRows; ++r) {
    k.s.row_max[r] = -std::numeric_limits<float>::infinity();
    k.s.row_sum[r] = 0.f;
  }
  std::memset(k.s.acc, 0, b.rows * k.d * sizeof(float));
  const int64_t blocks = (b.rows + kRowBlock - 1) / kRowBlock;
  for (int64_t t0 = first_tile(b); t0 < b.key_end; t0 += kTileKeys) {
    const KeyRows keys[2] = {key_rows(k, b, t0, 0), key_rows(k, b, t0, 1)};
    pack_values(k, b, t0);
    for (int64_t block = 0; block < blocks; ++block) {
      if (!block_in_tile(b, block, t0)) continue;
      if (b.rows - block * kRowBlock > 16) {
        key_scores<true>(k, keys, block);
        softmax_step(k, b, t0, 2 * block);
        softmax_step(k, b, t0, 2 * block + 1);
        accumulate_values<true>(k, b, block);
      } else {
        key_scores<false>(k, keys, block);
        softmax_step(k, b, t0, 2 * block);
        accumulate_values<false>(k, b, block);
      }
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
  configure_tiles();
  for (int64_t first = 0; first < w.q_count * group; first += kItemRows) {
    const ItemRows b = item_rows(a, w, first);
    walk_rows(k, b);
    finish_rows(k, b);
  }
  _tile_release();
}

}  // namespace shrike::amx
