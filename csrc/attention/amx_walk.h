// What the AMX attention kernel (attention_amx.cpp) and its scalar model (attention_amx_ref.cpp) share: the
// row blocks of a work item, the keys each row sees, the key tile grid and the scratch.
//
// The walk, per tile of 32 keys, for up to 128 query rows (tokens x heads of the group) in blocks of 32:
//   S^T (32 keys x rows) = K (keys x d) . Q^T
//       bf16 cache: tdpbf16ps, bf16 queries as they are; s = S^T x factor[key], factor = softmax scale
//       int8 cache: tdpbssd on the int8 keys as the cache holds them, against each query as two int8 terms,
//            q = qf (hi + lo / 128) with qf = max|q| / 127 (14-15 significant bits, more than the bf16 query
//            has); S^T = 128 (K . hi) + K . lo exactly in int32, s = (float(S^T) x qf / 128) x factor[key],
//            factor = softmax scale x the key's int8 scale
//   per row: m' = max(m, max of the visible s), rescale = exp(m - m'), p = exp(s - m') (0 where not visible)
//   P (rows x 32 keys) = w = p (x the value's int8 scale) as two bf16 terms: high = w truncated to bf16,
//            low = (w - high) truncated: 16 significant bits of w (one bf16 would leave 8, and its
//            rounding moved the logits of quantized SmolLM2 models past their tests' bounds)
//   per row: sum = fma(sum, rescale, the weights P stands for, summed in key order): high + low, or that
//            over the int8 scale (times its fp32 reciprocal; p where the scale is 0), so that the weights
//            divided by the sum add up to 1 as the tile unit applies them
//   acc = fma(acc, rescale, (high . V) + (low . V))   two tdpbf16ps into a fresh accumulator, then fp32;
//            int8 values enter as their integers, exact in bf16
// and at the end out = bf16(acc x (1 / sum)), or (acc, m, sum) for a split-K merge.
//
// Tiles start at multiples of 32 positions whatever the item, and a row's arithmetic in a tile reads
// only its own scores and the tile's keys: keys it does not see get p = 0 exactly, which adds nothing.
// So each row's result is the same whichever rows share its item (prefill, chunked prefill,
// speculative verification and decode give a token the same output, split-K aside).
//
// Internal linkage: each including file compiles this with its own target flags.
#pragma once
#include <algorithm>
#include <cstdint>

#include "attention/attention.h"
#include "common/bf16.h"

namespace shrike::amx_walk {
namespace {

constexpr int64_t kItemRows = kAmxItemRows;  // rows carried through each key tile
constexpr int64_t kRowBlock = 32;   // rows per tile product: two 16-row tiles
constexpr int64_t kRowBlocks = kItemRows / kRowBlock;
constexpr int64_t kTileKeys = 32;   // keys per step: two 16-key sub-tiles, one tdpbf16ps deep in P . V
constexpr int64_t kSubTileKeys = 16;
constexpr int kQueryLowBits = 7;  // int8 cache: q = qf (hi + lo / 2^kQueryLowBits), |lo| <= 2^(kQueryLowBits - 1)
constexpr float kQueryLowScale = 1 << kQueryLowBits;

// head_dim rounded up to the 64 int8 values of one tdpbssd step (zeros past head_dim).
constexpr int64_t padded64(int64_t d) { return (d + 63) / 64 * 64; }

// Rows [first_row, first_row + rows) of an item (row r = token r / group, head r % group), the keys
// [lo[i], hi[i]) row first_row + i sees, their union [key_begin, key_end) over each row block of 32
// (begin[k], end[k]) and over all the rows.
struct ItemRows {
  int64_t first_row, rows;
  int32_t lo[kItemRows], hi[kItemRows];
  int64_t begin[kRowBlocks], end[kRowBlocks];
  int64_t key_begin, key_end;
};

inline ItemRows item_rows(const PagedAttentionArgs& a, const AttentionWorkItem& w, int64_t first_row) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  const int64_t q_len = a.query_start[w.seq + 1] - a.query_start[w.seq];
  const int64_t first_pos = a.context_lens[w.seq] - q_len + w.q_begin;  // position of the item's first token
  ItemRows b{};
  b.first_row = first_row;
  b.rows = std::min(kItemRows, w.q_count * group - first_row);
  b.key_begin = INT64_MAX, b.key_end = 0;
  for (int64_t k = 0; k < kRowBlocks; ++k) b.begin[k] = INT64_MAX, b.end[k] = 0;
  for (int64_t i = 0; i < b.rows; ++i) {
    const int64_t pos = first_pos + (first_row + i) / group;
    const int64_t oldest = a.sliding_window > 0 ? pos - a.sliding_window + 1 : 0;
    b.lo[i] = static_cast<int32_t>(std::max(w.key_begin, oldest));
    b.hi[i] = static_cast<int32_t>(std::min(w.key_end, pos + 1));
    int64_t& begin = b.begin[i / kRowBlock];
    int64_t& end = b.end[i / kRowBlock];
    begin = std::min<int64_t>(begin, b.lo[i]), end = std::max<int64_t>(end, b.hi[i]);
    b.key_begin = std::min(b.key_begin, begin), b.key_end = std::max(b.key_end, end);
  }
  return b;
}

// Whether row block k has keys to walk in the tile at t0.
inline bool block_in_tile(const ItemRows& b, int64_t k, int64_t t0) {
  return b.begin[k] < t0 + kTileKeys && b.end[k] > t0 && b.begin[k] < b.end[k];
}

// First key of the first tile the item walks.
inline int64_t first_tile(const ItemRows& b) { return b.key_begin / kTileKeys * kTileKeys; }

// Cache slot of position p of sequence `seq`.
inline int64_t slot_of(const PagedAttentionArgs& a, int64_t seq, int64_t p) {
  return static_cast<int64_t>(a.block_tables[seq * a.max_blocks + p / a.block_size]) * a.block_size + p % a.block_size;
}

// Per-thread scratch, 64-byte aligned pieces (sizes for head_dim d).
struct Scratch {
  bf16* q_t;       // bf16 cache: (8, d / 2, 16, 2) per 16-row tile, its queries in tdpbf16ps's B layout;
                   // int8 cache: (2, 8, padded64(d) / 4, 16, 4) int8 hi and lo terms in tdpbssd's B layout
  bf16* k_rows;    // (32, d) bf16 or (32, padded64(d)) int8 keys gathered when a sub-tile crosses cache blocks
  bf16* v_pairs;   // (16, d, 2) the tile's values, two consecutive keys interleaved (B layout)
  bf16* p;         // (2, 32, 32) P of the tile for one row block, row-major (A layout): high, low part
  float* s_t;      // (32 keys, 32 rows) scores of one row block
  int32_t* s_int;  // (2, 32 keys, 16 rows) int8 cache: K . hi and K . lo of one 16-row tile
  float* query_factor;  // (128,) int8 cache: qf / 128 per row
  float* pv;       // (32, 32) P . V for 32 columns of head_dim
  float* acc;      // (128, d) unnormalised outputs
  float* row_max;  // (128,)
  float* row_sum;  // (128,)
  float* rescale;  // (128,)
  float* key_factor;   // (32,) per key of the tile: scale x the key's int8 scale
  float* value_scale;  // (32,) per key of the tile: the value's int8 scale
  float* value_scale_inverse;  // (32,) 1 / value_scale (0 for a zero scale)
};

// Lays the pieces out from `base` (nullptr: only counts); returns the floats the scratch needs.
inline int64_t lay_out_scratch(int64_t d, float* base, Scratch& s) {
  if (base) base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64 / sizeof(float);
  int64_t used = 0;
  auto take = [&](int64_t floats) {
    float* piece = base ? base + used : nullptr;
    used += (floats + 15) / 16 * 16;
    return piece;
  };
  s.q_t = reinterpret_cast<bf16*>(take(kRowBlocks * 16 * padded64(d)));
  s.k_rows = reinterpret_cast<bf16*>(take(16 * padded64(d)));
  s.v_pairs = reinterpret_cast<bf16*>(take(16 * d));
  s.p = reinterpret_cast<bf16*>(take(kRowBlock * kTileKeys));
  s.s_t = take(kTileKeys * kRowBlock);
  s.s_int = reinterpret_cast<int32_t*>(take(2 * kTileKeys * 16));
  s.query_factor = take(kItemRows);
  s.pv = take(kRowBlock * 32);
  s.acc = take(kItemRows * d);
  s.row_max = take(kItemRows);
  s.row_sum = take(kItemRows);
  s.rescale = take(kItemRows);
  s.key_factor = take(kTileKeys);
  s.value_scale = take(kTileKeys);
  s.value_scale_inverse = take(kTileKeys);
  return used + 16;  // and the alignment
}

inline Scratch scratch_at(float* base, int64_t d) {
  Scratch s;
  lay_out_scratch(d, base, s);
  return s;
}

}  // namespace
}  // namespace shrike::amx_walk
