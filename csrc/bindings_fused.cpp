// Bindings for the fused decoder-layer steps (csrc/fused).
#include "bindings.h"
#include "bindings_util.h"
#include "attention/kv_int8.h"
#include "fused/fused.h"
#include "norm/rmsnorm.h"

#include <nanobind/stl/string.h>

#include <cstring>

using namespace shrike::bindings;
using Array = ContiguousArray;

namespace {

void add_rmsnorm(const Array& x, Array& residual, const Array& weight, Array& out, float eps) {
  const std::string op = "add_rmsnorm";
  shrike::DType dt = float_dtype(x, op, "x");
  require(float_dtype(residual, op, "residual") == dt && float_dtype(weight, op, "weight") == dt &&
              float_dtype(out, op, "out") == dt, op, "x, residual, weight and out must share one dtype");
  require(x.ndim() == 2 && weight.ndim() == 1 && dim(weight, 0) == dim(x, 1), op, "x must be (rows, dim), weight (dim,)");
  require(residual.size() == x.size() && out.size() == x.size(), op, "residual and out must have x's size");
  nb::gil_scoped_release release;
  shrike::add_rmsnorm(x.data(), residual.data(), weight.data(), out.data(), dim(x, 0), dim(x, 1), eps, dt);
}

void embedding(const Array& token_ids, const Array& table, Array& out, float scale) {
  const std::string op = "embedding";
  shrike::DType dt = float_dtype(table, op, "table");
  require(float_dtype(out, op, "out") == dt, op, "table and out must share one dtype");
  require(token_ids.dtype() == nb::dtype<int64_t>() && token_ids.ndim() == 1, op, "token_ids must be (T,) int64");
  require(table.ndim() == 2 && out.ndim() == 2 && dim(out, 0) == dim(token_ids, 0) && dim(out, 1) == dim(table, 1), op,
          "expected table (vocab, dim) and out (T, dim)");
  const int64_t* ids = static_cast<const int64_t*>(token_ids.data());
  const int64_t tokens = dim(token_ids, 0), vocab = dim(table, 0);
  for (int64_t t = 0; t < tokens; ++t) require(0 <= ids[t] && ids[t] < vocab, op, "token id outside the table");
  nb::gil_scoped_release release;
  shrike::embedding(ids, tokens, table.data(), dim(table, 1), out.data(), scale, dt);
}

void packed_embedding(const Array& token_ids, const nb::ndarray<nb::device::cpu>& packed, int64_t n, int64_t k,
                      int64_t group, int bits, bool has_min, bool codebook, int params, Array& out, float scale) {
  const std::string op = "packed_embedding";
  const shrike::GroupedWeight table = grouped_weight(packed, n, k, group, bits, has_min, codebook, params);
  shrike::DType dt = float_dtype(out, op, "out");
  require(token_ids.dtype() == nb::dtype<int64_t>() && token_ids.ndim() == 1, op, "token_ids must be (T,) int64");
  require(out.ndim() == 2 && dim(out, 0) == dim(token_ids, 0) && dim(out, 1) == k, op, "out must be (T, k)");
  const int64_t* ids = static_cast<const int64_t*>(token_ids.data());
  const int64_t tokens = dim(token_ids, 0);
  for (int64_t t = 0; t < tokens; ++t) require(0 <= ids[t] && ids[t] < n, op, "token id outside the table");
  nb::gil_scoped_release release;
  shrike::packed_embedding(ids, tokens, table, out.data(), scale, dt);
}

void silu_mul(const Array& gate_up, Array& out) {
  const std::string op = "silu_mul";
  shrike::DType dt = float_dtype(gate_up, op, "gate_up");
  require(float_dtype(out, op, "out") == dt, op, "gate_up and out must share one dtype");
  require(gate_up.ndim() == 2 && out.ndim() == 2 && dim(gate_up, 0) == dim(out, 0) && dim(gate_up, 1) == 2 * dim(out, 1),
          op, "gate_up must be (rows, 2*width) and out (rows, width)");
  nb::gil_scoped_release release;
  shrike::silu_mul(gate_up.data(), out.data(), dim(out, 0), dim(out, 1), dt);
}

void rope_write_kv(const Array& qkv, const Array& cos, const Array& sin, const Array& slot_mapping, Array& q_out,
                   Array& key_cache, Array& value_cache) {
  const std::string op = "rope_write_kv";
  shrike::RopeKvArgs a{};
  a.act_dtype = float_dtype(qkv, op, "qkv");
  a.cache_dtype = cache_dtype(key_cache, op, "key_cache");
  require(float_dtype(q_out, op, "q_out") == a.act_dtype, op, "q_out must have qkv's dtype");
  require(cache_dtype(value_cache, op, "value_cache") == a.cache_dtype, op, "key and value caches must share a dtype");
  require(cos.dtype() == nb::dtype<float>() && sin.dtype() == nb::dtype<float>(), op, "cos and sin must be float32");
  require(slot_mapping.dtype() == nb::dtype<int64_t>(), op, "slot_mapping must be int64");
  require(q_out.ndim() == 3 && key_cache.ndim() == 3 && value_cache.ndim() == 3 && qkv.ndim() == 2, op,
          "expected qkv (T, (H+2Hkv)*D), q_out (T, H, D), caches (slots, Hkv, D)");
  a.tokens = dim(qkv, 0);
  a.num_heads = dim(q_out, 1);
  a.num_kv_heads = dim(key_cache, 1);
  a.head_dim = dim(q_out, 2);
  const int64_t slots = dim(key_cache, 0);
  const int64_t cache_row = a.cache_dtype == shrike::DType::i8 ? shrike::kv_int8_row_bytes(a.head_dim) : a.head_dim;
  require(a.head_dim % 2 == 0 && dim(key_cache, 2) == cache_row, op,
          "head_dim must be even and match the cache (head_dim + 4 int8 elements per row in an int8 cache)");
  require(dim(qkv, 1) == (a.num_heads + 2 * a.num_kv_heads) * a.head_dim && dim(q_out, 0) == a.tokens, op,
          "qkv width must be (H + 2*Hkv) * D");
  require(value_cache.size() == key_cache.size(), op, "key and value caches must have one shape");
  require(cos.size() == static_cast<size_t>(a.tokens * a.head_dim) && sin.size() == cos.size(), op,
          "cos and sin must be (T, D)");
  require(slot_mapping.size() == static_cast<size_t>(a.tokens), op, "slot_mapping must have one slot per token");
  const int64_t* slot = static_cast<const int64_t*>(slot_mapping.data());
  for (int64_t t = 0; t < a.tokens; ++t) require(0 <= slot[t] && slot[t] < slots, op, "slot out of the cache's range");
  a.qkv = qkv.data();
  a.cos = static_cast<const float*>(cos.data());
  a.sin = static_cast<const float*>(sin.data());
  a.slot_mapping = slot;
  a.q_out = q_out.data();
  a.key_cache = key_cache.data();
  a.value_cache = value_cache.data();
  nb::gil_scoped_release release;
  shrike::rope_write_kv(a);
}

void gelu_tanh_mul(const Array& gate_up, Array& out) {
  const std::string op = "gelu_tanh_mul";
  shrike::DType dt = float_dtype(gate_up, op, "gate_up");
  require(float_dtype(out, op, "out") == dt, op, "gate_up and out must share one dtype");
  require(gate_up.ndim() == 2 && out.ndim() == 2 && dim(gate_up, 0) == dim(out, 0) && dim(gate_up, 1) == 2 * dim(out, 1),
          op, "gate_up must be (rows, 2*width) and out (rows, width)");
  nb::gil_scoped_release release;
  shrike::gelu_tanh_mul(gate_up.data(), out.data(), dim(out, 0), dim(out, 1), dt);
}

void scale_in_place(Array& x, float factor, bool divide) {
  const std::string op = divide ? "div_scalar" : "mul_scalar";
  shrike::DType dt = float_dtype(x, op, "x");
  shrike::scale_values(x.data(), static_cast<int64_t>(x.size()), factor, divide, dt);
}

void softcap(Array& x, float cap) {
  require(x.dtype() == nb::dtype<float>(), "softcap", "x must be float32 logits");
  require(cap > 0, "softcap", "cap must be positive");
  shrike::softcap(static_cast<float*>(x.data()), static_cast<int64_t>(x.size()), cap);
}

void head_rmsnorm(const Array& qkv, const Array& q_weight, const Array& k_weight, Array& out, int64_t num_heads,
                  int64_t num_kv_heads, float eps) {
  const std::string op = "head_rmsnorm";
  shrike::DType dt = float_dtype(qkv, op, "qkv");
  require(float_dtype(q_weight, op, "q_weight") == dt && float_dtype(k_weight, op, "k_weight") == dt &&
              float_dtype(out, op, "out") == dt, op, "qkv, weights and out must share one dtype");
  const int64_t d = static_cast<int64_t>(q_weight.size());
  require(k_weight.size() == q_weight.size() && qkv.ndim() == 2 && dim(qkv, 1) == (num_heads + 2 * num_kv_heads) * d &&
              out.size() == qkv.size(), op, "qkv and out must be (T, (H + 2*Hkv) * D), weights (D,)");
  const size_t e = dt == shrike::DType::f32 ? 4 : 2, row = dim(qkv, 1) * e;
  const size_t k_offset = num_heads * d * e, v_offset = (num_heads + num_kv_heads) * d * e;
  const auto* in = static_cast<const uint8_t*>(qkv.data());
  auto* o = static_cast<uint8_t*>(out.data());
  nb::gil_scoped_release release;
  for (int64_t t = 0; t < dim(qkv, 0); ++t) {
    shrike::rmsnorm(in + t * row, q_weight.data(), o + t * row, num_heads, d, eps, dt);
    shrike::rmsnorm(in + t * row + k_offset, k_weight.data(), o + t * row + k_offset, num_kv_heads, d, eps, dt);
    std::memcpy(o + t * row + v_offset, in + t * row + v_offset, row - v_offset);
  }
}

}  // namespace

void bind_fused(nb::module_& m) {
  m.def("gelu_tanh_mul", &gelu_tanh_mul, nb::arg("gate_up"), nb::arg("out").noconvert(),
        "out = gelu_tanh(gate) * up for gate_up = [gate | up].");
  m.def("mul_scalar", [](Array& x, float factor) { scale_in_place(x, factor, false); }, nb::arg("x").noconvert(),
        nb::arg("factor"), "x *= factor in place, rounded to x's dtype.");
  m.def("div_scalar", [](Array& x, float divisor) { scale_in_place(x, divisor, true); }, nb::arg("x").noconvert(),
        nb::arg("divisor"), "x /= divisor in place, rounded to x's dtype.");
  m.def("softcap", &softcap, nb::arg("x").noconvert(), nb::arg("cap"), "x = tanh(x / cap) * cap in place (float32).");
  m.def("head_rmsnorm", &head_rmsnorm, nb::arg("qkv"), nb::arg("q_weight"), nb::arg("k_weight"), nb::arg("out").noconvert(),
        nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("eps"),
        "out = qkv with each q head and k head RMS-normalised (v copied).");
  m.def("add_rmsnorm", &add_rmsnorm, nb::arg("x"), nb::arg("residual").noconvert(), nb::arg("weight"), nb::arg("out").noconvert(),
        nb::arg("eps"), "residual += x; out = rmsnorm(residual) * weight.");
  m.def("embedding", &embedding, nb::arg("token_ids"), nb::arg("table"), nb::arg("out").noconvert(), nb::arg("scale"),
        "out = table[token_ids] * scale (the multiply only when scale != 1).");
  m.def("packed_embedding", &packed_embedding, nb::arg("token_ids"), nb::arg("packed"), nb::arg("n"), nb::arg("k"),
        nb::arg("group"), nb::arg("bits"), nb::arg("has_min"), nb::arg("codebook"), nb::arg("params"), nb::arg("out").noconvert(),
        nb::arg("scale"), "out[t] = row token_ids[t] of a grouped weight as its bf16 conversion holds it, * scale.");
  m.def("silu_mul", &silu_mul, nb::arg("gate_up"), nb::arg("out").noconvert(), "out = silu(gate) * up for gate_up = [gate | up].");
  m.def("rope_write_kv", &rope_write_kv, nb::arg("qkv"), nb::arg("cos"), nb::arg("sin"), nb::arg("slot_mapping"),
        nb::arg("q_out").noconvert(), nb::arg("key_cache").noconvert(), nb::arg("value_cache").noconvert(),
        "Rotate q and k (rotate-half RoPE), write q to q_out and k, v into the caches at slot_mapping.");
}
