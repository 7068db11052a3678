// Checks the scalar paged-attention reference against a naive double-precision attention, then
// every other available variant against the reference, over decode, prefill and chunked-prefill
// batches, with and without a sliding window. Where the AMX walk serves a case (bf16 queries, bf16 or
// int8 cache, head_dim % 32 == 0), its scalar model is checked against the naive attention too, and the
// amx variant must equal the model bit for bit (reported as skipped, by name, on a CPU without it). Unused cache slots hold NaN, and so do positions
// older than every query's window, so a read outside a sequence's visible keys shows up.
// Built without Python so the Arm variants can run under qemu-user.
//
//   test_attention_driver [--isa NAME] [--expect NAME,NAME] [--quick]
// --isa     test only this variant (besides the reference)
// --quick   block size 16 only (the block walk is code all variants share), for qemu
// --expect  fail unless these variants are available
// Exit status 0 only if every comparison was within tolerance.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/kv_int8.h"
#include "common/bf16.h"
#include "common/isa.h"
#include "runtime/threadpool.h"

namespace {

using namespace shrike;

struct Case {
  std::string name;
  std::vector<int32_t> query_lens, context_lens;
  int64_t heads, kv_heads, head_dim, block_size;
  DType q_dtype, cache_dtype;
  // q = 0: every attention weight is exactly 1 in every variant, so the output (the mean of the
  // values in key order) must match the reference bit for bit.
  bool zero_q = false;
  int64_t window = 0;  // sliding window, 0 = off
};

// Values as stored (bf16 ones already rounded, int8 ones dequantized), kept as float for the naive
// attention. An int8 tensor holds rows of `row` values, each stored as kv_int8.h's row.
struct Tensor {
  std::vector<float> values;
  std::vector<uint8_t> bytes;
  DType dtype;
  int64_t row = 0;  // i8 only
  void resize(size_t n, DType dt, int64_t row_values = 0) {
    values.assign(n, 0.f);
    dtype = dt, row = row_values;
    bytes.assign(dt == DType::i8 ? n / row * kv_int8_row_bytes(row) : n * (dt == DType::f32 ? 4 : 2), 0);
  }
  // Quantizes one int8 row from x (row values).
  void set_row(size_t r, const float* x) {
    int8_t* dst = reinterpret_cast<int8_t*>(bytes.data() + r * kv_int8_row_bytes(row));
    kv_int8_quantize(x, row, dst);
    const float scale = kv_int8_scale(dst, row);
    for (int64_t i = 0; i < row; ++i) values[r * row + i] = static_cast<float>(dst[i]) * scale;
  }
  // An int8 row whose scale is NaN, so that reading it poisons the output.
  void poison_row(size_t r) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bytes.data() + r * kv_int8_row_bytes(row) + row, &nan, sizeof nan);
  }
  void set(size_t i, float v) {
    if (dtype == DType::f32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
      values[i] = v;
    } else {
      bf16 b = float_to_bf16(v);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      values[i] = bf16_to_float(b);
    }
  }
  float get(size_t i) const {
    if (dtype == DType::f32) {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    bf16 b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    return bf16_to_float(b);
  }
};

struct Batch {
  Tensor q, key_cache, value_cache;        // (T, H, D), (slots, Hkv, D), (slots, Hkv, D)
  std::vector<int32_t> block_tables;       // (B, max_blocks)
  std::vector<int32_t> query_start;        // (B + 1,)
  std::vector<std::vector<int64_t>> slots; // per sequence: slot of each position
  int64_t max_blocks = 0, tokens = 0;
};

std::mt19937 rng(1234);

Batch make_batch(const Case& c) {
  Batch b;
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t seqs = c.context_lens.size(), row = c.kv_heads * c.head_dim;
  int64_t total_blocks = 2;  // spare blocks stay NaN
  for (int32_t len : c.context_lens) {
    b.max_blocks = std::max<int64_t>(b.max_blocks, (len + c.block_size - 1) / c.block_size);
    total_blocks += (len + c.block_size - 1) / c.block_size;
  }
  std::vector<int32_t> order(total_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t cache_size = total_blocks * c.block_size * row;
  const bool int8 = c.cache_dtype == DType::i8;
  b.key_cache.resize(cache_size, c.cache_dtype, c.head_dim);
  b.value_cache.resize(cache_size, c.cache_dtype, c.head_dim);
  for (size_t i = 0; i < (int8 ? cache_size / c.head_dim : cache_size); ++i) {
    if (int8) {
      b.key_cache.poison_row(i), b.value_cache.poison_row(i);
      continue;
    }
    b.key_cache.set(i, std::numeric_limits<float>::quiet_NaN());
    b.value_cache.set(i, std::numeric_limits<float>::quiet_NaN());
  }
  b.block_tables.assign(seqs * std::max<int64_t>(b.max_blocks, 1), 0);
  b.query_start.push_back(0);
  size_t next_block = 0;
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = c.context_lens[s];
    std::vector<int64_t> seq_slots;
    for (int64_t p = 0; p < len; ++p) {
      if (p % c.block_size == 0) b.block_tables[s * b.max_blocks + p / c.block_size] = order[next_block++];
      const int64_t slot = b.block_tables[s * b.max_blocks + p / c.block_size] * c.block_size + p % c.block_size;
      seq_slots.push_back(slot);
      // Positions no query's window reaches stay NaN, as if their block had been reused.
      const int64_t oldest_seen = c.window > 0 ? len - c.query_lens[s] - c.window + 1 : 0;
      if (p < oldest_seen) continue;
      if (int8) {
        std::vector<float> k(c.head_dim), v(c.head_dim);
        for (int64_t h = 0; h < c.kv_heads; ++h) {
          for (int64_t i = 0; i < c.head_dim; ++i) k[i] = normal(rng), v[i] = normal(rng);
          b.key_cache.set_row(slot * c.kv_heads + h, k.data());
          b.value_cache.set_row(slot * c.kv_heads + h, v.data());
        }
        continue;
      }
      for (int64_t i = 0; i < row; ++i) {
        b.key_cache.set(slot * row + i, normal(rng));
        b.value_cache.set(slot * row + i, normal(rng));
      }
    }
    b.slots.push_back(seq_slots);
    b.query_start.push_back(b.query_start.back() + c.query_lens[s]);
  }
  b.tokens = b.query_start.back();
  b.q.resize(b.tokens * c.heads * c.head_dim, c.q_dtype);
  for (size_t i = 0; i < b.q.values.size(); ++i) b.q.set(i, c.zero_q ? 0.f : normal(rng));
  return b;
}

// Softmax attention in double, straight from the definition. (T, H, D)
std::vector<double> naive_attention(const Case& c, const Batch& b, float scale) {
  const int64_t d = c.head_dim, group = c.heads / c.kv_heads;
  std::vector<double> out(b.tokens * c.heads * d, 0.0);
  for (size_t s = 0; s < c.context_lens.size(); ++s) {
    const int64_t q_len = c.query_lens[s], first_pos = c.context_lens[s] - q_len;
    for (int64_t t = 0; t < q_len; ++t)
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t kvh = h / group, visible = first_pos + t + 1;
        const int64_t oldest = c.window > 0 ? std::max<int64_t>(0, visible - c.window) : 0;
        const float* q = &b.q.values[((b.query_start[s] + t) * c.heads + h) * d];
        std::vector<double> score(visible, -std::numeric_limits<double>::infinity());
        for (int64_t p = oldest; p < visible; ++p) {
          const float* k = &b.key_cache.values[(b.slots[s][p] * c.kv_heads + kvh) * d];
          double dot = 0.0;
          for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
          score[p] = dot * scale;
        }
        const double max = *std::max_element(score.begin(), score.end());
        double sum = 0.0;
        for (double& v : score) sum += (v = std::exp(v - max));
        double* o = &out[((b.query_start[s] + t) * c.heads + h) * d];
        for (int64_t p = oldest; p < visible; ++p) {
          const float* v = &b.value_cache.values[(b.slots[s][p] * c.kv_heads + kvh) * d];
          for (int64_t i = 0; i < d; ++i) o[i] += score[p] / sum * v[i];
        }
      }
  }
  return out;
}

PagedAttentionArgs args_of(const Case& c, const Batch& b, float scale, void* out) {
  PagedAttentionArgs a{};
  a.q = b.q.bytes.data(), a.key_cache = b.key_cache.bytes.data(), a.value_cache = b.value_cache.bytes.data();
  a.out = out;
  a.block_tables = b.block_tables.data(), a.query_start = b.query_start.data(), a.context_lens = c.context_lens.data();
  a.num_seqs = c.context_lens.size(), a.max_blocks = std::max<int64_t>(b.max_blocks, 1);
  a.num_heads = c.heads, a.num_kv_heads = c.kv_heads, a.head_dim = c.head_dim, a.block_size = c.block_size;
  a.scale = scale, a.q_dtype = c.q_dtype, a.cache_dtype = c.cache_dtype, a.sliding_window = c.window;
  return a;
}

Tensor run(const Case& c, const Batch& b, float scale, Isa isa) {
  set_active_isa(isa_name(isa));
  Tensor out;
  out.resize(b.q.values.size(), c.q_dtype);
  paged_attention(args_of(c, b, scale, out.bytes.data()));
  return out;
}

// The scalar model of the AMX walk, on any CPU.
Tensor run_amx_model(const Case& c, const Batch& b, float scale) {
  Tensor out;
  out.resize(b.q.values.size(), c.q_dtype);
  paged_attention_amx_reference(args_of(c, b, scale, out.bytes.data()));
  return out;
}

struct Tally {
  int checks = 0, failures = 0;
};

std::vector<double> as_double(const Tensor& t) {
  std::vector<double> out(t.values.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = t.get(i);
  return out;
}

// |got - want| <= tol * (1 + |want|) everywhere; a NaN fails.
void expect_close(Tally& tally, const Tensor& got, const std::vector<double>& want, double tol, const std::string& what) {
  ++tally.checks;
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got.get(i) - want[i]) / (1.0 + std::abs(want[i]));
    if (std::isnan(err) || err > worst) worst = err, worst_at = i;
    if (std::isnan(err)) break;
  }
  if (!(worst <= tol)) {
    ++tally.failures;
    std::printf("FAIL %s: element %zu is %g, expected %g (error %.3g > %.3g)\n", what.c_str(), worst_at,
                got.get(worst_at), want[worst_at], worst, tol);
  }
}

std::vector<Case> cases(bool quick) {
  struct Scenario {
    const char* name;
    std::vector<int32_t> query_lens, context_lens;
  };
  const std::vector<Scenario> scenarios = {
      {"decode", {1, 1, 1, 1}, {1, 17, 100, 1000}},
      {"prefill", {37, 64}, {37, 64}},
      {"chunked", {45, 20, 1}, {300, 20, 33}},
  };
  const int64_t heads[][2] = {{4, 4}, {6, 2}, {8, 1}};
  const std::vector<int64_t> block_sizes = quick ? std::vector<int64_t>{16} : std::vector<int64_t>{16, 32};
  std::vector<Case> out;
  for (const Scenario& s : scenarios)
    for (auto [h, kvh] : heads)
      for (int64_t d : {64, 128})
        for (int64_t bs : block_sizes)
          for (DType dt : {DType::f32, DType::bf16}) {
            std::string name = std::string(s.name) + " H" + std::to_string(h) + "/" + std::to_string(kvh) + " D" +
                               std::to_string(d) + " bs" + std::to_string(bs) + (dt == DType::f32 ? " f32" : " bf16");
            out.push_back({name, s.query_lens, s.context_lens, h, kvh, d, bs, dt, dt});
          }
  for (int64_t d : {4, 36, 80, 200})  // tails of every vector loop
    out.push_back({"odd D" + std::to_string(d), {1, 50}, {70, 50}, 6, 2, d, 16, DType::f32, DType::f32});
  out.push_back({"q f32, cache bf16", {3, 1}, {40, 9}, 4, 2, 64, 16, DType::f32, DType::bf16});
  out.push_back({"q bf16, cache f32", {3, 1}, {40, 9}, 4, 2, 64, 16, DType::bf16, DType::f32});
  // int8 cache, and decode long enough to be split by keys (split-K) for every cache dtype.
  for (DType q_dt : {DType::f32, DType::bf16}) {
    const char* q_name = q_dt == DType::f32 ? " q f32" : " q bf16";
    out.push_back({std::string("int8 decode") + q_name, {1, 1, 1}, {1, 100, 1000}, 16, 2, 128, 16, q_dt, DType::i8});
    out.push_back({std::string("int8 chunked") + q_name, {45, 20, 1}, {300, 20, 33}, 6, 2, 64, 16, q_dt, DType::i8});
    out.push_back({std::string("int8 split-K") + q_name, {1, 3}, {2500, 1100}, 16, 2, 128, 16, q_dt, DType::i8});
    out.push_back({std::string("split-K") + q_name, {1, 3}, {2500, 1100}, 8, 2, 64, 16, q_dt, q_dt});
  }
  out.push_back({"int8 value path (q = 0), exact", {1, 4, 2}, {2500, 300, 40}, 16, 2, 128, 16, DType::f32, DType::i8, true});
  out.push_back({"int8 value path (q = 0), exact, D 36", {1, 2}, {1500, 40}, 6, 2, 36, 16, DType::f32, DType::i8, true});
  // Sliding windows: shorter than a tile, across block and tile edges, longer than some contexts.
  for (int64_t window : {1, 7, 40, 512})
    for (DType dt : {DType::f32, DType::bf16}) {
      const std::string suffix = " window" + std::to_string(window) + (dt == DType::f32 ? " f32" : " bf16");
      out.push_back({"decode" + suffix, {1, 1, 1, 1}, {1, 17, 100, 1000}, 4, 1, 64, 16, dt, dt, false, window});
      out.push_back({"chunked" + suffix, {45, 20, 1}, {300, 20, 33}, 8, 2, 64, 16, dt, dt, false, window});
    }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, expect;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--isa" && i + 1 < argc) only = argv[++i];
    else if (arg == "--expect" && i + 1 < argc) expect = argv[++i];
    else if (arg == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--isa NAME] [--expect NAME,NAME] [--quick]\n", argv[0]);
      return 2;
    }
  }
  runtime::set_threads(2, {});  // exercise the pool path as well
  std::string available;
  for (int i = 0; i < kNumIsas; ++i)
    if (isa_available(static_cast<Isa>(i))) available += std::string(available.empty() ? "" : ",") + isa_name(static_cast<Isa>(i));
  std::printf("available variants: %s\n", available.c_str());
  for (size_t pos = 0; !expect.empty() && pos != std::string::npos;) {
    size_t comma = expect.find(',', pos);
    std::string name = expect.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? comma : comma + 1;
    if (("," + available + ",").find("," + name + ",") == std::string::npos) {
      std::printf("FAIL expected variant %s is not available\n", name.c_str());
      return 1;
    }
  }

  Tally reference, variants[kNumIsas], amx_model, amx_exact;
  const bool amx_runs = isa_available(Isa::amx) && (only.empty() || only == "amx");
  for (const Case& c : cases(quick)) {
    const Batch b = make_batch(c);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    // The output is rounded to bf16 when q is bf16 (relative step 2^-8).
    const double tol = c.q_dtype == DType::f32 ? 1e-5 : 1e-2;
    const double variant_tol = c.zero_q ? 0.0 : tol;
    const Tensor reference_out = run(c, b, scale, Isa::scalar);
    const std::vector<double> naive = naive_attention(c, b, scale);
    expect_close(reference, reference_out, naive, tol, "scalar vs naive: " + c.name);
    if (amx_attention_serves(args_of(c, b, scale, nullptr))) {
      // The AMX walk also rounds P to bf16 (tests/test_attention_amx.py measures it).
      const Tensor model_out = run_amx_model(c, b, scale);
      expect_close(amx_model, model_out, naive, 2.5e-2, "amx model vs naive: " + c.name);
      if (amx_runs) expect_close(amx_exact, run(c, b, scale, Isa::amx), as_double(model_out), 0.0, "amx vs its model: " + c.name);
    }
    const std::vector<double> want = as_double(reference_out);
    for (int i = 1; i < kNumIsas; ++i) {
      const Isa isa = static_cast<Isa>(i);
      if (!isa_available(isa) || (!only.empty() && only != isa_name(isa))) continue;
      expect_close(variants[i], run(c, b, scale, isa), want, variant_tol, std::string(isa_name(isa)) + ": " + c.name);
    }
  }
  int failures = reference.failures + amx_model.failures + amx_exact.failures;
  std::printf("%-8s %4d checks, %d failures (against naive double attention)\n", "scalar", reference.checks, reference.failures);
  std::printf("%-8s %4d checks, %d failures (the AMX walk's scalar model, against naive double attention)\n",
              "amx model", amx_model.checks, amx_model.failures);
  if (amx_runs) std::printf("%-8s %4d checks, %d failures (bit for bit against its model)\n", "amx exact", amx_exact.checks, amx_exact.failures);
  else std::printf("%-8s skipped: %s\n", "amx exact", isa_available(Isa::amx) ? "--isa names another variant" : "this CPU cannot run amx");
  for (int i = 1; i < kNumIsas; ++i) {
    if (!variants[i].checks) continue;
    std::printf("%-8s %4d checks, %d failures\n", isa_name(static_cast<Isa>(i)), variants[i].checks, variants[i].failures);
    failures += variants[i].failures;
  }
  return failures ? 1 : 0;
}
