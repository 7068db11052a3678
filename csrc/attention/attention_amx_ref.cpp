// Scalar model of the AMX attention walk (attention_amx.cpp, arithmetic in attention/amx_walk.h): the same
// operations in the same order, one row at a time, every tdpbf16ps by amx_bf16_step (tdpbssd sums are exact
// integers), so the AMX kernel must match it bit for bit. Compiled without floating-point contraction (kernels.cmake), so that only
// the std::fma calls here are fused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/amx_walk.h"
#include "attention/exp_scalar.h"
#include "attention/kv_int8.h"
#include "common/amx_bf16_order.h"

namespace shrike {

int64_t amx_attention_scratch_floats(int64_t head_dim) {
  amx_walk::Scratch unused;
  return amx_walk::lay_out_scratch(head_dim, nullptr, unused);
}

namespace amx_ref {
namespace {

using namespace amx_walk;

// vcvtne(2)ps2bf16: a denormal reads as zero, then round to nearest even.
bf16 to_bf16_bits(float x) {
  return float_to_bf16(std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.f, x) : x);
}
// The upper 16 bits of x.
float truncate_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

// The walk's view of the cache: row values as floats (bf16 as stored, int8 as the integers), and scales.
struct Walk {
  const PagedAttentionArgs& a;
  const AttentionWorkItem& w;
  int64_t d, group, token0, head_row;

  bool int8() const { return a.cache_dtype == DType::i8; }
  const uint8_t* row(const void* cache, int64_t p) const {
    const int64_t e = (slot_of(a, w.seq, p) * a.num_kv_heads + w.kv_head) * head_row;
    return static_cast<const uint8_t*>(cache) + e * (int8() ? 1 : 2);
  }
  float value(const uint8_t* row, int64_t i) const {
    if (int8()) return static_cast<float>(reinterpret_cast<const int8_t*>(row)[i]);
    bf16 v;
    std::memcpy(&v, row + 2 * i, 2);
    return bf16_to_float(v);
  }
  float scale(const uint8_t* row) const { return kv_int8_scale(reinterpret_cast<const int8_t*>(row), d); }
};

// int8 cache: the query q (d) as two int8 terms, q = qf (hi + lo / 128); returns qf / 128.
float split_query(const float* q, int64_t d, int32_t* hi, int32_t* lo) {
  float amax = 0.f;
  for (int64_t c = 0; c < d; ++c) amax = std::max(amax, std::fabs(q[c]));
  const float qf = amax / 127.f;
  for (int64_t c = 0; c < d; ++c) {
    hi[c] = lo[c] = 0;
    if (!(qf > 0.f)) continue;
    const float x = q[c] / qf;
    hi[c] = std::clamp(static_cast<int32_t>(std::nearbyint(x)), -127, 127);
    lo[c] = std::clamp(static_cast<int32_t>(std::nearbyint((x - static_cast<float>(hi[c])) * kQueryLowScale)),
                       -(1 << (kQueryLowBits - 1)), 1 << (kQueryLowBits - 1));
  }
  return qf / kQueryLowScale;
}

// Row i of the item's rows b over every tile its row block walks: acc (d) and the final running max and sum.
// q and key: (d) scratch; q_hi and q_lo: (d) scratch for the int8 cache's query terms.
void walk_row(const Walk& k, const ItemRows& b, int64_t i, float* q, float* key, int32_t* q_hi, int32_t* q_lo,
              float* acc, float* row_max, float* row_sum) {
  const int64_t d = k.d, r = b.first_row + i;
  const bf16* q_bits = static_cast<const bf16*>(k.a.q) +
                       ((k.token0 + r / k.group) * k.a.num_heads + k.w.kv_head * k.group + r % k.group) * d;
  for (int64_t c = 0; c < d; ++c) q[c] = bf16_to_float(q_bits[c]);
  const float query_factor = k.int8() ? split_query(q, d, q_hi, q_lo) : 0.f;
  float m = -std::numeric_limits<float>::infinity(), sum = 0.f;
  for (int64_t c = 0; c < d; ++c) acc[c] = 0.f;
  for (int64_t t0 = first_tile(b); t0 < b.key_end; t0 += kTileKeys) {
    if (!block_in_tile(b, i / kRowBlock, t0)) continue;
    float s[kTileKeys], high[kTileKeys], low[kTileKeys], value_scale[kTileKeys], value_scale_inverse[kTileKeys];
    bool seen[kTileKeys];
    const uint8_t* value_row[kTileKeys];  // nullptr: a key the block does not walk, value 0
    float tile_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < kTileKeys; ++j) {
      const int64_t pos = t0 + j;
      value_row[j] = pos >= b.key_begin && pos < b.key_end ? k.row(k.a.value_cache, pos) : nullptr;
      seen[j] = pos >= b.lo[i] && pos < b.hi[i];
      value_scale[j] = value_row[j] && k.int8() ? k.scale(value_row[j]) : 0.f;
      value_scale_inverse[j] = value_scale[j] > 0.f ? 1.f / value_scale[j] : 0.f;
      if (!seen[j]) continue;
      const uint8_t* key_row = k.row(k.a.key_cache, pos);
      if (k.int8()) {
        const int8_t* key_int = reinterpret_cast<const int8_t*>(key_row);
        int32_t dot_hi = 0, dot_lo = 0;
        for (int64_t c = 0; c < d; ++c) dot_hi += key_int[c] * q_hi[c], dot_lo += key_int[c] * q_lo[c];
        const float whole = static_cast<float>(dot_hi * (1 << kQueryLowBits) + dot_lo);
        s[j] = (whole * query_factor) * (k.scale(key_row) * k.a.scale);
      } else {
        for (int64_t c = 0; c < d; ++c) key[c] = k.value(key_row, c);
        float dot = 0.f;
        for (int64_t c = 0; c < d; c += 32) dot = amx_bf16_step(dot, key + c, q + c, 16);
        s[j] = dot * k.a.scale;
      }
      tile_max = tile_max > s[j] ? tile_max : s[j];
    }
    const float new_max = m > tile_max ? m : tile_max;
    const float rescale = exp_nonpositive_scalar(m - new_max);
    float tile_sum = 0.f;
    for (int64_t j = 0; j < kTileKeys; ++j) {
      high[j] = low[j] = 0.f;
      if (!seen[j]) continue;
      const float p = exp_nonpositive_scalar(s[j] - new_max);
      const float w = k.int8() ? p * value_scale[j] : p;
      high[j] = truncate_to_bf16(w);
      low[j] = truncate_to_bf16(w - high[j]);
      const float read = high[j] + low[j];
      if (!k.int8()) tile_sum = tile_sum + read;
      else tile_sum = tile_sum + (value_scale[j] > 0.f ? read * value_scale_inverse[j] : p);
    }
    sum = std::fma(sum, rescale, tile_sum);
    m = new_max;
    for (int64_t c = 0; c < d; ++c) {
      float v[kTileKeys];
      for (int64_t j = 0; j < kTileKeys; ++j) v[j] = value_row[j] ? k.value(value_row[j], c) : 0.f;
      acc[c] = std::fma(acc[c], rescale, amx_bf16_step(amx_bf16_step(0.f, high, v, 16), low, v, 16));
    }
  }
  *row_max = m, *row_sum = sum;
}

}  // namespace

void attend(const PagedAttentionArgs& a, const AttentionWorkItem& w, float* scratch) {
  const int64_t d = a.head_dim, group = a.num_heads / a.num_kv_heads;
  const Walk k{a, w, d, group, a.query_start[w.seq] + w.q_begin,
               a.cache_dtype == DType::i8 ? kv_int8_row_bytes(d) : d};
  const Scratch s = scratch_at(scratch, d);
  float* q = reinterpret_cast<float*>(s.q_t);
  float* key = reinterpret_cast<float*>(s.k_rows);
  std::vector<int32_t> q_terms(2 * d);
  for (int64_t first = 0; first < w.q_count * group; first += kItemRows) {
    const ItemRows b = item_rows(a, w, first);
    for (int64_t i = 0; i < b.rows; ++i) {
      const int64_t r = first + i;
      float m, sum;
      walk_row(k, b, i, q, key, q_terms.data(), q_terms.data() + d, s.acc, &m, &sum);
      if (w.partial) {
        float* p = w.partial + r * (d + 2);
        std::memcpy(p, s.acc, d * sizeof(float));
        p[d] = m, p[d + 1] = sum;
        continue;
      }
      const float factor = 1.f / sum;
      bf16* out = static_cast<bf16*>(a.out) + ((k.token0 + r / group) * a.num_heads + w.kv_head * group + r % group) * d;
      for (int64_t c = 0; c < d; ++c) out[c] = to_bf16_bits(s.acc[c] * factor);
    }
  }
}

}  // namespace amx_ref
}  // namespace shrike
