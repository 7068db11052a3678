// The compiled forward of a Llama-family model: one call runs a whole engine step (embedding,
// every decoder layer, final norm, lm_head for the rows that need logits) on built-in kernels,
// with every workspace allocated once when the plan is built.
//
// The plan does not own weights, KV caches or step inputs: it points into tensors the Python side
// keeps alive for the plan's lifetime. Each step follows the eager Python model op for op (same
// kernels, same roundings), so both give bit-identical results.
#pragma once
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "dense/dense.h"
#include "weight_only/weight_only.h"

namespace shrike::plan {

enum class LinearKind { w4a8, w8a8, dense, weight_only };

struct Linear {
  LinearKind kind = LinearKind::dense;
  // packed bytes (w4a8, w8a8, see linear/layout.h), or (n, k) floats or bf16 tiles (dense)
  const void* weight = nullptr;
  DType weight_dtype = DType::f32;  // dense only
  DenseLayout dense_layout = DenseLayout::rows;  // dense only
  const float* bias = nullptr;  // (n,) or null
  int64_t n = 0, k = 0, group = 0;  // group: w4a8 only
  WeightOnlyWeight weight_only;  // weight_only only (W4A16 / W8A16)
};

struct Layer {
  const void* input_norm = nullptr;  // (hidden,)
  const void* post_attention_norm = nullptr;  // (hidden,)
  const void* q_norm = nullptr;  // (head_dim,), Qwen3 only
  const void* k_norm = nullptr;  // (head_dim,), Qwen3 only
  Linear qkv, o, gate_up, down;
  void* key_cache = nullptr;  // (num_slots, num_kv_heads, head_dim), cache dtype
  void* value_cache = nullptr;
};

struct Shape {
  int64_t hidden = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, intermediate = 0, vocab = 0;
  int64_t block_size = 0, num_slots = 0;
  float eps = 0, attn_scale = 0;
  // MiniCPM scalings; 1 means none. Python doubles rounded to float, as torch does for scalars.
  float scale_emb = 1, residual_scale = 1, logit_divisor = 1;
  DType act_dtype = DType::f32, cache_dtype = DType::f32;
};

// Rotary tables (2, max_positions, head_dim) fp32: cos then sin. LongRoPE adds a long-factor
// table that a sequence uses for all its new tokens once it runs past `long_threshold` tokens.
struct Rope {
  const float* table = nullptr;
  const float* long_table = nullptr;  // null unless LongRoPE
  int64_t max_positions = 0, long_threshold = -1;
};

// Python-owned persistent buffers the engine updates between steps.
struct Inputs {
  const int64_t* token_ids = nullptr;  // (max_tokens,)
  const int32_t* seqs = nullptr;  // (max_seqs, 3): block-table row, tokens already cached, new tokens this step
  const int32_t* block_tables = nullptr;  // (table_rows, max_blocks_per_seq)
  const int32_t* logits_rows = nullptr;  // (max_logits_rows,) token rows whose logits are wanted
  float* logits = nullptr;  // (max_logits_rows, vocab)
  void* hidden_out = nullptr;  // (max_logits_rows, hidden): final normed rows, when the lm_head runs outside
  int64_t table_rows = 0, max_blocks_per_seq = 0, max_logits_rows = 0;
};

class ForwardPlan {
 public:
  ForwardPlan(const Shape& shape, int64_t max_tokens, int64_t max_seqs);

  Shape shape;
  Rope rope;
  Inputs inputs;
  const void* embedding = nullptr;  // (vocab, hidden), act dtype
  const void* final_norm = nullptr;  // (hidden,)
  Linear lm_head;  // weight null: the caller applies the lm_head to `inputs.hidden_out`
  std::vector<Layer> layers;
  int64_t max_tokens, max_seqs;

  // Runs one step over the first num_seqs entries of inputs.seqs (their new tokens are the first
  // num_tokens of inputs.token_ids, in order) and writes the logits of num_logits rows to
  // `logits` (null: inputs.logits). Throws std::invalid_argument on inputs outside the plan.
  void run(int64_t num_seqs, int64_t num_tokens, int64_t num_logits, float* logits);

 private:
  void prepare_step(int64_t num_seqs, int64_t num_tokens);
  void run_layer(const Layer& layer, int64_t tokens, bool first);
  void linear(const Linear& l, const void* x, int64_t rows, void* out, DType out_dtype);
  // Producer steps that hand a quantized linear its input already quantized: each row is
  // quantized right after it is written, while it is in L1 (same values as quantizing later).
  void norm_for(const Linear& consumer, const void* weight, int64_t tokens, bool add);
  void silu_mul_for(const Linear& consumer, int64_t tokens);
  void quantize_row(const Linear& consumer, const void* x, int64_t row);
  void consume(const Linear& l, const void* x, int64_t rows, void* out);
  void scale_rows(void* x, int64_t count, float factor, bool divide);

  // Workspaces; sized for max_tokens rows (activation dtype unless noted).
  std::vector<uint8_t> residual_, delta_, normed_, qkv_, qk_normed_, q_, attn_, gate_up_, act_;
  std::vector<uint8_t> final_delta_, final_residual_, final_normed_;  // (max_tokens, hidden): rows needing logits
  std::vector<float> cos_, sin_;  // (max_tokens, head_dim)
  // Quantized input of the next quantized linear: (max_tokens, max_k) int8 rows, per-row scale and
  // zero point (W4A8), (max_tokens, max_k / 32) group sums (W4A8).
  std::vector<int8_t> act_q_;
  std::vector<float> act_scale_;
  std::vector<int32_t> act_zero_, act_group_sum_;
  std::vector<int64_t> slots_;  // (max_tokens,)
  std::vector<int32_t> query_start_, context_lens_, batch_tables_;  // (max_seqs + 1,), (max_seqs,), (max_seqs, width)
  int64_t table_width_ = 1, num_seqs_step_ = 0;  // this step's batch_tables_ columns and sequences
};

}  // namespace shrike::plan
