// The int8 KV-cache layout. Each (token, KV head) row of a cache holds head_dim int8 values
// followed by their float32 scale, beside them in the same block:
//   row = [q_0 .. q_{head_dim-1} | scale (4 bytes)],  value_i = q_i * scale,
// with a symmetric scale per head and token (scale = max|x| / 127, q = round-half-even(x / scale)).
// A row is head_dim + 4 bytes instead of 2 * head_dim (bf16): 0.52x at head_dim 128. The
// attention walk dequantizes a tile of rows at a time into L1 scratch; nothing else ever holds
// a full-precision copy.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shrike {

constexpr int64_t kKvInt8ScaleBytes = 4;

// Bytes (= int8 elements) of one (token, KV head) row.
constexpr int64_t kv_int8_row_bytes(int64_t head_dim) { return head_dim + kKvInt8ScaleBytes; }

// The scale stored after the row's values. A template so that every ISA file gets its own copy
// (see attention_tiles.h on inline functions and per-file target flags).
template <class Int8 = int8_t>
float kv_int8_scale(const Int8* row, int64_t head_dim) {
  float scale;
  std::memcpy(&scale, row + head_dim, sizeof scale);
  return scale;
}

// nearbyint in the default rounding mode (half to even) for |v| < 2^22, without the libm call x86-64's
// baseline makes for it (no rounding instruction before SSE4.1; glibc saves and restores the FP environment).
inline float round_half_even_small(float v) {
  const float magic = 12582912.f;  // 1.5 * 2^23: adding it leaves no fraction bits
  return (v + magic) - magic;
}

// Quantizes x (head_dim floats) into row; must match shrike.kv_int8.quantize bit for bit.
template <class Int8 = int8_t>
void kv_int8_quantize(const float* x, int64_t head_dim, Int8* row) {
  float amax = 0.f;
  for (int64_t i = 0; i < head_dim; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float scale = amax / 127.f;
  for (int64_t i = 0; i < head_dim; ++i) {
    float q = scale > 0.f ? round_half_even_small(x[i] / scale) : 0.f;  // default rounding: half to even, as torch.round
    q = std::fmin(127.f, std::fmax(-127.f, q));
    row[i] = static_cast<Int8>(q);
  }
  std::memcpy(row + head_dim, &scale, sizeof scale);
}

}  // namespace shrike
