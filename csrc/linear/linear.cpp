// Dispatch: quantize the activations, then spread output tiles over the thread pool.
#include "linear/linear.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/variants.h"
#include "linear/layout.h"
#include "quant/act_quant.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using W4A8Tiles = void (*)(const W4A8Problem&, int64_t, int64_t);
using W8A8Tiles = void (*)(const W8A8Problem&, int64_t, int64_t);

// One call's shape as the variants' conditions see it; group is 0 for W8A8.
struct LinearCall {
  int64_t m, k, group;
};

// smmla computes two rows at once; a single decode row is better served by sdot. AMX tiles
// take 16 rows and 64 K at a time and only pay off from 32 rows (measured: at 16 rows AVX-512
// is faster); W4A8 groups of 32 would need a second tile shape. The avx512bf16 level has no int8
// kernels of its own: it runs avx512vnni's.
bool amx_serves(const LinearCall& c) { return c.m >= 32 && c.k % 64 == 0 && c.group != 32; }
bool i8mm_serves(const LinearCall& c) { return c.m >= 2; }
constexpr const char* kAmxW4A8Condition = "m >= 32, k % 64 == 0, group 64 or 128";
constexpr const char* kAmxW8A8Condition = "m >= 32, k % 64 == 0";
constexpr const char* kI8mmCondition = "m >= 2";

template <typename Tiles>
using LinearVariant = Variant<Tiles, LinearCall>;

const LinearVariant<W4A8Tiles> kW4A8[] = {
#if defined(SHRIKE_X86)
    {Isa::amx, amx::w4a8_tiles, amx_serves, kAmxW4A8Condition},
    {Isa::avx512vnni, avx512vnni::w4a8_tiles},
    {Isa::avxvnni, avxvnni::w4a8_tiles},
    {Isa::avx2, avx2::w4a8_tiles},
#elif defined(SHRIKE_AARCH64)
    {Isa::sve2, sve2::w4a8_tiles},
    {Isa::i8mm, i8mm::w4a8_tiles, i8mm_serves, kI8mmCondition},
    {Isa::dotprod, dotprod::w4a8_tiles},
#endif
    {Isa::scalar, ref::w4a8_tiles},
};

const LinearVariant<W8A8Tiles> kW8A8[] = {
#if defined(SHRIKE_X86)
    {Isa::amx, amx::w8a8_tiles, amx_serves, kAmxW8A8Condition},
    {Isa::avx512vnni, avx512vnni::w8a8_tiles},
    {Isa::avxvnni, avxvnni::w8a8_tiles},
    {Isa::avx2, avx2::w8a8_tiles},
#elif defined(SHRIKE_AARCH64)
    {Isa::sve2, sve2::w8a8_tiles},
    {Isa::i8mm, i8mm::w8a8_tiles, i8mm_serves, kI8mmCondition},
    {Isa::dotprod, dotprod::w8a8_tiles},
#endif
    {Isa::scalar, ref::w8a8_tiles},
};

const LinearVariant<W4A8Tiles>& w4a8_variant(int64_t m, int64_t k, int64_t group) {
  return pick_variant(kW4A8, LinearCall{m, k, group});
}
const LinearVariant<W8A8Tiles>& w8a8_variant(int64_t m, int64_t k) { return pick_variant(kW8A8, LinearCall{m, k, 0}); }
W4A8Tiles w4a8_kernel(int64_t m, int64_t k, int64_t group) { return w4a8_variant(m, k, group).fn; }
W8A8Tiles w8a8_kernel(int64_t m, int64_t k) { return w8a8_variant(m, k).fn; }
// Whether the call runs on AMX tiles (whose activations are packed as tiles first).
bool on_tiles(int64_t m, int64_t k, int64_t group) {
  return (group ? w4a8_variant(m, k, group).level : w8a8_variant(m, k).level) == Isa::amx;
}

// Decode (few rows) wants many small chunks so slow cores cannot stall the call; prefill
// wants chunks small enough that a chunk of tiles stays in L2 while every row block reuses it.
// Even counts keep the AVX-512 kernels' tile pairs whole, and make a task's columns 64 bytes
// of bf16 output or more, so neighbouring tasks share no cache line when the row is aligned.
int64_t tiles_per_task(int64_t tiles, int64_t m) {
  int64_t threads = runtime::num_threads();
  int64_t cap = m <= 4 ? 16 : 4;
  return std::max<int64_t>(2, std::min(cap, tiles / (threads * 8)) & ~int64_t{1});
}

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which threads cost more than they save

template <typename Problem, typename Kernel>
void run_tiles(const Problem& p, Kernel kernel) {
  int64_t tiles = tile_count(p.n);
  if (p.m * p.n * p.k < kSerialWork) return kernel(p, 0, tiles);
  int64_t per_task = tiles_per_task(tiles, p.m);
  runtime::parallel_for((tiles + per_task - 1) / per_task, [&](int64_t t) {
    kernel(p, t * per_task, std::min(tiles, (t + 1) * per_task));
  });
}

// Rows per quantization task; quantizing is cheap next to the GEMM but not for prefill.
constexpr int64_t kQuantRows = 16;

template <typename Fn>
void over_row_blocks(int64_t m, int64_t k, Fn fn) {
  if (m * k < kSerialWork) return fn(0, m);
  runtime::parallel_for((m + kQuantRows - 1) / kQuantRows,
                        [&](int64_t t) { fn(t * kQuantRows, std::min(m, (t + 1) * kQuantRows)); });
}

int32_t row_sum(const int8_t* q, int64_t k) {
  int32_t sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += q[j];
  return sum;
}

// The AMX kernel loads activation tiles of 16 rows x 64 K. Read from q, a tile's rows are k
// bytes apart, which puts all 16 in two L1 sets when k is a multiple of 2048; packed, each tile
// is 1 KiB in one piece. Packs the whole 16-row blocks of rows [r0, r1), r0 a multiple of 16.
void pack_activation_tiles(const int8_t* q, int64_t r0, int64_t r1, int64_t k, int8_t* tiles) {
  for (int64_t b = r0 / 16; b < r1 / 16; ++b)
    for (int64_t kb = 0; kb < k / 64; ++kb)
      for (int64_t r = 0; r < 16; ++r)
        std::memcpy(tiles + ((b * (k / 64) + kb) * 16 + r) * 64, q + (b * 16 + r) * k + kb * 64, 64);
}

size_t element_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

struct Workspace {
  std::vector<int8_t> q, q_tiles;
  std::vector<float> scale;
  std::vector<int32_t> zero, group_sum, sum;
};

Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

}  // namespace

const char* linear_variant(int64_t m, int64_t k, int64_t group) {
  return isa_name(group ? w4a8_variant(m, k, group).level : w8a8_variant(m, k).level);
}

std::vector<OpVariants> linear_variants() {
  return {describe_variants("w4a8_linear", kW4A8), describe_variants("w8a8_linear", kW8A8)};
}

void w4a8_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const uint8_t* packed, int64_t n,
                 int64_t group, const float* bias, void* out, DType out_dtype) {
  if (group != 32 && group != 64 && group != 128)
    throw std::invalid_argument("w4a8: group size must be 32, 64 or 128, got " + std::to_string(group));
  if (k % group != 0)
    throw std::invalid_argument("w4a8: K=" + std::to_string(k) + " is not a multiple of the group size " +
                                std::to_string(group));
  if (m == 0 || n == 0) return;
  Workspace& ws = workspace();
  int64_t groups = k / group;
  ws.q.resize(m * k);
  ws.scale.resize(m);
  ws.zero.resize(m);
  ws.group_sum.resize(m * groups);
  const bool tiles = on_tiles(m, k, group);
  if (tiles) ws.q_tiles.resize(m / 16 * 16 * k);
  const char* xb = static_cast<const char*>(x);
  over_row_blocks(m, k, [&](int64_t r0, int64_t r1) {
    AsymRows rows{ws.q.data() + r0 * k, ws.scale.data() + r0, ws.zero.data() + r0, ws.group_sum.data() + r0 * groups};
    quantize_asym(xb + r0 * k * element_bytes(x_dtype), x_dtype, r1 - r0, k, group, rows);
    if (tiles) pack_activation_tiles(ws.q.data(), r0, r1, k, ws.q_tiles.data());
  });
  W4A8Problem p{ws.q.data(),    ws.scale.data(), ws.zero.data(), ws.group_sum.data(),
                tiles ? ws.q_tiles.data() : nullptr, packed, bias, out, out_dtype, m, n, k, group};
  run_tiles(p, w4a8_kernel(m, k, group));
}

void w8a8_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const uint8_t* packed, int64_t n,
                 const float* bias, void* out, DType out_dtype) {
  if (k % 16 != 0) throw std::invalid_argument("w8a8: K=" + std::to_string(k) + " is not a multiple of 16");
  if (m == 0 || n == 0) return;
  Workspace& ws = workspace();
  ws.q.resize(m * k);
  ws.scale.resize(m);
  ws.sum.resize(m);
  const W8A8Tiles kernel = w8a8_kernel(m, k);
  const bool tiles = on_tiles(m, k, 0);
  if (tiles) ws.q_tiles.resize(m / 16 * 16 * k);
  const char* xb = static_cast<const char*>(x);
  over_row_blocks(m, k, [&](int64_t r0, int64_t r1) {
    quantize_sym(xb + r0 * k * element_bytes(x_dtype), x_dtype, r1 - r0, k, SymRows{ws.q.data() + r0 * k, ws.scale.data() + r0});
    for (int64_t i = r0; i < r1; ++i) ws.sum[i] = row_sum(ws.q.data() + i * k, k);
    if (tiles) pack_activation_tiles(ws.q.data(), r0, r1, k, ws.q_tiles.data());
  });
  W8A8Problem p{ws.q.data(), ws.scale.data(), ws.sum.data(), tiles ? ws.q_tiles.data() : nullptr, packed, bias, out,
                out_dtype, m, n, k};
  run_tiles(p, kernel);
}

// The activations arrive quantized (q, scales and sums); what only some kernels read is derived
// here: AMX activation tiles, and W8A8 row sums when the caller left x_sum null.
void w4a8_linear_quantized(const W4A8Problem& problem) {
  if (problem.m == 0 || problem.n == 0) return;
  W4A8Problem p = problem;
  Workspace& ws = workspace();
  if (!p.q_tiles && on_tiles(p.m, p.k, p.group)) {
    ws.q_tiles.resize(p.m / 16 * 16 * p.k);
    pack_activation_tiles(p.q, 0, p.m, p.k, ws.q_tiles.data());
    p.q_tiles = ws.q_tiles.data();
  }
  run_tiles(p, w4a8_kernel(p.m, p.k, p.group));
}

void w8a8_linear_quantized(const W8A8Problem& problem) {
  if (problem.m == 0 || problem.n == 0) return;
  W8A8Problem p = problem;
  Workspace& ws = workspace();
  if (!p.x_sum) {
    ws.sum.resize(p.m);
    for (int64_t i = 0; i < p.m; ++i) ws.sum[i] = row_sum(p.q + i * p.k, p.k);
    p.x_sum = ws.sum.data();
  }
  if (!p.q_tiles && on_tiles(p.m, p.k, 0)) {
    ws.q_tiles.resize(p.m / 16 * 16 * p.k);
    pack_activation_tiles(p.q, 0, p.m, p.k, ws.q_tiles.data());
    p.q_tiles = ws.q_tiles.data();
  }
  run_tiles(p, w8a8_kernel(p.m, p.k));
}

}  // namespace shrike
