// The op executor: replays a model's op tape (recorded once from the Python model, see
// shrike/executor/) for every engine step, one built-in kernel call per op.
//
// It knows no architecture. Buffers, step inputs and weights all live in tensors the Python side
// owns and keeps alive; the executor holds their addresses. Each op is a closure over buffer ids,
// weight pointers and scalars; row counts are the step's token or logits-row count.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "executor/linear_format.h"
#include "fused/fused.h"
#include "lora/lora.h"
#include "moe/moe.h"

namespace shrike::executor {

// Which row count a buffer argument has in a step.
enum class Rows { tokens, logits };

struct Step {
  int64_t num_seqs = 0, num_tokens = 0, num_logits = 0;
  int64_t table_width = 1;  // columns of the step's batch block tables
  int64_t rows(Rows r) const { return r == Rows::tokens ? num_tokens : num_logits; }
};

// Python-owned step inputs (written by the model runner) and per-step derived inputs (written by
// prepare()).
struct StepInputs {
  const int64_t* token_ids = nullptr;  // (max_tokens,)
  const int32_t* seqs = nullptr;  // (max_seqs, 3): block-table row, tokens already cached, new tokens
  const int32_t* block_tables = nullptr;  // (table_rows, max_blocks_per_seq)
  const int32_t* logits_rows = nullptr;  // (max_tokens,) token rows whose logits are wanted
  int64_t table_rows = 0, max_blocks_per_seq = 0;
  int64_t* slots = nullptr;  // (max_tokens,) cache slot of each new token
  int32_t* query_start = nullptr;  // (max_seqs + 1,)
  int32_t* context_lens = nullptr;  // (max_seqs,)
  int32_t* batch_tables = nullptr;  // (max_seqs * max_blocks_per_seq,): (num_seqs, table_width) this step
  const int32_t* lora_slots = nullptr;  // (max_tokens,) each token's LoRA adapter slot, -1: none (LoRA on only)
  int64_t max_loras = 0;
};

// A rotary table (2, max_positions, head_dim) fp32, cos then sin, and where prepare() gathers the
// step's rows. LongRoPE: a sequence past long_threshold tokens takes long_table for all its tokens.
struct Rope {
  const float* table = nullptr;
  const float* long_table = nullptr;
  int64_t max_positions = 0, head_dim = 0, long_threshold = -1;
  float* cos = nullptr;  // (max_tokens, head_dim)
  float* sin = nullptr;
};

class Executor;
using OpFn = std::function<void(Executor&, const Step&)>;

class Executor {
 public:
  Executor(int64_t max_tokens, int64_t max_seqs, int64_t block_size, int64_t num_slots, int64_t vocab);

  const int64_t max_tokens, max_seqs, block_size, num_slots, vocab;
  StepInputs inputs;
  std::vector<Rope> ropes;
  QuantizedRows quantized;  // handed from a producer op to the quantized linear right after it

  int add_buffer(void* data);
  void bind_buffer(int id, void* data) { buffers_.at(id) = data; }
  void* buffer(int id) const { return buffers_[id]; }
  // `detail` tells ops of one name apart in a profile (a linear's N x K).
  void add_op(std::string name, OpFn fn, std::string detail = "");
  const std::vector<std::string>& op_names() const { return names_; }
  const std::vector<std::string>& op_details() const { return details_; }
  size_t size() const { return ops_.size(); }

  // Turned on, zeroes the totals; while on, run() adds each op's wall time to op_nanoseconds()[op]
  // (the pool's wake-up and final barrier included, as a step pays them); off, it costs one branch
  // per segment.
  void set_profiling(bool on);
  const std::vector<int64_t>& op_nanoseconds() const { return op_ns_; }

  // Checks the step inputs and derives slots, attention tables and rotary rows; throws
  // std::invalid_argument on inputs outside the executor's buffers.
  Step prepare(int64_t num_seqs, int64_t num_tokens, int64_t num_logits);
  // Runs ops [begin, end) of the tape for a prepared step.
  void run(const Step& step, size_t begin, size_t end);

 private:
  std::vector<void*> buffers_;
  std::vector<OpFn> ops_;
  std::vector<std::string> names_, details_;
  bool profiling_ = false;
  std::vector<int64_t> op_ns_;
};

// Op builders: each returns the closure the tape stores. `quantize_for`, when set, is the
// quantized linear right after this op: each output row is also quantized for it while in L1.
struct RowsArg {
  int buffer;
  Rows rows;
};

OpFn embedding_op(int out, const void* table, int64_t dim, float scale, DType dt);
OpFn packed_embedding_op(int out, const GroupedWeight& table, float scale, DType dt);
OpFn rmsnorm_op(RowsArg x, const void* weight, int out, int64_t dim, float eps, DType dt, const Linear* quantize_for);
OpFn add_rmsnorm_op(RowsArg x, int residual, const void* weight, int out, int64_t dim, float eps, DType dt,
                    const Linear* quantize_for);
OpFn head_rmsnorm_op(int qkv, const void* q_weight, const void* k_weight, int out, int64_t num_heads,
                     int64_t num_kv_heads, int64_t head_dim, float eps, DType dt);
OpFn linear_op(const Linear& l, RowsArg x, int out, DType x_dtype, DType out_dtype, bool prequantized);
OpFn rope_write_kv_op(int qkv, int rope, int q_out, void* key_cache, void* value_cache, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, DType dt, DType cache_dt);
OpFn paged_attention_op(int q, const void* key_cache, const void* value_cache, int out, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, float scale, int64_t sliding_window, DType dt,
                        DType cache_dt);
OpFn silu_mul_op(int gate_up, int out, int64_t width, DType dt, const Linear* quantize_for);
OpFn gelu_tanh_mul_op(int gate_up, int out, int64_t width, DType dt, const Linear* quantize_for);
OpFn scale_op(RowsArg x, int64_t width, float factor, bool divide, DType dt);
OpFn softcap_op(RowsArg x, int64_t width, float cap);
OpFn gather_rows_op(int x, int out, int64_t row_bytes);
// Each token row's LoRA update added into a linear's output `out` (csrc/lora), the adapter picked by the
// step's lora_slots.
OpFn lora_op(const lora::Slots& slots, int x, int out, DType x_dtype, DType out_dtype);
// Mixture-of-experts block (csrc/moe): x (tokens, hidden) and float32 router logits (tokens, experts) -> out.
OpFn moe_op(moe::Experts experts, int x, int router_logits, int out, DType dt);

}  // namespace shrike::executor
