// One engine step of a Llama-family model, op for op the order of shrike.model.llama.
#include "plan/forward_plan.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "attention/attention.h"
#include "common/bf16.h"
#include "dense/dense.h"
#include "fused/fused.h"
#include "linear/linear.h"
#include "norm/rmsnorm.h"
#include "quant/act_quant.h"
#include "runtime/threadpool.h"

namespace shrike::plan {
namespace {

size_t element_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

[[noreturn]] void bad_input(const std::string& message) { throw std::invalid_argument("forward plan: " + message); }

template <typename T>
T* at(std::vector<uint8_t>& buffer, int64_t offset_elements, DType dt) {
  return reinterpret_cast<T*>(buffer.data() + offset_elements * element_bytes(dt));
}

}  // namespace

ForwardPlan::ForwardPlan(const Shape& s, int64_t max_tokens_, int64_t max_seqs_)
    : shape(s), max_tokens(max_tokens_), max_seqs(max_seqs_) {
  const size_t e = element_bytes(s.act_dtype), t = static_cast<size_t>(max_tokens);
  const size_t qkv_width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  residual_.resize(t * s.hidden * e);
  delta_.resize(t * s.hidden * e);
  normed_.resize(t * s.hidden * e);
  qkv_.resize(t * qkv_width * e);
  q_.resize(t * s.num_heads * s.head_dim * e);
  attn_.resize(t * s.num_heads * s.head_dim * e);
  gate_up_.resize(t * 2 * s.intermediate * e);
  act_.resize(t * s.intermediate * e);
  final_delta_.resize(t * s.hidden * e);
  final_residual_.resize(t * s.hidden * e);
  final_normed_.resize(t * s.hidden * e);
  const size_t max_k = std::max(s.hidden, s.intermediate);
  act_q_.resize(t * max_k);
  act_scale_.resize(t);
  act_zero_.resize(t);
  act_group_sum_.resize(t * (max_k / 32));
  cos_.resize(t * s.head_dim);
  sin_.resize(t * s.head_dim);
  slots_.resize(t);
  query_start_.resize(max_seqs + 1);
  context_lens_.resize(max_seqs);
}

void ForwardPlan::prepare_step(int64_t num_seqs, int64_t num_tokens) {
  const Shape& s = shape;
  const int64_t cache_blocks = s.num_slots / s.block_size;
  int64_t width = 1, token = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t* seq = inputs.seqs + 3 * b;
    const int64_t row = seq[0], start = seq[1], count = seq[2], context = start + count;
    if (row < 0 || row >= inputs.table_rows) bad_input("block-table row " + std::to_string(row) + " out of range");
    if (start < 0 || count < 1 || token + count > num_tokens) bad_input("sequence " + std::to_string(b) + " has a bad token range");
    if (context > rope.max_positions) bad_input("position " + std::to_string(context - 1) + " beyond the rotary table");
    const int64_t blocks = (context + s.block_size - 1) / s.block_size;
    if (blocks > inputs.max_blocks_per_seq) bad_input("sequence " + std::to_string(b) + " needs more blocks than a table row holds");
    const int32_t* table = inputs.block_tables + row * inputs.max_blocks_per_seq;
    for (int64_t i = 0; i < blocks; ++i)
      if (table[i] < 0 || table[i] >= cache_blocks) bad_input("block id " + std::to_string(table[i]) + " outside the cache");
    width = std::max(width, blocks);
    query_start_[b] = static_cast<int32_t>(token);
    context_lens_[b] = static_cast<int32_t>(context);
    const float* rope_table = rope.long_table && context > rope.long_threshold ? rope.long_table : rope.table;
    const int64_t d = s.head_dim;
    for (int64_t j = 0; j < count; ++j, ++token) {
      const int64_t pos = start + j;
      slots_[token] = static_cast<int64_t>(table[pos / s.block_size]) * s.block_size + pos % s.block_size;
      std::memcpy(&cos_[token * d], rope_table + pos * d, d * sizeof(float));
      std::memcpy(&sin_[token * d], rope_table + (rope.max_positions + pos) * d, d * sizeof(float));
    }
  }
  if (token != num_tokens) bad_input("the sequences' new tokens do not add up to num_tokens");
  query_start_[num_seqs] = static_cast<int32_t>(num_tokens);
  table_width_ = width;
  batch_tables_.resize(num_seqs * width);
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t* table = inputs.block_tables + inputs.seqs[3 * b] * inputs.max_blocks_per_seq;
    std::copy(table, table + width, batch_tables_.begin() + b * width);
  }
}

void ForwardPlan::linear(const Linear& l, const void* x, int64_t rows, void* out, DType out_dtype) {
  const DType xt = shape.act_dtype;
  switch (l.kind) {
    case LinearKind::w4a8:
      return w4a8_linear(x, xt, rows, l.k, static_cast<const uint8_t*>(l.weight), l.n, l.group, l.bias, out, out_dtype);
    case LinearKind::w8a8:
      return w8a8_linear(x, xt, rows, l.k, static_cast<const uint8_t*>(l.weight), l.n, l.bias, out, out_dtype);
    case LinearKind::dense:
      return dense_linear(x, xt, rows, l.k, l.weight, l.weight_dtype, l.n, l.bias, out, out_dtype, l.dense_layout);
    case LinearKind::weight_only:
      return weight_only_linear(x, xt, rows, l.weight_only, l.bias, out, out_dtype);
  }
}

void ForwardPlan::quantize_row(const Linear& l, const void* x, int64_t row) {
  if (l.kind == LinearKind::w4a8) {
    const int64_t groups = l.k / l.group;
    quantize_asym(x, shape.act_dtype, 1, l.k, l.group,
                  {act_q_.data() + row * l.k, act_scale_.data() + row, act_zero_.data() + row,
                   act_group_sum_.data() + row * groups});
  } else if (l.kind == LinearKind::w8a8) {
    quantize_sym(x, shape.act_dtype, 1, l.k, {act_q_.data() + row * l.k, act_scale_.data() + row});
  }
}

// The input (rows, l.k) of `l`: quantized already by its producer when `l` is quantized.
void ForwardPlan::consume(const Linear& l, const void* x, int64_t rows, void* out) {
  const DType dt = shape.act_dtype;
  if (l.kind == LinearKind::w4a8)
    return w4a8_linear_quantized({act_q_.data(), act_scale_.data(), act_zero_.data(), act_group_sum_.data(), nullptr,
                                  static_cast<const uint8_t*>(l.weight), l.bias, out, dt, rows, l.n, l.k, l.group});
  if (l.kind == LinearKind::w8a8)
    return w8a8_linear_quantized({act_q_.data(), act_scale_.data(), nullptr, nullptr,
                                  static_cast<const uint8_t*>(l.weight), l.bias, out, dt, rows, l.n, l.k});
  linear(l, x, rows, out, dt);
}

namespace {
// Whether `l` takes int8 activations that its producer quantizes (the others take the float rows).
bool quantizes_input(const Linear& l) { return l.kind == LinearKind::w4a8 || l.kind == LinearKind::w8a8; }

// Rows per task when a prefill's per-row work (norm or silu*up, then quantization) is spread over
// the pool; each row writes only its own outputs, so the split does not change a bit.
constexpr int64_t kRowsPerTask = 8;

template <typename RowFn>
void over_rows(int64_t rows, RowFn row) {
  if (rows <= kRowsPerTask) {
    for (int64_t t = 0; t < rows; ++t) row(t);
    return;
  }
  runtime::parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task) {
    for (int64_t t = task * kRowsPerTask; t < std::min(rows, (task + 1) * kRowsPerTask); ++t) row(t);
  });
}
}  // namespace

// normed_ = rmsnorm(residual (+= delta_ when add)), quantized row by row for a quantized `consumer`.
// Spread over the pool for unquantized (dense, weight-only) consumers too: on one thread a bf16
// prefill's norms and silu*up kept the other threads spinning.
void ForwardPlan::norm_for(const Linear& consumer, const void* weight, int64_t tokens, bool add) {
  const Shape& s = shape;
  const size_t row_bytes = s.hidden * element_bytes(s.act_dtype);
  const bool quantized = quantizes_input(consumer);
  over_rows(tokens, [&](int64_t t) {
    uint8_t* residual = residual_.data() + t * row_bytes;
    uint8_t* normed = normed_.data() + t * row_bytes;
    if (add)
      add_rmsnorm(delta_.data() + t * row_bytes, residual, weight, normed, 1, s.hidden, s.eps, s.act_dtype);
    else
      rmsnorm(residual, weight, normed, 1, s.hidden, s.eps, s.act_dtype);
    if (quantized) quantize_row(consumer, normed, t);
  });
}

// act_ = silu(gate) * up, quantized row by row for a quantized `consumer`.
void ForwardPlan::silu_mul_for(const Linear& consumer, int64_t tokens) {
  const Shape& s = shape;
  const size_t e = element_bytes(s.act_dtype);
  const bool quantized = quantizes_input(consumer);
  over_rows(tokens, [&](int64_t t) {
    uint8_t* act = act_.data() + t * s.intermediate * e;
    silu_mul(gate_up_.data() + t * 2 * s.intermediate * e, act, 1, s.intermediate, s.act_dtype);
    if (quantized) quantize_row(consumer, act, t);
  });
}

// x *= factor or x /= factor, rounded to the activation dtype the way torch treats a Python scalar.
void ForwardPlan::scale_rows(void* x, int64_t count, float factor, bool divide) {
  if (shape.act_dtype == DType::f32) {
    float* v = static_cast<float*>(x);
    for (int64_t i = 0; i < count; ++i) v[i] = divide ? v[i] / factor : v[i] * factor;
    return;
  }
  bf16* v = static_cast<bf16*>(x);
  for (int64_t i = 0; i < count; ++i) {
    const float f = bf16_to_float(v[i]);
    v[i] = float_to_bf16(divide ? f / factor : f * factor);
  }
}

void ForwardPlan::run_layer(const Layer& L, int64_t tokens, bool first) {
  const Shape& s = shape;
  const DType dt = s.act_dtype;
  const int64_t d = s.head_dim, qkv_width = (s.num_heads + 2 * s.num_kv_heads) * d;
  const size_t e = element_bytes(dt);
  norm_for(L.qkv, L.input_norm, tokens, !first);
  consume(L.qkv, normed_.data(), tokens, qkv_.data());

  const void* rope_input = qkv_.data();
  if (L.q_norm) {  // Qwen3: q and k heads RMS-normalised before RoPE
    qk_normed_.resize(qkv_.size());
    for (int64_t t = 0; t < tokens; ++t) {
      const uint8_t* row = qkv_.data() + t * qkv_width * e;
      uint8_t* out = qk_normed_.data() + t * qkv_width * e;
      rmsnorm(row, L.q_norm, out, s.num_heads, d, s.eps, dt);
      rmsnorm(row + s.num_heads * d * e, L.k_norm, out + s.num_heads * d * e, s.num_kv_heads, d, s.eps, dt);
      const size_t v_offset = (s.num_heads + s.num_kv_heads) * d * e;
      std::memcpy(out + v_offset, row + v_offset, s.num_kv_heads * d * e);
    }
    rope_input = qk_normed_.data();
  }
  // One token per call, spread over the pool: each token writes only its own q row and cache slots.
  over_rows(tokens, [&](int64_t t) {
    RopeKvArgs one{static_cast<const uint8_t*>(rope_input) + t * qkv_width * e, cos_.data() + t * d,
                   sin_.data() + t * d, slots_.data() + t, q_.data() + t * s.num_heads * d * e, L.key_cache,
                   L.value_cache, 1, s.num_heads, s.num_kv_heads, d, dt, s.cache_dtype};
    rope_write_kv(one);
  });

  PagedAttentionArgs a{};
  a.q = q_.data();
  a.key_cache = L.key_cache;
  a.value_cache = L.value_cache;
  a.out = attn_.data();
  a.block_tables = batch_tables_.data();
  a.query_start = query_start_.data();
  a.context_lens = context_lens_.data();
  a.num_seqs = num_seqs_step_;
  a.max_blocks = table_width_;
  a.num_heads = s.num_heads;
  a.num_kv_heads = s.num_kv_heads;
  a.head_dim = d;
  a.block_size = s.block_size;
  a.scale = s.attn_scale;
  a.q_dtype = dt;
  a.cache_dtype = s.cache_dtype;
  paged_attention(a);

  linear(L.o, attn_.data(), tokens, delta_.data(), dt);
  if (s.residual_scale != 1.0f) scale_rows(delta_.data(), tokens * s.hidden, s.residual_scale, false);
  norm_for(L.gate_up, L.post_attention_norm, tokens, true);
  consume(L.gate_up, normed_.data(), tokens, gate_up_.data());
  silu_mul_for(L.down, tokens);
  consume(L.down, act_.data(), tokens, delta_.data());
  if (s.residual_scale != 1.0f) scale_rows(delta_.data(), tokens * s.hidden, s.residual_scale, false);
}

void ForwardPlan::run(int64_t num_seqs, int64_t num_tokens, int64_t num_logits, float* logits) {
  const Shape& s = shape;
  const DType dt = s.act_dtype;
  const size_t e = element_bytes(dt), row_bytes = s.hidden * e;
  if (num_seqs < 1 || num_seqs > max_seqs) bad_input("num_seqs " + std::to_string(num_seqs) + " outside 1.." + std::to_string(max_seqs));
  if (num_tokens < 1 || num_tokens > max_tokens)
    bad_input("num_tokens " + std::to_string(num_tokens) + " outside 1.." + std::to_string(max_tokens));
  if (num_logits < 0 || num_logits > num_tokens) bad_input("num_logits must be in 0..num_tokens");
  if (!logits && num_logits > inputs.max_logits_rows) bad_input("more logits rows than the logits buffer holds");
  for (int64_t i = 0; i < num_logits; ++i)
    if (inputs.logits_rows[i] < 0 || inputs.logits_rows[i] >= num_tokens) bad_input("a logits row is not a token of this step");
  for (int64_t t = 0; t < num_tokens; ++t)
    if (inputs.token_ids[t] < 0 || inputs.token_ids[t] >= s.vocab) bad_input("token id outside the vocabulary");
  num_seqs_step_ = num_seqs;
  prepare_step(num_seqs, num_tokens);
  runtime::WorkerSpin spin;  // workers stay awake between the ops of this step

  shrike::embedding(inputs.token_ids, num_tokens, embedding, s.hidden, residual_.data(), s.scale_emb, dt);
  for (size_t i = 0; i < layers.size(); ++i) run_layer(layers[i], num_tokens, i == 0);
  if (num_logits == 0) return;

  for (int64_t i = 0; i < num_logits; ++i) {
    const int64_t r = inputs.logits_rows[i];
    std::memcpy(final_delta_.data() + i * row_bytes, delta_.data() + r * row_bytes, row_bytes);
    std::memcpy(final_residual_.data() + i * row_bytes, residual_.data() + r * row_bytes, row_bytes);
  }
  void* hidden = lm_head.weight ? static_cast<void*>(final_normed_.data()) : inputs.hidden_out;
  add_rmsnorm(final_delta_.data(), final_residual_.data(), final_norm, hidden, num_logits, s.hidden, s.eps, dt);
  if (s.logit_divisor != 1.0f) scale_rows(hidden, num_logits * s.hidden, s.logit_divisor, true);
  if (lm_head.weight) linear(lm_head, hidden, num_logits, logits ? logits : inputs.logits, DType::f32);
}

}  // namespace shrike::plan
