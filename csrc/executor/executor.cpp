// Tape replay: step preparation and the op closures.
#include "executor/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "attention/attention.h"
#include "fused/fused.h"
#include "norm/rmsnorm.h"
#include "runtime/threadpool.h"

namespace shrike::executor {
namespace {

size_t element_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

[[noreturn]] void bad_input(const std::string& message) { throw std::invalid_argument("executor: " + message); }

// Rows per task when per-row work (a norm or an activation, then quantization) is spread over the
// pool; each row writes only its own outputs, so the split does not change a bit.
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

uint8_t* bytes(Executor& e, int id) { return static_cast<uint8_t*>(e.buffer(id)); }

// A producer's closing step for row t when the quantized linear after it takes int8 rows.
void quantize_for_consumer(Executor& e, const Linear* consumer, const void* row, int64_t t, DType dt) {
  if (consumer) format_of(consumer->kind).quantize_row(*consumer, row, dt, t, e.quantized);
}

// The closure keeps its own copy of the consumer's description (the tape outlives the Python object).
struct OptionalLinear {
  bool set = false;
  Linear linear;
  explicit OptionalLinear(const Linear* l) : set(l != nullptr) {
    if (l) linear = *l;
  }
  const Linear* get() const { return set ? &linear : nullptr; }
};

}  // namespace

Executor::Executor(int64_t max_tokens_, int64_t max_seqs_, int64_t block_size_, int64_t num_slots_, int64_t vocab_)
    : max_tokens(max_tokens_), max_seqs(max_seqs_), block_size(block_size_), num_slots(num_slots_), vocab(vocab_) {}

int Executor::add_buffer(void* data) {
  buffers_.push_back(data);
  return static_cast<int>(buffers_.size() - 1);
}

void Executor::add_op(std::string name, OpFn fn, std::string detail) {
  names_.push_back(std::move(name));
  details_.push_back(std::move(detail));
  ops_.push_back(std::move(fn));
}

void Executor::set_profiling(bool on) {
  if (on && !profiling_) op_ns_.assign(ops_.size(), 0);  // off keeps the totals for reading
  profiling_ = on;
}

Step Executor::prepare(int64_t num_seqs, int64_t num_tokens, int64_t num_logits) {
  if (num_seqs < 1 || num_seqs > max_seqs)
    bad_input("num_seqs " + std::to_string(num_seqs) + " outside 1.." + std::to_string(max_seqs));
  if (num_tokens < 1 || num_tokens > max_tokens)
    bad_input("num_tokens " + std::to_string(num_tokens) + " outside 1.." + std::to_string(max_tokens));
  if (num_logits < 0 || num_logits > num_tokens) bad_input("num_logits must be in 0..num_tokens");
  for (int64_t i = 0; i < num_logits; ++i)
    if (inputs.logits_rows[i] < 0 || inputs.logits_rows[i] >= num_tokens) bad_input("a logits row is not a token of this step");
  for (int64_t t = 0; t < num_tokens; ++t)
    if (inputs.token_ids[t] < 0 || inputs.token_ids[t] >= vocab) bad_input("token id outside the vocabulary");
  if (inputs.lora_slots)
    for (int64_t t = 0; t < num_tokens; ++t)
      if (inputs.lora_slots[t] < -1 || inputs.lora_slots[t] >= inputs.max_loras) bad_input("LoRA slot outside 0..max_loras");
  const int64_t cache_blocks = num_slots / block_size;
  int64_t width = 1, token = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t* seq = inputs.seqs + 3 * b;
    const int64_t row = seq[0], start = seq[1], count = seq[2], context = start + count;
    if (row < 0 || row >= inputs.table_rows) bad_input("block-table row " + std::to_string(row) + " out of range");
    if (start < 0 || count < 1 || token + count > num_tokens) bad_input("sequence " + std::to_string(b) + " has a bad token range");
    for (const Rope& r : ropes)
      if (context > r.max_positions) bad_input("position " + std::to_string(context - 1) + " beyond the rotary table");
    const int64_t blocks = (context + block_size - 1) / block_size;
    if (blocks > inputs.max_blocks_per_seq) bad_input("sequence " + std::to_string(b) + " needs more blocks than a table row holds");
    const int32_t* table = inputs.block_tables + row * inputs.max_blocks_per_seq;
    for (int64_t i = 0; i < blocks; ++i)
      if (table[i] < 0 || table[i] >= cache_blocks) bad_input("block id " + std::to_string(table[i]) + " outside the cache");
    width = std::max(width, blocks);
    inputs.query_start[b] = static_cast<int32_t>(token);
    inputs.context_lens[b] = static_cast<int32_t>(context);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t pos = start + j, t = token + j;
      inputs.slots[t] = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
      for (const Rope& r : ropes) {
        const float* source = r.long_table && context > r.long_threshold ? r.long_table : r.table;
        const int64_t d = r.head_dim;
        std::memcpy(r.cos + t * d, source + pos * d, d * sizeof(float));
        std::memcpy(r.sin + t * d, source + (r.max_positions + pos) * d, d * sizeof(float));
      }
    }
    token += count;
  }
  if (token != num_tokens) bad_input("the sequences' new tokens do not add up to num_tokens");
  inputs.query_start[num_seqs] = static_cast<int32_t>(num_tokens);
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int32_t* table = inputs.block_tables + inputs.seqs[3 * b] * inputs.max_blocks_per_seq;
    std::copy(table, table + width, inputs.batch_tables + b * width);
  }
  return Step{num_seqs, num_tokens, num_logits, width};
}

void Executor::run(const Step& step, size_t begin, size_t end) {
  if (begin > end || end > ops_.size()) bad_input("op range outside the tape");
  runtime::WorkerSpin spin;  // workers stay awake between the ops of this step
  if (!profiling_) {
    for (size_t i = begin; i < end; ++i) ops_[i](*this, step);
    return;
  }
  op_ns_.resize(ops_.size(), 0);
  for (size_t i = begin; i < end; ++i) {
    const auto start = std::chrono::steady_clock::now();
    ops_[i](*this, step);
    op_ns_[i] += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
}

// Op builders ---------------------------------------------------------------------------------

OpFn embedding_op(int out, const void* table, int64_t dim, float scale, DType dt) {
  return [=](Executor& e, const Step& s) {
    shrike::embedding(e.inputs.token_ids, s.num_tokens, table, dim, e.buffer(out), scale, dt);
  };
}

OpFn packed_embedding_op(int out, const GroupedWeight& table, float scale, DType dt) {
  return [=](Executor& e, const Step& s) {
    shrike::packed_embedding(e.inputs.token_ids, s.num_tokens, table, e.buffer(out), scale, dt);
  };
}

OpFn rmsnorm_op(RowsArg x, const void* weight, int out, int64_t dim, float eps, DType dt, const Linear* quantize_for) {
  const OptionalLinear consumer(quantize_for);
  const size_t row_bytes = dim * element_bytes(dt);
  return [=](Executor& e, const Step& s) {
    const uint8_t* in = bytes(e, x.buffer);
    uint8_t* o = bytes(e, out);
    over_rows(s.rows(x.rows), [&](int64_t t) {
      rmsnorm(in + t * row_bytes, weight, o + t * row_bytes, 1, dim, eps, dt);
      quantize_for_consumer(e, consumer.get(), o + t * row_bytes, t, dt);
    });
  };
}

OpFn add_rmsnorm_op(RowsArg x, int residual, const void* weight, int out, int64_t dim, float eps, DType dt,
                    const Linear* quantize_for) {
  const OptionalLinear consumer(quantize_for);
  const size_t row_bytes = dim * element_bytes(dt);
  return [=](Executor& e, const Step& s) {
    const uint8_t* in = bytes(e, x.buffer);
    uint8_t* res = bytes(e, residual);
    uint8_t* o = bytes(e, out);
    over_rows(s.rows(x.rows), [&](int64_t t) {
      add_rmsnorm(in + t * row_bytes, res + t * row_bytes, weight, o + t * row_bytes, 1, dim, eps, dt);
      quantize_for_consumer(e, consumer.get(), o + t * row_bytes, t, dt);
    });
  };
}

OpFn head_rmsnorm_op(int qkv, const void* q_weight, const void* k_weight, int out, int64_t num_heads,
                     int64_t num_kv_heads, int64_t head_dim, float eps, DType dt) {
  const size_t e_bytes = element_bytes(dt);
  const size_t row_bytes = (num_heads + 2 * num_kv_heads) * head_dim * e_bytes;
  const size_t k_offset = num_heads * head_dim * e_bytes, v_offset = (num_heads + num_kv_heads) * head_dim * e_bytes;
  return [=](Executor& e, const Step& s) {
    const uint8_t* in = bytes(e, qkv);
    uint8_t* o = bytes(e, out);
    for (int64_t t = 0; t < s.num_tokens; ++t) {
      const uint8_t* row = in + t * row_bytes;
      uint8_t* dst = o + t * row_bytes;
      rmsnorm(row, q_weight, dst, num_heads, head_dim, eps, dt);
      rmsnorm(row + k_offset, k_weight, dst + k_offset, num_kv_heads, head_dim, eps, dt);
      std::memcpy(dst + v_offset, row + v_offset, row_bytes - v_offset);
    }
  };
}

OpFn linear_op(const Linear& l, RowsArg x, int out, DType x_dtype, DType out_dtype, bool prequantized) {
  const LinearFormat& format = format_of(l.kind);
  return [=, &format](Executor& e, const Step& s) {
    const int64_t rows = s.rows(x.rows);
    if (prequantized)
      format.run_quantized(l, e.quantized, rows, e.buffer(out), out_dtype);
    else
      format.run(l, e.buffer(x.buffer), x_dtype, rows, e.buffer(out), out_dtype);
  };
}

OpFn rope_write_kv_op(int qkv, int rope, int q_out, void* key_cache, void* value_cache, int64_t num_heads,
                      int64_t num_kv_heads, int64_t head_dim, DType dt, DType cache_dt) {
  const size_t e_bytes = element_bytes(dt);
  const int64_t qkv_width = (num_heads + 2 * num_kv_heads) * head_dim, d = head_dim;
  return [=](Executor& e, const Step& s) {
    const Rope& r = e.ropes[rope];
    const uint8_t* in = bytes(e, qkv);
    uint8_t* q = bytes(e, q_out);
    // One token per call, spread over the pool: each token writes only its own q row and cache slots.
    over_rows(s.num_tokens, [&](int64_t t) {
      RopeKvArgs one{in + t * qkv_width * e_bytes, r.cos + t * d, r.sin + t * d, e.inputs.slots + t,
                     q + t * num_heads * d * e_bytes, key_cache, value_cache, 1, num_heads, num_kv_heads, d, dt,
                     cache_dt};
      rope_write_kv(one);
    });
  };
}

OpFn paged_attention_op(int q, const void* key_cache, const void* value_cache, int out, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, float scale, int64_t sliding_window, DType dt,
                        DType cache_dt) {
  return [=](Executor& e, const Step& s) {
    PagedAttentionArgs a{};
    a.q = e.buffer(q);
    a.key_cache = key_cache;
    a.value_cache = value_cache;
    a.out = e.buffer(out);
    a.block_tables = e.inputs.batch_tables;
    a.query_start = e.inputs.query_start;
    a.context_lens = e.inputs.context_lens;
    a.num_seqs = s.num_seqs;
    a.max_blocks = s.table_width;
    a.num_heads = num_heads;
    a.num_kv_heads = num_kv_heads;
    a.head_dim = head_dim;
    a.block_size = e.block_size;
    a.scale = scale;
    a.q_dtype = dt;
    a.cache_dtype = cache_dt;
    a.sliding_window = sliding_window;
    paged_attention(a);
  };
}

namespace {
using GatedFn = void (*)(const void*, void*, int64_t, int64_t, DType);

OpFn gated_op(GatedFn fn, int gate_up, int out, int64_t width, DType dt, const Linear* quantize_for) {
  const OptionalLinear consumer(quantize_for);
  const size_t e_bytes = element_bytes(dt);
  return [=](Executor& e, const Step& s) {
    const uint8_t* in = bytes(e, gate_up);
    uint8_t* o = bytes(e, out);
    over_rows(s.num_tokens, [&](int64_t t) {
      fn(in + t * 2 * width * e_bytes, o + t * width * e_bytes, 1, width, dt);
      quantize_for_consumer(e, consumer.get(), o + t * width * e_bytes, t, dt);
    });
  };
}
}  // namespace

OpFn silu_mul_op(int gate_up, int out, int64_t width, DType dt, const Linear* quantize_for) {
  return gated_op(static_cast<GatedFn>(&shrike::silu_mul), gate_up, out, width, dt, quantize_for);
}

OpFn gelu_tanh_mul_op(int gate_up, int out, int64_t width, DType dt, const Linear* quantize_for) {
  return gated_op(&shrike::gelu_tanh_mul, gate_up, out, width, dt, quantize_for);
}

OpFn scale_op(RowsArg x, int64_t width, float factor, bool divide, DType dt) {
  return [=](Executor& e, const Step& s) { scale_values(e.buffer(x.buffer), s.rows(x.rows) * width, factor, divide, dt); };
}

OpFn softcap_op(RowsArg x, int64_t width, float cap) {
  return [=](Executor& e, const Step& s) {
    softcap(static_cast<float*>(e.buffer(x.buffer)), s.rows(x.rows) * width, cap);
  };
}

OpFn gather_rows_op(int x, int out, int64_t row_bytes) {
  return [=](Executor& e, const Step& s) {
    const uint8_t* in = bytes(e, x);
    uint8_t* o = bytes(e, out);
    for (int64_t i = 0; i < s.num_logits; ++i)
      std::memcpy(o + i * row_bytes, in + e.inputs.logits_rows[i] * row_bytes, row_bytes);
  };
}

OpFn lora_op(const lora::Slots& slots, int x, int out, DType x_dtype, DType out_dtype) {
  return [=](Executor& e, const Step& s) {
    if (!e.inputs.lora_slots) bad_input("a LoRA op needs the step's lora_slots (set_lora_slots)");
    lora::apply(slots, e.buffer(x), x_dtype, e.inputs.lora_slots, s.num_tokens, e.buffer(out), out_dtype);
  };
}

OpFn moe_op(moe::Experts experts, int x, int router_logits, int out, DType dt) {
  auto workspace = std::make_shared<moe::Workspace>();  // the closure's own scratch, reused every step
  return [=](Executor& e, const Step& s) {
    moe::forward(experts, e.buffer(x), static_cast<const float*>(e.buffer(router_logits)), s.num_tokens, e.buffer(out),
                 dt, *workspace);
  };
}

}  // namespace shrike::executor
