// Bindings for paged attention. Every argument, including every block id a sequence uses, is
// checked here, so a wrong tensor raises instead of reading outside the cache.
#include <cstdint>
#include <string>

#include <nanobind/stl/string.h>

#include "attention/attention.h"
#include "attention/kv_int8.h"
#include "bindings.h"
#include "bindings_util.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

const std::string kOp = "paged_attention";

[[noreturn]] void fail(const std::string& message) { throw nb::value_error((kOp + ": " + message).c_str()); }

// Contiguous with exactly `ndim` dimensions.
void expect_layout(const Array& a, const char* name, size_t ndim) {
  if (a.ndim() != ndim) fail(std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " + shape_text(a));
  if (!contiguous(a)) fail(std::string(name) + " must be contiguous");
}

const int32_t* int32_data(const Array& a, const char* name, size_t ndim) {
  if (a.dtype() != nb::dtype<int32_t>()) throw nb::type_error((kOp + ": " + name + " must be int32").c_str());
  expect_layout(a, name, ndim);
  return static_cast<const int32_t*>(a.data());
}

shrike::PagedAttentionArgs checked_args(const Array& q, const Array& key_cache, const Array& value_cache,
                                        const Array& block_tables, const Array& query_start, const Array& context_lens,
                                        int64_t block_size, float scale, Array& out, int64_t sliding_window) {
  shrike::PagedAttentionArgs a{};
  a.q_dtype = float_dtype(q, kOp, "q");
  a.cache_dtype = cache_dtype(key_cache, kOp, "key_cache");
  if (cache_dtype(value_cache, kOp, "value_cache") != a.cache_dtype) fail("key_cache and value_cache must share one dtype");
  if (float_dtype(out, kOp, "out") != a.q_dtype) fail("out must have q's dtype");
  expect_layout(q, "q", 3);
  expect_layout(key_cache, "key_cache", 3);
  expect_layout(value_cache, "value_cache", 3);
  expect_layout(out, "out", 3);
  const int64_t tokens = dim(q, 0), slots = dim(key_cache, 0);
  a.num_heads = dim(q, 1), a.head_dim = dim(q, 2), a.num_kv_heads = dim(key_cache, 1);
  for (size_t i = 0; i < 3; ++i) {
    if (value_cache.shape(i) != key_cache.shape(i)) fail("value_cache shape " + shape_text(value_cache) + " != key_cache shape " + shape_text(key_cache));
    if (out.shape(i) != q.shape(i)) fail("out shape " + shape_text(out) + " != q shape " + shape_text(q));
  }
  const int64_t cache_row = a.cache_dtype == shrike::DType::i8 ? shrike::kv_int8_row_bytes(a.head_dim) : a.head_dim;
  if (dim(key_cache, 2) != cache_row)
    fail("cache rows have " + std::to_string(dim(key_cache, 2)) + " elements, q head_dim " + std::to_string(a.head_dim) +
         (a.cache_dtype == shrike::DType::i8 ? " needs head_dim + 4 in an int8 cache" : " needs as many"));
  if (a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads)
    fail("q heads (" + std::to_string(a.num_heads) + ") must be a multiple of the KV heads (" + std::to_string(a.num_kv_heads) + ")");
  if (a.head_dim < 1) fail("head_dim must be positive");
  if (block_size < 1) fail("block_size must be positive");
  if (sliding_window < 0) fail("sliding_window must be 0 (off) or a positive number of positions");

  a.block_tables = int32_data(block_tables, "block_tables", 2);
  a.context_lens = int32_data(context_lens, "context_lens", 1);
  a.query_start = int32_data(query_start, "query_start", 1);
  a.num_seqs = dim(context_lens, 0), a.max_blocks = dim(block_tables, 1);
  if (dim(block_tables, 0) != a.num_seqs || dim(query_start, 0) != a.num_seqs + 1)
    fail("block_tables " + shape_text(block_tables) + ", query_start " + shape_text(query_start) + " and context_lens " +
         shape_text(context_lens) + " disagree on the number of sequences");
  if (a.query_start[0] != 0 || a.query_start[a.num_seqs] != tokens) fail("query_start must run from 0 to q.shape[0]");
  const int64_t cache_blocks = slots / block_size;
  for (int64_t b = 0; b < a.num_seqs; ++b) {
    const int64_t q_len = a.query_start[b + 1] - a.query_start[b], ctx = a.context_lens[b];
    if (q_len < 0 || q_len > ctx)
      fail("sequence " + std::to_string(b) + " has " + std::to_string(q_len) + " new tokens but context length " + std::to_string(ctx));
    const int64_t used = (ctx + block_size - 1) / block_size;
    if (used > a.max_blocks) fail("sequence " + std::to_string(b) + " needs " + std::to_string(used) + " blocks, block_tables has " + std::to_string(a.max_blocks));
    for (int64_t i = 0; i < used; ++i) {
      const int32_t block = a.block_tables[b * a.max_blocks + i];
      if (block < 0 || block >= cache_blocks)
        fail("sequence " + std::to_string(b) + " uses block " + std::to_string(block) + ", the cache has " + std::to_string(cache_blocks));
    }
  }
  a.q = q.data(), a.key_cache = key_cache.data(), a.value_cache = value_cache.data(), a.out = out.data();
  a.block_size = block_size, a.scale = scale, a.sliding_window = sliding_window;
  return a;
}

void paged_attention(const Array& q, const Array& key_cache, const Array& value_cache, const Array& block_tables,
                     const Array& query_start, const Array& context_lens, int64_t block_size, float scale, Array& out,
                     int64_t sliding_window) {
  const shrike::PagedAttentionArgs a = checked_args(q, key_cache, value_cache, block_tables, query_start, context_lens,
                                                    block_size, scale, out, sliding_window);
  nb::gil_scoped_release release;
  shrike::paged_attention(a);
}

void paged_attention_amx_reference(const Array& q, const Array& key_cache, const Array& value_cache,
                                   const Array& block_tables, const Array& query_start, const Array& context_lens,
                                   int64_t block_size, float scale, Array& out, int64_t sliding_window) {
  const shrike::PagedAttentionArgs a = checked_args(q, key_cache, value_cache, block_tables, query_start, context_lens,
                                                    block_size, scale, out, sliding_window);
  if (!shrike::amx_attention_serves(a)) fail("the AMX walk takes bf16 queries, a bf16 or int8 cache and head_dim % 32 == 0");
  nb::gil_scoped_release release;
  shrike::paged_attention_amx_reference(a);
}

void paged_attention_int16_reference(const Array& q, const Array& key_cache, const Array& value_cache,
                                     const Array& block_tables, const Array& query_start, const Array& context_lens,
                                     int64_t block_size, float scale, Array& out, int64_t sliding_window) {
  const shrike::PagedAttentionArgs a = checked_args(q, key_cache, value_cache, block_tables, query_start, context_lens,
                                                    block_size, scale, out, sliding_window);
  if (!shrike::int16_attention_serves(a))
    fail("the int16-dot walk takes bf16 queries, an int8 cache and head_dim % 32 == 0, at most 256");
  nb::gil_scoped_release release;
  shrike::paged_attention_int16_reference(a);
}

shrike::DType attention_dtype(const std::string& name) {
  if (name == "float32") return shrike::DType::f32;
  if (name == "bfloat16") return shrike::DType::bf16;
  if (name == "int8") return shrike::DType::i8;
  throw nb::value_error(("attention_variant: dtype must be float32, bfloat16 or int8, got " + name).c_str());
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention_variant", [](const std::string& q_dtype, const std::string& cache_dtype, int64_t head_dim) {
    return std::string(shrike::attention_variant(attention_dtype(q_dtype), attention_dtype(cache_dtype), head_dim));
  }, nb::arg("q_dtype"), nb::arg("cache_dtype"), nb::arg("head_dim"),
        "The walk paged_attention runs at the active level: amx, avx512vnni-int16, avx512vnni, avx2, sve2, neon "
        "or scalar.");
  m.def("paged_attention", &paged_attention, nb::arg("q"), nb::arg("key_cache"), nb::arg("value_cache"),
        nb::arg("block_tables"), nb::arg("query_start"), nb::arg("context_lens"), nb::arg("block_size"), nb::arg("scale"),
        nb::arg("out").noconvert(), nb::arg("sliding_window") = 0,
        "Causal attention of q (T, H, D) over a paged KV cache (S, Hkv, D), or int8 rows (S, Hkv, D + 4), "
        "written to out (T, H, D); sliding_window W > 0 limits each query to its last W positions; "
        "see csrc/attention/attention.h.");
  m.def("paged_attention_amx_reference", &paged_attention_amx_reference, nb::arg("q"), nb::arg("key_cache"),
        nb::arg("value_cache"), nb::arg("block_tables"), nb::arg("query_start"), nb::arg("context_lens"),
        nb::arg("block_size"), nb::arg("scale"), nb::arg("out").noconvert(), nb::arg("sliding_window") = 0,
        "paged_attention computed by the scalar model of the AMX kernel, on any CPU: the bits the amx variant "
        "gives (bf16 q, bf16 or int8 cache, head_dim % 32 == 0; for tests).");
  m.def("paged_attention_int16_reference", &paged_attention_int16_reference, nb::arg("q"), nb::arg("key_cache"),
        nb::arg("value_cache"), nb::arg("block_tables"), nb::arg("query_start"), nb::arg("context_lens"),
        nb::arg("block_size"), nb::arg("scale"), nb::arg("out").noconvert(), nb::arg("sliding_window") = 0,
        "paged_attention computed by the scalar model of the int16-dot walk, on any CPU: the bits the "
        "avx512vnni-int16 walk gives (bf16 q, int8 cache, head_dim % 32 == 0 and <= 256; for tests).");
}
