// Element-wise steps of a decoder layer fused so that each is one pass and one Python call.
// Each follows the rounding of the unfused PyTorch code it replaces: for bf16, every
// intermediate the PyTorch code would store is rounded to bf16.
#pragma once
#include <cstdint>

#include "common/dtype.h"
#include "grouped_linear/grouped_linear.h"

namespace shrike {

// residual += x; out = rmsnorm(residual) * weight.  x, residual, out: (rows, dim); weight: (dim,)
void add_rmsnorm(const void* x, void* residual, const void* weight, void* out, int64_t rows, int64_t dim, float eps,
                 DType dtype);

// out[t] = table[token_ids[t]] (* scale, rounded to dtype as torch multiplies by a Python float,
// when scale != 1).  token_ids: (tokens,) in range; table: (vocab, dim); out: (tokens, dim)
void embedding(const int64_t* token_ids, int64_t tokens, const void* table, int64_t dim, void* out, float scale,
               DType dtype);

// An embedding table held as a grouped weight (the tied lm_head of a GGUF file, or the file's
// token_embd blocks; packed_embedding.cpp): out[t] = row token_ids[t] of table, (vocab, dim), as the
// bf16 conversion of its blocks holds it (widened for float32), then scaled as embedding() scales.
// out: (tokens, table.k) of dtype
void packed_embedding(const int64_t* token_ids, int64_t tokens, const GroupedWeight& table, void* out, float scale,
                      DType dtype);

// out = silu(gate) * up, with gate_up = [gate | up] per row.  gate_up: (rows, 2*width); out: (rows, width)
// The AVX-512 and AVX2 variants use their own exp (within a float ulp of libm's).
void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype);
namespace avx512vnni {
void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype);
}
namespace avx2 {
void silu_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype);
}

// out = gelu_tanh(gate) * up with gate_up = [gate | up] per row (Gemma's GeGLU), the activation
// rounded to dtype before the product as PyTorch stores it.  gate_up: (rows, 2*width); out: (rows, width)
void gelu_tanh_mul(const void* gate_up, void* out, int64_t rows, int64_t width, DType dtype);
// x *= factor, or x /= factor with divide, each value rounded to dtype (as torch with a Python scalar).
void scale_values(void* x, int64_t count, float factor, bool divide, DType dtype);
// x = tanh(x / cap) * cap on float32 logits (Gemma's final logit soft-capping).
void softcap(float* x, int64_t count, float cap);

struct RopeKvArgs {
  const void* qkv;  // (T, (H + 2*Hkv) * D) activations: q heads, then k heads, then v heads
  const float* cos;  // (T, D)
  const float* sin;  // (T, D)
  const int64_t* slot_mapping;  // (T,) cache slot of each token
  void* q_out;  // (T, H, D) rotated queries, activation dtype
  void* key_cache;  // (S, Hkv, D), or (S, Hkv, D + 4) int8 rows (attention/kv_int8.h)
  void* value_cache;  // like key_cache
  int64_t tokens, num_heads, num_kv_heads, head_dim;
  DType act_dtype, cache_dtype;
};
// Rotate-half RoPE on q and k, then k and v stored at their slots (quantized for an int8 cache).
void rope_write_kv(const RopeKvArgs& args);

}  // namespace shrike
