// Bindings for the compiled forward (csrc/plan). The plan keeps raw pointers into the tensors
// passed here; shrike.model.compiled keeps those tensors alive as long as the plan.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "bindings_util.h"
#include "attention/kv_int8.h"
#include "dense/dense_tiles.h"
#include "plan/forward_plan.h"

using namespace shrike::bindings;
using Array = ContiguousArray;
using shrike::plan::ForwardPlan;
using shrike::plan::Linear;
using shrike::plan::LinearKind;

namespace {

const std::string kOp = "ForwardPlan";

template <typename T>
T* data_of(const Array& a, const char* name, size_t min_elements) {
  require(a.dtype() == nb::dtype<std::remove_const_t<T>>(), kOp, std::string(name) + " has the wrong dtype");
  require(a.size() >= min_elements, kOp, std::string(name) + " is too small");
  return static_cast<T*>(a.data());
}

const void* act_vector(const ForwardPlan& p, const Array& a, const char* name, int64_t length) {
  require(float_dtype(a, kOp, name) == p.shape.act_dtype, kOp, std::string(name) + " must have the activation dtype");
  require(a.size() == static_cast<size_t>(length), kOp, std::string(name) + " has the wrong length");
  return a.data();
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
    require(l.weight_dtype == shrike::DType::bf16 && weight.size() == shrike::dense_tiles_elements(n, k), kOp,
            "dense tiles must be bfloat16 packed by dense_pack_tiles for (n, k)");
  } else {
    throw nb::value_error(("ForwardPlan: unknown linear kind " + kind).c_str());
  }
  if (l.kind != LinearKind::dense) require(weight.dtype() == nb::dtype<uint8_t>(), kOp, "packed weights must be uint8");
  l.weight = weight.data();
  if (bias) l.bias = data_of<const float>(*bias, "bias", n);
  return l;
}

void check_linear(const Linear& l, int64_t n, int64_t k, const char* name) {
  require(l.n == n && l.k == k, kOp, std::string(name) + " has the wrong shape");
}

void add_layer(ForwardPlan& p, const Array& input_norm, const Array& post_norm, std::optional<Array> q_norm,
               std::optional<Array> k_norm, const Linear& qkv, const Linear& o, const Linear& gate_up,
               const Linear& down, Array& key_cache, Array& value_cache) {
  const shrike::plan::Shape& s = p.shape;
  shrike::plan::Layer L;
  L.input_norm = act_vector(p, input_norm, "input_norm", s.hidden);
  L.post_attention_norm = act_vector(p, post_norm, "post_attention_norm", s.hidden);
  require(q_norm.has_value() == k_norm.has_value(), kOp, "q_norm and k_norm come together");
  if (q_norm) {
    L.q_norm = act_vector(p, *q_norm, "q_norm", s.head_dim);
    L.k_norm = act_vector(p, *k_norm, "k_norm", s.head_dim);
  }
  const int64_t q_size = s.num_heads * s.head_dim, kv_size = s.num_kv_heads * s.head_dim;
  check_linear(qkv, q_size + 2 * kv_size, s.hidden, "qkv_proj");
  check_linear(o, s.hidden, q_size, "o_proj");
  check_linear(gate_up, 2 * s.intermediate, s.hidden, "gate_up_proj");
  check_linear(down, s.hidden, s.intermediate, "down_proj");
  L.qkv = qkv, L.o = o, L.gate_up = gate_up, L.down = down;
  const int64_t cache_row = s.cache_dtype == shrike::DType::i8 ? shrike::kv_int8_row_bytes(s.head_dim) : s.head_dim;
  const size_t cache_elements = static_cast<size_t>(s.num_slots * s.num_kv_heads * cache_row);
  for (Array* cache : {&key_cache, &value_cache})
    require(cache_dtype(*cache, kOp, "kv cache") == s.cache_dtype && cache->size() == cache_elements, kOp,
            "kv caches must be (num_slots, num_kv_heads, head_dim) in the cache dtype (head_dim + 4 for int8)");
  L.key_cache = key_cache.data();
  L.value_cache = value_cache.data();
  p.layers.push_back(L);
}

ForwardPlan* make_plan(nb::dict c, int64_t max_tokens, int64_t max_seqs) {
  shrike::plan::Shape s;
  auto i = [&](const char* key) { return nb::cast<int64_t>(c[key]); };
  auto f = [&](const char* key) { return nb::cast<float>(c[key]); };
  auto dt = [&](const char* key) {
    std::string name = nb::cast<std::string>(c[key]);
    if (name == "int8" && std::string(key) == "cache_dtype") return shrike::DType::i8;
    if (name != "float32" && name != "bfloat16") throw nb::value_error(("ForwardPlan: unsupported dtype " + name).c_str());
    return name == "float32" ? shrike::DType::f32 : shrike::DType::bf16;
  };
  s.hidden = i("hidden"), s.num_heads = i("num_heads"), s.num_kv_heads = i("num_kv_heads"), s.head_dim = i("head_dim");
  s.intermediate = i("intermediate"), s.vocab = i("vocab"), s.block_size = i("block_size"), s.num_slots = i("num_slots");
  s.eps = f("eps"), s.attn_scale = f("attn_scale"), s.scale_emb = f("scale_emb"), s.residual_scale = f("residual_scale");
  s.logit_divisor = f("logit_divisor"), s.act_dtype = dt("act_dtype"), s.cache_dtype = dt("cache_dtype");
  require(max_tokens >= 1 && max_seqs >= 1, kOp, "max_tokens and max_seqs must be positive");
  require(s.head_dim % 2 == 0 && s.num_kv_heads >= 1 && s.num_heads % s.num_kv_heads == 0 && s.block_size >= 1, kOp,
          "bad attention shape");
  return new ForwardPlan(s, max_tokens, max_seqs);
}

void set_rope(ForwardPlan& p, const Array& table, std::optional<Array> long_table, int64_t long_threshold) {
  require(table.ndim() == 3 && dim(table, 0) == 2 && dim(table, 2) == p.shape.head_dim, kOp,
          "rope table must be (2, positions, head_dim)");
  p.rope.max_positions = dim(table, 1);
  p.rope.table = data_of<const float>(table, "rope table", 0);
  if (long_table) {
    require(long_table->size() == table.size(), kOp, "long rope table must match the rope table");
    p.rope.long_table = data_of<const float>(*long_table, "long rope table", 0);
    p.rope.long_threshold = long_threshold;
  }
}

void set_final(ForwardPlan& p, const Array& embedding, const Array& norm, std::optional<Linear> lm_head) {
  const shrike::plan::Shape& s = p.shape;
  require(float_dtype(embedding, kOp, "embedding") == s.act_dtype && embedding.size() == static_cast<size_t>(s.vocab * s.hidden),
          kOp, "embedding must be (vocab, hidden) in the activation dtype");
  p.embedding = embedding.data();
  p.final_norm = act_vector(p, norm, "final norm", s.hidden);
  if (lm_head) {
    check_linear(*lm_head, s.vocab, s.hidden, "lm_head");
    p.lm_head = *lm_head;
  }
}

void set_inputs(ForwardPlan& p, const Array& token_ids, const Array& seqs, const Array& block_tables,
                const Array& logits_rows, Array& logits, Array& hidden_out) {
  auto& in = p.inputs;
  in.token_ids = data_of<const int64_t>(token_ids, "token_ids", p.max_tokens);
  require(seqs.ndim() == 2 && dim(seqs, 1) == 3, kOp, "seqs must be (max_seqs, 3)");
  in.seqs = data_of<const int32_t>(seqs, "seqs", 3 * p.max_seqs);
  require(block_tables.ndim() == 2, kOp, "block_tables must be (rows, max_blocks_per_seq)");
  in.block_tables = data_of<const int32_t>(block_tables, "block_tables", 0);
  in.table_rows = dim(block_tables, 0), in.max_blocks_per_seq = dim(block_tables, 1);
  in.logits_rows = data_of<const int32_t>(logits_rows, "logits_rows", p.max_tokens);
  require(logits.ndim() == 2 && dim(logits, 1) == p.shape.vocab, kOp, "logits must be (rows, vocab)");
  in.logits = data_of<float>(logits, "logits", 0);
  in.max_logits_rows = dim(logits, 0);
  require(float_dtype(hidden_out, kOp, "hidden_out") == p.shape.act_dtype &&
              hidden_out.size() == static_cast<size_t>(p.max_tokens * p.shape.hidden), kOp,
          "hidden_out must be (max_tokens, hidden) in the activation dtype");
  in.hidden_out = hidden_out.data();
}

void run(ForwardPlan& p, int64_t num_seqs, int64_t num_tokens, int64_t num_logits, std::optional<Array> logits) {
  require(p.embedding && p.rope.table && p.inputs.token_ids, kOp, "the plan is not complete");
  float* out = nullptr;
  if (logits) out = data_of<float>(*logits, "logits", static_cast<size_t>(num_logits * p.shape.vocab));
  nb::gil_scoped_release release;
  p.run(num_seqs, num_tokens, num_logits, out);
}

}  // namespace

void bind_plan(nb::module_& m) {
  nb::class_<Linear>(m, "PlanLinear")
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
         nb::arg("k"), nb::arg("group"), nb::arg("bias").none());
  nb::class_<ForwardPlan>(m, "ForwardPlan")
      .def("__init__", [](ForwardPlan* self, nb::dict shape, int64_t max_tokens, int64_t max_seqs) {
        ForwardPlan* made = make_plan(shape, max_tokens, max_seqs);
        new (self) ForwardPlan(std::move(*made));
        delete made;
      }, nb::arg("shape"), nb::arg("max_tokens"), nb::arg("max_seqs"))
      .def("set_rope", &set_rope, nb::arg("table"), nb::arg("long_table").none(), nb::arg("long_threshold"))
      .def("set_final", &set_final, nb::arg("embedding"), nb::arg("norm"), nb::arg("lm_head").none())
      .def("add_layer", &add_layer, nb::arg("input_norm"), nb::arg("post_attention_norm"), nb::arg("q_norm").none(),
           nb::arg("k_norm").none(), nb::arg("qkv"), nb::arg("o"), nb::arg("gate_up"), nb::arg("down"),
           nb::arg("key_cache").noconvert(), nb::arg("value_cache").noconvert())
      .def("set_inputs", &set_inputs, nb::arg("token_ids"), nb::arg("seqs"), nb::arg("block_tables"),
           nb::arg("logits_rows"), nb::arg("logits").noconvert(), nb::arg("hidden_out").noconvert())
      .def("run", &run, nb::arg("num_seqs"), nb::arg("num_tokens"), nb::arg("num_logits"), nb::arg("logits").none(),
           "Runs one step with the GIL released; see csrc/plan/forward_plan.h.");
}
