// What the int16-dot attention walk (attention_int16_avx512vnni.cpp) and its scalar model
// (attention_int16_ref.cpp) share: bf16 queries over an int8 cache, both matrix products in integers.
//
// The fp32 walk widens every int8 key and value to fp32 and multiplies in fp32: at long context that
// widening and the fp32 products are the whole decode step. Here the int8 rows are only widened to int16
// and multiplied by int16 operands with vpdpwssd (pairs of int16 products summed into int32, exact):
//   per query row, once: qs = q x softmax scale (fp32), qf = max|qs| / 32767, q16 = round(qs / qf)
//            (15 significant bits; the bf16 query itself has 8)
//   per tile of 32 keys (from a multiple of 32; gathered across cache blocks into scratch: int16 keys, and values
//   as pairs of keys per column):
//     s_j   = float(q16 . k8_j) x (qf x kscale_j)                 exact int32 dot, one rounding
//     m'    = max(m, max of the visible s),  rescale = exp(m - m'),  p_j = exp(s_j - m') (0 where not visible)
//     sum   = fma(sum, rescale, sum of p over the tile in the fixed tree of tile_sum)
//     w_j   = p_j x vscale_j,  wf = max_j w_j / 32767,  w16_j = round(w_j / wf)   (15 significant bits)
//     acc   = fma(acc, rescale, float(sum_j w16_j x v8_j) x wf)     exact int32 sum over the tile
//   out = bf16(acc x (1 / sum)), or (acc, m, sum) for a split-K merge.
// Rounding is to nearest even throughout; exp is exp_nonpositive (exp_avx512.h) lane by lane. Each row
// reads only its own scores and the tile's keys, and keys it does not see get p = 0 exactly, so a token's
// output does not depend on which rows share its item.
//
// Internal linkage: each including file compiles this with its own target flags.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention/attention.h"
#include "attention/kv_int8.h"
#include "common/bf16.h"

namespace shrike::int16_walk {
namespace {

constexpr int64_t kTileKeys = 32;
constexpr float kLevels = 32767.f;  // int16 magnitude of the largest query element and tile weight

// Tiles start at multiples of kTileKeys positions whatever the item (a split-K item's keys start at a multiple),
// so that a row's tiles, and with them its bits, do not depend on the rows it shares an item with.
inline int64_t first_tile(int64_t key_begin) { return key_begin / kTileKeys * kTileKeys; }

// Keys [lo, hi) that row r of the item sees.
struct RowKeys {
  int64_t lo, hi;
};

inline RowKeys row_keys(const PagedAttentionArgs& a, const AttentionWorkItem& w, int64_t r) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t q_len = a.query_start[w.seq + 1] - a.query_start[w.seq];
  const int64_t pos = a.context_lens[w.seq] - q_len + w.q_begin + r / group;
  const int64_t oldest = a.sliding_window > 0 ? pos - a.sliding_window + 1 : 0;
  return {std::max(w.key_begin, oldest), std::min(w.key_end, pos + 1)};
}

// Offsets in either int8 cache of the rows (values, then the scale) of positions [t0 + first, t0 + n) of the item's
// sequence and KV head; one division per tile.
inline void tile_rows(const PagedAttentionArgs& a, const AttentionWorkItem& w, int64_t t0, int64_t first, int64_t n,
                      int64_t* offset) {
  const int32_t* table = a.block_tables + w.seq * a.max_blocks;
  int64_t block = (t0 + first) / a.block_size, in_block = (t0 + first) % a.block_size;
  for (int64_t j = first; j < n; ++j) {
    const int64_t slot = static_cast<int64_t>(table[block]) * a.block_size + in_block;
    offset[j] = (slot * a.num_kv_heads + w.kv_head) * kv_int8_row_bytes(a.head_dim);
    if (++in_block == a.block_size) in_block = 0, ++block;
  }
}

// Per-thread scratch for an item of `rows` query rows, head_dim d.
struct Scratch {
  int16_t* q;            // (rows, d) q16
  float* query_factor;   // (rows,) qf
  float* acc;            // (rows, d) unnormalised outputs
  float* row_max;        // (rows,)
  float* row_sum;        // (rows,)
  int16_t* keys;         // (kTileKeys, d) the tile's keys widened
  int16_t* value_pairs;  // (kTileKeys / 2, d, 2) the tile's values, keys 2i and 2i + 1 side by side per column
  float* key_scale;      // (kTileKeys,) 0 for keys of the tile the item does not read
  float* value_scale;    // (kTileKeys,)
  int16_t* weights;      // (kTileKeys,) w16 of one row
};

// Lays the pieces out from `base` (nullptr: only counts); returns the floats the scratch needs.
inline int64_t lay_out_scratch(int64_t rows, int64_t d, float* base, Scratch& s) {
  int64_t used = 0;
  auto take = [&](int64_t floats) {
    float* piece = base ? base + used : nullptr;
    used += (floats + 15) / 16 * 16;
    return piece;
  };
  s.q = reinterpret_cast<int16_t*>(take(rows * d / 2));
  s.query_factor = take(rows);
  s.acc = take(rows * d);
  s.row_max = take(rows);
  s.row_sum = take(rows);
  s.keys = reinterpret_cast<int16_t*>(take(kTileKeys * d / 2));
  s.value_pairs = reinterpret_cast<int16_t*>(take(kTileKeys * d / 2));
  s.key_scale = take(kTileKeys);
  s.value_scale = take(kTileKeys);
  s.weights = reinterpret_cast<int16_t*>(take(kTileKeys / 2));
  return used;
}

// Row r of the item in q or out: (head_dim) bf16.
template <class T>
inline T* row_of(const PagedAttentionArgs& a, const AttentionWorkItem& w, T* base, int64_t r) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  return base + ((a.query_start[w.seq] + w.q_begin + r / group) * a.num_heads + w.kv_head * group + r % group) *
                    a.head_dim;
}

// Readies the item's rows (q16 and qf by quantize(q_row, scale, d, q16), an empty accumulator, running max and
// sum) and returns the keys [begin, end) they see together (begin >= end: none).
template <class QuantizeQuery>
inline RowKeys start_item(const PagedAttentionArgs& a, const AttentionWorkItem& w, const Scratch& s,
                          QuantizeQuery quantize) {
  const int64_t d = a.head_dim, rows = w.q_count * (a.num_heads / a.num_kv_heads);
  RowKeys item{INT64_MAX, 0};
  for (int64_t r = 0; r < rows; ++r) {
    s.query_factor[r] = quantize(row_of(a, w, static_cast<const bf16*>(a.q), r), a.scale, d, s.q + r * d);
    s.row_max[r] = -std::numeric_limits<float>::infinity(), s.row_sum[r] = 0.f;
    std::fill(s.acc + r * d, s.acc + (r + 1) * d, 0.f);
    const RowKeys k = row_keys(a, w, r);
    if (k.lo < k.hi) item.lo = std::min(item.lo, k.lo), item.hi = std::max(item.hi, k.hi);
  }
  return item;
}

// Writes the item's rows: (acc, max, sum) to its split-K partial, or store_row(out_row, acc, 1 / sum).
template <class StoreRow>
inline void finish_item(const PagedAttentionArgs& a, const AttentionWorkItem& w, const Scratch& s,
                        StoreRow store_row) {
  const int64_t d = a.head_dim, rows = w.q_count * (a.num_heads / a.num_kv_heads);
  for (int64_t r = 0; r < rows; ++r) {
    const float* acc = s.acc + r * d;
    if (w.partial) {
      float* p = w.partial + r * (d + 2);
      std::copy(acc, acc + d, p);
      p[d] = s.row_max[r], p[d + 1] = s.row_sum[r];
    } else {
      store_row(row_of(a, w, static_cast<bf16*>(a.out), r), acc, 1.f / s.row_sum[r]);
    }
  }
}

}  // namespace
}  // namespace shrike::int16_walk
