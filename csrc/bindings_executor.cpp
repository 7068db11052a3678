// Bindings of the op executor (csrc/executor). The executor keeps raw pointers into the tensors
// passed here; shrike.executor.compile keeps those tensors alive as long as the executor.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "bindings_util.h"
#include "attention/kv_int8.h"
#include "dense/dense_tiles.h"
#include "executor/executor.h"

using namespace shrike::bindings;
using Array = ContiguousArray;
using shrike::DType;
using namespace shrike::executor;

namespace {

const std::string kOp = "Executor";

template <typename T>
T* data_of(const Array& a, const char* name, size_t min_elements) {
  require(a.dtype() == nb::dtype<std::remove_const_t<T>>(), kOp, std::string(name) + " has the wrong dtype");
  require(a.size() >= min_elements, kOp, std::string(name) + " is too small");
  return static_cast<T*>(a.data());
}

Linear make_linear(const std::string& kind, const Array& weight, std::optional<Array> bias, int64_t n, int64_t k,
                   int64_t group) {
  Linear l;
  l.n = n, l.k = k, l.group = group;
  if (kind == "w4a8") {
    l.kind = LinearKind::w4a8;
    require(group == 32 || group == 64 || group == 128, kOp, "w4a8 group must be 32, 64 or 128");
  } else if (kind == "w8a8") {
    l.kind = LinearKind::w8a8;
  } else if (kind == "dense") {
    l.kind = LinearKind::dense;
    l.weight_dtype = float_dtype(weight, kOp, "dense weight");
    require(weight.size() == static_cast<size_t>(n * k), kOp, "dense weight must be (n, k)");
  } else if (kind == "dense_tiles") {
    l.kind = LinearKind::dense;
    l.weight_dtype = float_dtype(weight, kOp, "dense tiles");
    l.dense_layout = shrike::DenseLayout::tiles;
    require(l.weight_dtype == DType::bf16 && weight.size() == shrike::dense_tiles_elements(n, k), kOp,
            "dense tiles must be bfloat16 packed by dense_pack_tiles for (n, k)");
  } else {
    throw nb::value_error(("Executor: unknown linear kind " + kind).c_str());
  }
  if (l.kind != LinearKind::dense) require(weight.dtype() == nb::dtype<uint8_t>(), kOp, "packed weights must be uint8");
  l.weight = weight.data();
  if (bias) l.bias = data_of<const float>(*bias, "bias", n);
  return l;
}

DType dtype_named(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "bfloat16") return DType::bf16;
  if (name == "int8") return DType::i8;
  throw nb::value_error(("Executor: unsupported dtype " + name).c_str());
}

Rows rows_named(const std::string& name) {
  if (name == "tokens") return Rows::tokens;
  if (name == "logits") return Rows::logits;
  throw nb::value_error(("Executor: rows must be 'tokens' or 'logits', not " + name).c_str());
}

// The executor plus the step it last prepared.
struct PyExecutor {
  Executor exe;
  Step step;
  PyExecutor(int64_t max_tokens, int64_t max_seqs, int64_t block_size, int64_t num_slots, int64_t vocab)
      : exe(max_tokens, max_seqs, block_size, num_slots, vocab) {}

  const Linear* reserve_for(std::optional<Linear*> consumer) {
    if (!consumer || !*consumer) return nullptr;
    require(format_of((*consumer)->kind).quantized_input, kOp, "only a quantized linear takes pre-quantized rows");
    exe.quantized.reserve(exe.max_tokens, (*consumer)->k);
    return *consumer;
  }
};

void set_inputs(PyExecutor& p, const Array& token_ids, const Array& seqs, const Array& block_tables,
                const Array& logits_rows, Array& slots, Array& query_start, Array& context_lens, Array& batch_tables) {
  Executor& e = p.exe;
  auto& in = e.inputs;
  in.token_ids = data_of<const int64_t>(token_ids, "token_ids", e.max_tokens);
  require(seqs.ndim() == 2 && dim(seqs, 1) == 3, kOp, "seqs must be (max_seqs, 3)");
  in.seqs = data_of<const int32_t>(seqs, "seqs", 3 * e.max_seqs);
  require(block_tables.ndim() == 2, kOp, "block_tables must be (rows, max_blocks_per_seq)");
  in.block_tables = data_of<const int32_t>(block_tables, "block_tables", 0);
  in.table_rows = dim(block_tables, 0), in.max_blocks_per_seq = dim(block_tables, 1);
  in.logits_rows = data_of<const int32_t>(logits_rows, "logits_rows", e.max_tokens);
  in.slots = data_of<int64_t>(slots, "slots", e.max_tokens);
  in.query_start = data_of<int32_t>(query_start, "query_start", e.max_seqs + 1);
  in.context_lens = data_of<int32_t>(context_lens, "context_lens", e.max_seqs);
  in.batch_tables = data_of<int32_t>(batch_tables, "batch_tables", e.max_seqs * in.max_blocks_per_seq);
}

int add_rope(PyExecutor& p, const Array& table, std::optional<Array> long_table, int64_t long_threshold, Array& cos,
             Array& sin) {
  require(table.ndim() == 3 && dim(table, 0) == 2, kOp, "rope table must be (2, positions, head_dim)");
  Rope r;
  r.max_positions = dim(table, 1), r.head_dim = dim(table, 2);
  r.table = data_of<const float>(table, "rope table", 0);
  if (long_table) {
    require(long_table->size() == table.size(), kOp, "long rope table must match the rope table");
    r.long_table = data_of<const float>(*long_table, "long rope table", 0);
    r.long_threshold = long_threshold;
  }
  r.cos = data_of<float>(cos, "cos", p.exe.max_tokens * r.head_dim);
  r.sin = data_of<float>(sin, "sin", p.exe.max_tokens * r.head_dim);
  p.exe.ropes.push_back(r);
  return static_cast<int>(p.exe.ropes.size() - 1);
}

void run(PyExecutor& p, size_t begin, size_t end) {
  require(p.exe.inputs.token_ids, kOp, "set_inputs first");
  nb::gil_scoped_release release;
  p.exe.run(p.step, begin, end);
}

int64_t prepare(PyExecutor& p, int64_t num_seqs, int64_t num_tokens, int64_t num_logits) {
  require(p.exe.inputs.token_ids, kOp, "set_inputs first");
  p.step = p.exe.prepare(num_seqs, num_tokens, num_logits);
  return p.step.table_width;
}

// The experts of one MoE block, checked: each expert's gate_up is (2 * intermediate, hidden) and its down
// (hidden, intermediate), alike for all routed experts (a shared expert, last, has its own intermediate).
shrike::moe::Experts experts_of(const std::vector<Linear>& gate_up, const std::vector<Linear>& down, int64_t top_k,
                                bool normalize, bool shared) {
  const std::string op = "moe";
  const int64_t routed = static_cast<int64_t>(down.size()) - (shared ? 1 : 0);
  require(routed >= 1 && gate_up.size() == down.size(), op, "needs one gate_up and one down linear per expert");
  require(top_k >= 1 && top_k <= routed, op, "top_k must be between 1 and the number of routed experts");
  for (size_t e = 0; e < down.size(); ++e) {
    const int64_t inter = static_cast<int64_t>(e) < routed ? down[0].k : down[e].k;
    require(down[e].n == down[0].n && down[e].k == inter && gate_up[e].n == 2 * inter && gate_up[e].k == down[0].n,
            op, "expert " + std::to_string(e) + "'s linears do not have the block's shapes");
  }
  return {gate_up, down, top_k, normalize, shared};
}

// The adapter slots of one linear (csrc/lora/lora.h), checked: shrink (max_loras, parts * max_rank, k), expand
// (max_loras, max_rank, n) float32; ranks (max_loras,) and part_end (parts,) int32, the last part ending at n.
shrike::lora::Slots lora_slots_of(const Array& shrink, const Array& expand, const Array& ranks, const Array& part_end) {
  const std::string op = "lora";
  require(shrink.ndim() == 3 && expand.ndim() == 3 && ranks.ndim() == 1 && part_end.ndim() == 1, op,
          "shrink and expand must be 3-d, ranks and part_end 1-d");
  shrike::lora::Slots w;
  w.max_loras = dim(shrink, 0), w.parts = dim(part_end, 0), w.max_rank = dim(expand, 1);
  w.k = dim(shrink, 2), w.n = dim(expand, 2);
  require(w.parts >= 1 && dim(shrink, 1) == w.parts * w.max_rank && dim(expand, 0) == w.max_loras &&
              dim(ranks, 0) == w.max_loras, op, "shrink must be (max_loras, parts * max_rank, k), expand "
              "(max_loras, max_rank, n), ranks (max_loras,)");
  w.shrink = data_of<const float>(shrink, "shrink", 0);
  w.expand = data_of<const float>(expand, "expand", 0);
  w.ranks = data_of<const int32_t>(ranks, "ranks", 0);
  w.part_end = data_of<const int32_t>(part_end, "part_end", 0);
  for (int64_t p = 0; p < w.parts; ++p)
    require(w.part_end[p] > (p ? w.part_end[p - 1] : 0), op, "part_end must increase");
  require(w.part_end[w.parts - 1] == w.n, op, "the last part must end at n");
  for (int64_t s = 0; s < w.max_loras; ++s)
    require(w.ranks[s] >= 0 && w.ranks[s] <= w.max_rank, op, "a slot's rank must be in 0..max_rank");
  return w;
}

}  // namespace

void bind_executor(nb::module_& m) {
  m.def("lora", [](const Array& x, const Array& shrink, const Array& expand, const Array& ranks, const Array& part_end,
                   const Array& row_slots, Array& out) {
    const std::string op = "lora";
    shrike::lora::Slots w = lora_slots_of(shrink, expand, ranks, part_end);
    require(x.ndim() == 2 && dim(x, 1) == w.k && out.ndim() == 2 && dim(out, 1) == w.n && dim(out, 0) == dim(x, 0), op,
            "x must be (rows, k) and out (rows, n)");
    const int64_t rows = dim(x, 0);
    const int32_t* slots = data_of<const int32_t>(row_slots, "row_slots", rows);
    for (int64_t t = 0; t < rows; ++t)
      require(slots[t] >= -1 && slots[t] < w.max_loras, op, "a row's slot must be -1 or in 0..max_loras");
    const DType x_dtype = float_dtype(x, op, "x"), out_dtype = float_dtype(out, op, "out");
    nb::gil_scoped_release release;
    shrike::lora::apply(w, x.data(), x_dtype, slots, rows, out.data(), out_dtype);
  }, nb::arg("x"), nb::arg("shrink"), nb::arg("expand"), nb::arg("ranks"), nb::arg("part_end"), nb::arg("row_slots"),
     nb::arg("out").noconvert(),
     "LoRA: out (rows, n) += each row's update from its slot's adapter (row_slots[t] = -1: none).");


  m.def("moe", [](const Array& x, const Array& router_logits, const std::vector<Linear>& gate_up,
                  const std::vector<Linear>& down, Array& out, int64_t top_k, bool normalize, bool shared_expert) {
    const std::string op = "moe";
    shrike::moe::Experts experts = experts_of(gate_up, down, top_k, normalize, shared_expert);
    const DType dt = float_dtype(x, op, "x");
    require(float_dtype(out, op, "out") == dt, op, "x and out must share one dtype");
    require(x.ndim() == 2 && dim(x, 1) == experts.hidden() && out.size() == x.size(), op,
            "x and out must be (tokens, hidden)");
    const int64_t rows = dim(x, 0);
    require(router_logits.ndim() == 2 && dim(router_logits, 0) == rows &&
                dim(router_logits, 1) == static_cast<int64_t>(down.size()), op,
            "router_logits must be (tokens, experts), the shared expert's gate logit last");
    const float* logits = data_of<const float>(router_logits, "router_logits", 0);
    nb::gil_scoped_release release;
    shrike::moe::Workspace workspace;
    shrike::moe::forward(experts, x.data(), logits, rows, out.data(), dt, workspace);
  }, nb::arg("x"), nb::arg("router_logits"), nb::arg("gate_up"), nb::arg("down"), nb::arg("out").noconvert(),
     nb::arg("top_k"), nb::arg("normalize"), nb::arg("shared_expert") = false,
     "Mixture-of-experts block: route each row to its top_k experts, run them over their rows, combine.");

  nb::class_<Linear>(m, "TapeLinear")
      .def("__init__", [](Linear* self, const std::string& kind, const Array& weight, std::optional<Array> bias,
                          int64_t n, int64_t k, int64_t group) {
        new (self) Linear(make_linear(kind, weight, std::move(bias), n, k, group));
      }, nb::arg("kind"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("n"), nb::arg("k"), nb::arg("group"))
      .def_static("weight_only", [](const StridedArray& q, const StridedArray& scale, const StridedArray& offset,
                                    std::optional<StridedArray> perm, int bits, int64_t n, int64_t k, int64_t group,
                                    std::optional<Array> bias) {
        Linear l;
        l.kind = LinearKind::weight_only;
        l.n = n, l.k = k, l.group = group;
        l.weight_only = weight_only_weight(q, scale, offset, perm, bits, n, k, group);
        l.weight = l.weight_only.q;
        if (bias) l.bias = data_of<const float>(*bias, "bias", n);
        return l;
      }, nb::arg("q"), nb::arg("scale"), nb::arg("offset"), nb::arg("perm").none(), nb::arg("bits"), nb::arg("n"),
         nb::arg("k"), nb::arg("group"), nb::arg("bias").none())
      .def_static("grouped", [](const StridedArray& packed, int64_t n, int64_t k, int64_t group, int bits, bool has_min,
                                bool codebook, int params, std::optional<Array> bias) {
        Linear l;
        l.kind = LinearKind::grouped;
        l.n = n, l.k = k, l.group = group;
        l.grouped = {grouped_weight(packed, n, k, group, bits, has_min, codebook, params)};
        l.weight = l.grouped[0].packed;
        if (bias) l.bias = data_of<const float>(*bias, "bias", n);
        return l;
      }, nb::arg("packed"), nb::arg("n"), nb::arg("k"), nb::arg("group"), nb::arg("bits"), nb::arg("has_min"),
         nb::arg("codebook"), nb::arg("params"), nb::arg("bias").none())
      .def("append_grouped", [](Linear& l, const StridedArray& packed, int64_t n, int64_t group, int bits, bool has_min,
                                bool codebook, int params) {
        require(l.kind == LinearKind::grouped && l.bias == nullptr, kOp,
                "only a grouped linear without a bias takes further parts");
        l.grouped.push_back(grouped_weight(packed, n, l.k, group, bits, has_min, codebook, params));
        l.n += n;
      }, nb::arg("packed"), nb::arg("n"), nb::arg("group"), nb::arg("bits"), nb::arg("has_min"), nb::arg("codebook"),
         nb::arg("params"), "Adds a part along N: its columns follow the existing ones in the output.")
      .def_prop_ro("quantized_input", [](const Linear& l) { return format_of(l.kind).quantized_input; })
      .def_prop_ro("format", [](const Linear& l) { return std::string(format_of(l.kind).name); })
      .def_ro("n", &Linear::n)
      .def_ro("k", &Linear::k);

  using OptLinear = std::optional<Linear*>;
  nb::class_<PyExecutor>(m, "Executor")
      .def(nb::init<int64_t, int64_t, int64_t, int64_t, int64_t>(), nb::arg("max_tokens"), nb::arg("max_seqs"),
           nb::arg("block_size"), nb::arg("num_slots"), nb::arg("vocab"))
      .def("add_buffer", [](PyExecutor& p, Array& t) { return p.exe.add_buffer(t.data()); }, nb::arg("tensor").noconvert())
      .def("bind_buffer", [](PyExecutor& p, int id, Array& t) { p.exe.bind_buffer(id, t.data()); }, nb::arg("id"),
           nb::arg("tensor").noconvert())
      .def("set_inputs", &set_inputs, nb::arg("token_ids"), nb::arg("seqs"), nb::arg("block_tables"),
           nb::arg("logits_rows"), nb::arg("slots").noconvert(), nb::arg("query_start").noconvert(),
           nb::arg("context_lens").noconvert(), nb::arg("batch_tables").noconvert())
      .def("add_rope", &add_rope, nb::arg("table"), nb::arg("long_table").none(), nb::arg("long_threshold"),
           nb::arg("cos").noconvert(), nb::arg("sin").noconvert())
      .def("embedding", [](PyExecutor& p, int out, const Array& table, float scale) {
        DType dt = float_dtype(table, kOp, "embedding table");
        require(table.ndim() == 2 && dim(table, 0) == p.exe.vocab, kOp, "embedding table must be (vocab, hidden)");
        p.exe.add_op("embedding", embedding_op(out, table.data(), dim(table, 1), scale, dt));
      })
      .def("packed_embedding", [](PyExecutor& p, int out, const nb::ndarray<nb::device::cpu>& packed, int64_t n,
                                  int64_t k, int64_t group, int bits, bool has_min, bool codebook, int params, float scale,
                                  const std::string& dtype) {
        const shrike::GroupedWeight table = grouped_weight(packed, n, k, group, bits, has_min, codebook, params);
        require(n == p.exe.vocab, kOp, "the packed embedding table must have a row per vocabulary entry");
        p.exe.add_op("embedding", packed_embedding_op(out, table, scale, dtype_named(dtype)));
      })
      .def("rmsnorm", [](PyExecutor& p, int x, const std::string& rows, const Array& weight, int out, float eps,
                         OptLinear quantize_for) {
        p.exe.add_op("rmsnorm", rmsnorm_op({x, rows_named(rows)}, weight.data(), out, static_cast<int64_t>(weight.size()), eps,
                                           float_dtype(weight, kOp, "norm weight"), p.reserve_for(quantize_for)));
      }, nb::arg("x"), nb::arg("rows"), nb::arg("weight"), nb::arg("out"), nb::arg("eps"), nb::arg("quantize_for").none())
      .def("add_rmsnorm", [](PyExecutor& p, int x, const std::string& rows, int residual, const Array& weight, int out,
                             float eps, OptLinear quantize_for) {
        p.exe.add_op("add_rmsnorm", add_rmsnorm_op({x, rows_named(rows)}, residual, weight.data(), out,
                                                   static_cast<int64_t>(weight.size()), eps,
                                                   float_dtype(weight, kOp, "norm weight"), p.reserve_for(quantize_for)));
      }, nb::arg("x"), nb::arg("rows"), nb::arg("residual"), nb::arg("weight"), nb::arg("out"), nb::arg("eps"),
         nb::arg("quantize_for").none())
      .def("head_rmsnorm", [](PyExecutor& p, int qkv, const Array& q_weight, const Array& k_weight, int out,
                              int64_t num_heads, int64_t num_kv_heads, float eps) {
        require(q_weight.size() == k_weight.size(), kOp, "q and k norm weights must have head_dim values");
        p.exe.add_op("head_rmsnorm", head_rmsnorm_op(qkv, q_weight.data(), k_weight.data(), out, num_heads, num_kv_heads,
                                                     static_cast<int64_t>(q_weight.size()), eps,
                                                     float_dtype(q_weight, kOp, "q norm weight")));
      })
      .def("linear", [](PyExecutor& p, const Linear& l, int x, const std::string& rows, int out, const std::string& x_dtype,
                        const std::string& out_dtype, bool prequantized) {
        require(!prequantized || format_of(l.kind).quantized_input, kOp, "only a quantized linear takes pre-quantized rows");
        p.exe.add_op(std::string(format_of(l.kind).name) + "_linear",
                     linear_op(l, {x, rows_named(rows)}, out, dtype_named(x_dtype), dtype_named(out_dtype), prequantized),
                     std::to_string(l.n) + "x" + std::to_string(l.k));
      })
      .def("rope_write_kv", [](PyExecutor& p, int qkv, int rope, int q_out, Array& key_cache, Array& value_cache,
                               int64_t num_heads, const std::string& act_dtype) {
        require(rope >= 0 && rope < static_cast<int>(p.exe.ropes.size()), kOp, "unknown rope table");
        DType cdt = cache_dtype(key_cache, kOp, "key cache");
        const int64_t d = p.exe.ropes[rope].head_dim, kv_heads = dim(key_cache, 1);
        const int64_t row = cdt == DType::i8 ? shrike::kv_int8_row_bytes(d) : d;
        require(key_cache.ndim() == 3 && dim(key_cache, 0) == p.exe.num_slots && dim(key_cache, 2) == row &&
                    value_cache.size() == key_cache.size(), kOp, "kv caches must be (num_slots, kv_heads, head_dim)");
        p.exe.add_op("rope_write_kv", rope_write_kv_op(qkv, rope, q_out, key_cache.data(), value_cache.data(), num_heads,
                                                       kv_heads, d, dtype_named(act_dtype), cdt));
      }, nb::arg("qkv"), nb::arg("rope"), nb::arg("q_out"), nb::arg("key_cache").noconvert(),
         nb::arg("value_cache").noconvert(), nb::arg("num_heads"), nb::arg("act_dtype"))
      .def("paged_attention", [](PyExecutor& p, int q, const Array& key_cache, const Array& value_cache, int out,
                                 int64_t num_heads, int64_t head_dim, float scale, int64_t sliding_window,
                                 const std::string& act_dtype) {
        p.exe.add_op("paged_attention", paged_attention_op(q, key_cache.data(), value_cache.data(), out, num_heads,
                                                           dim(key_cache, 1), head_dim, scale, sliding_window,
                                                           dtype_named(act_dtype), cache_dtype(key_cache, kOp, "key cache")));
      })
      .def("silu_mul", [](PyExecutor& p, int gate_up, int out, int64_t width, const std::string& dt, OptLinear quantize_for) {
        p.exe.add_op("silu_mul", silu_mul_op(gate_up, out, width, dtype_named(dt), p.reserve_for(quantize_for)));
      }, nb::arg("gate_up"), nb::arg("out"), nb::arg("width"), nb::arg("dtype"), nb::arg("quantize_for").none())
      .def("gelu_tanh_mul", [](PyExecutor& p, int gate_up, int out, int64_t width, const std::string& dt,
                               OptLinear quantize_for) {
        p.exe.add_op("gelu_tanh_mul", gelu_tanh_mul_op(gate_up, out, width, dtype_named(dt), p.reserve_for(quantize_for)));
      }, nb::arg("gate_up"), nb::arg("out"), nb::arg("width"), nb::arg("dtype"), nb::arg("quantize_for").none())
      .def("scale", [](PyExecutor& p, int x, const std::string& rows, int64_t width, float factor, bool divide,
                       const std::string& dt) {
        p.exe.add_op(divide ? "div_scalar" : "mul_scalar", scale_op({x, rows_named(rows)}, width, factor, divide, dtype_named(dt)));
      })
      .def("softcap", [](PyExecutor& p, int x, const std::string& rows, int64_t width, float cap) {
        p.exe.add_op("softcap", softcap_op({x, rows_named(rows)}, width, cap));
      })
      .def("moe", [](PyExecutor& p, int x, int router_logits, const std::vector<Linear>& gate_up,
                     const std::vector<Linear>& down, int out, int64_t top_k, bool normalize, const std::string& dt,
                     bool shared_expert) {
        p.exe.add_op("moe", moe_op(experts_of(gate_up, down, top_k, normalize, shared_expert), x, router_logits, out,
                                   dtype_named(dt)));
      }, nb::arg("x"), nb::arg("router_logits"), nb::arg("gate_up"), nb::arg("down"), nb::arg("out"), nb::arg("top_k"),
         nb::arg("normalize"), nb::arg("dtype"), nb::arg("shared_expert") = false)
      .def("set_lora_slots", [](PyExecutor& p, const Array& slots, int64_t max_loras) {
        p.exe.inputs.lora_slots = data_of<const int32_t>(slots, "lora_slots", p.exe.max_tokens);
        p.exe.inputs.max_loras = max_loras;
      }, nb::arg("slots"), nb::arg("max_loras"), "The step input: each token's LoRA slot (-1: none).")
      .def("lora", [](PyExecutor& p, int x, int out, const Array& shrink, const Array& expand, const Array& ranks,
                      const Array& part_end, const std::string& x_dtype, const std::string& out_dtype) {
        p.exe.add_op("lora", lora_op(lora_slots_of(shrink, expand, ranks, part_end), x, out, dtype_named(x_dtype),
                                     dtype_named(out_dtype)));
      }, nb::arg("x"), nb::arg("out"), nb::arg("shrink"), nb::arg("expand"), nb::arg("ranks"), nb::arg("part_end"),
         nb::arg("x_dtype"), nb::arg("out_dtype"))
      .def("gather_rows", [](PyExecutor& p, int x, int out, int64_t row_bytes) {
        p.exe.add_op("gather_rows", gather_rows_op(x, out, row_bytes));
      })
      .def("prepare", &prepare, nb::arg("num_seqs"), nb::arg("num_tokens"), nb::arg("num_logits"),
           "Checks the step inputs and derives slots, attention tables and rotary rows -> the tables' width.")
      .def("run", &run, nb::arg("begin"), nb::arg("end"), "Runs ops [begin, end) of the tape, GIL released.")
      .def_prop_ro("op_names", [](const PyExecutor& p) { return p.exe.op_names(); })
      .def_prop_ro("op_details", [](const PyExecutor& p) { return p.exe.op_details(); })
      .def("set_profiling", [](PyExecutor& p, bool on) { p.exe.set_profiling(on); }, nb::arg("on"),
           "Starts (zeroing them) or stops the per-op wall-time totals of op_nanoseconds; stopped, they stay readable.")
      .def_prop_ro("op_nanoseconds", [](const PyExecutor& p) { return p.exe.op_nanoseconds(); })
      .def("__len__", [](const PyExecutor& p) { return p.exe.size(); });
}
