// The online-softmax walk of one work item, shared by every variant. `Vec` supplies the
// inner loops for one ISA (see attention_ref.cpp for their plain meaning).
//
// Everything here is a template on Vec, so each ISA file gets its own instantiation compiled
// with its own flags; a non-template inline function here could be emitted with AVX2 code by
// one file and picked by the linker for the scalar path.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention/attention.h"
#include "attention/kv_int8.h"
#include "common/bf16.h"

namespace shrike::attention_detail {

template <class Vec, class TQ, class TKV>
void attend_typed(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const int64_t d = a.head_dim, group = a.num_heads / a.num_kv_heads, rows = w.q_count * group;
  float* q_rows = scratch;                                 // (rows, d) queries times scale
  float* acc = q_rows + rows * d;                          // (rows, d) unnormalised outputs
  float* scores = acc + rows * d;                          // (rows, kAttentionTileKeys)
  float* row_max = scores + rows * kAttentionTileKeys;     // (rows,)
  float* row_sum = row_max + rows;                         // (rows,)
  float* k_tile = row_sum + rows;                          // (kAttentionTileKeys, d) bf16 or int8 keys as float
  float* v_tile = k_tile + kAttentionTileKeys * d;         // (kAttentionTileKeys, d)

  const int64_t q_len = a.query_start[w.seq + 1] - a.query_start[w.seq];
  const int64_t first_pos = a.context_lens[w.seq] - q_len;  // position of the sequence's first new token
  const int64_t token0 = a.query_start[w.seq] + w.q_begin;  // first query row of the item in q / out
  const int64_t head0 = w.kv_head * group;
  const int32_t* blocks = a.block_tables + w.seq * a.max_blocks;
  const int64_t head_row = std::is_same_v<TKV, int8_t> ? kv_int8_row_bytes(d) : d;  // cache elements of one (slot, head)
  const int64_t slot_stride = a.num_kv_heads * head_row;  // elements between consecutive slots of one head

  const TQ* q = static_cast<const TQ*>(a.q);
  for (int64_t t = 0; t < w.q_count; ++t)
    for (int64_t g = 0; g < group; ++g)
      Vec::load_scaled(q + ((token0 + t) * a.num_heads + head0 + g) * d, a.scale, q_rows + (t * group + g) * d, d);
  for (int64_t r = 0; r < rows; ++r) {
    row_max[r] = -std::numeric_limits<float>::infinity();
    row_sum[r] = 0.f;
  }
  for (int64_t i = 0; i < rows * d; ++i) acc[i] = 0.f;

  const TKV* key_cache = static_cast<const TKV*>(a.key_cache);
  const TKV* value_cache = static_cast<const TKV*>(a.value_cache);
  int64_t key_end = first_pos + w.q_begin + w.q_count;  // keys the item's last token sees
  if (key_end > w.key_end) key_end = w.key_end;
  const int64_t window = a.sliding_window;
  // Oldest key any token of the item sees: its first token's window start.
  const int64_t oldest_seen = first_pos + w.q_begin - window + 1;
  const int64_t key_begin = window > 0 && oldest_seen > w.key_begin ? oldest_seen : w.key_begin;
  for (int64_t key0 = key_begin; key0 < key_end;) {
    const int64_t in_block = key0 % a.block_size;
    int64_t n = a.block_size - in_block;
    if (n > kAttentionTileKeys) n = kAttentionTileKeys;
    if (n > key_end - key0) n = key_end - key0;
    const int64_t slot0 = static_cast<int64_t>(blocks[key0 / a.block_size]) * a.block_size + in_block;
    const TKV* k_src = key_cache + (slot0 * a.num_kv_heads + w.kv_head) * head_row;
    const TKV* v_src = value_cache + (slot0 * a.num_kv_heads + w.kv_head) * head_row;
    const float* k;
    const float* v;
    int64_t kv_stride;
    if constexpr (std::is_same_v<TKV, float>) {
      k = k_src, v = v_src, kv_stride = slot_stride;
    } else {
      // Widened (int8: dequantized) once per tile, then shared by all rows of the query-head group.
      for (int64_t j = 0; j < n; ++j) {
        Vec::to_float(k_src + j * slot_stride, k_tile + j * d, d);
        Vec::to_float(v_src + j * slot_stride, v_tile + j * d, d);
      }
      k = k_tile, v = v_tile, kv_stride = d;
    }
    for (int64_t t = 0; t < w.q_count; ++t) {
      const int64_t pos = first_pos + w.q_begin + t;
      int64_t visible = pos + 1 - key0;  // causal limit of this token within the tile
      if (visible <= 0) continue;
      if (visible > n) visible = n;
      // Keys of the tile before this token's window: skipped (window > 0 only).
      const int64_t skip = window > 0 && pos - window + 1 > key0 ? pos - window + 1 - key0 : 0;
      if (skip >= visible) continue;
      const int64_t count = visible - skip;
      const float* k_seen = k + skip * kv_stride;
      const float* v_seen = v + skip * kv_stride;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t r = t * group + g;
        float* s = scores + r * kAttentionTileKeys;
        Vec::query_key_scores(q_rows + r * d, k_seen, kv_stride, count, d, s);
        float tile_max = s[0];
        for (int64_t j = 1; j < count; ++j) tile_max = s[j] > tile_max ? s[j] : tile_max;
        const float new_max = tile_max > row_max[r] ? tile_max : row_max[r];
        const float rescale = std::exp(row_max[r] - new_max);  // 0 on the row's first tile
        row_sum[r] = row_sum[r] * rescale + Vec::exp_shifted(s, count, new_max);
        Vec::rescale_accumulate(acc + r * d, rescale, s, v_seen, kv_stride, count, d);
        row_max[r] = new_max;
      }
    }
    key0 += n;
  }

  if (w.partial) {  // split-K: the merge in attention.cpp normalises
    for (int64_t r = 0; r < rows; ++r) {
      float* p = w.partial + r * (d + 2);
      for (int64_t i = 0; i < d; ++i) p[i] = acc[r * d + i];
      p[d] = row_max[r], p[d + 1] = row_sum[r];
    }
    return;
  }
  TQ* out = static_cast<TQ*>(a.out);
  for (int64_t t = 0; t < w.q_count; ++t)
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      Vec::store_scaled(acc + r * d, 1.f / row_sum[r], out + ((token0 + t) * a.num_heads + head0 + g) * d, d);
    }
}

template <class Vec>
void attend(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const bool q_f32 = a.q_dtype == DType::f32, kv_f32 = a.cache_dtype == DType::f32;
  if (a.cache_dtype == DType::i8)
    return q_f32 ? attend_typed<Vec, float, int8_t>(a, w, scratch) : attend_typed<Vec, bf16, int8_t>(a, w, scratch);
  if (q_f32 && kv_f32) return attend_typed<Vec, float, float>(a, w, scratch);
  if (q_f32) return attend_typed<Vec, float, bf16>(a, w, scratch);
  if (kv_f32) return attend_typed<Vec, bf16, float>(a, w, scratch);
  attend_typed<Vec, bf16, bf16>(a, w, scratch);
}

}  // namespace shrike::attention_detail
