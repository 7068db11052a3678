// Dispatch: quantize the activations, then spread output tiles over the thread pool.
#include "linear/linear.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/isa.h"
#include "linear/layout.h"
#include "quant/act_quant.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using W4A8Tiles = void (*)(const W4A8Problem&, int64_t, int64_t);
using W8A8Tiles = void (*)(const W8A8Problem&, int64_t, int64_t);

// smmla computes two rows at once; a single decode row is better served by sdot.
template <typename Fn>
Fn pick(Fn ref_fn, Fn avx2_fn, Fn dotprod_fn, Fn i8mm_fn, Fn sve2_fn, int64_t m) {
  switch (active_isa()) {
    case Isa::avx2:
    case Isa::avxvnni:
    case Isa::avx512vnni:
    case Isa::avx512bf16: return avx2_fn;
    case Isa::dotprod: return dotprod_fn;
    case Isa::i8mm: return m < 2 ? dotprod_fn : i8mm_fn;
    case Isa::sve2: return sve2_fn;
    default: return ref_fn;
  }
}

W4A8Tiles w4a8_kernel(int64_t m) {
#if defined(SHRIKE_X86)
  return pick<W4A8Tiles>(ref::w4a8_tiles, avx2::w4a8_tiles, nullptr, nullptr, nullptr, m);
#elif defined(SHRIKE_AARCH64)
  return pick<W4A8Tiles>(ref::w4a8_tiles, nullptr, dotprod::w4a8_tiles, i8mm::w4a8_tiles, sve2::w4a8_tiles, m);
#else
  return ref::w4a8_tiles;
#endif
}

W8A8Tiles w8a8_kernel(int64_t m) {
#if defined(SHRIKE_X86)
  return pick<W8A8Tiles>(ref::w8a8_tiles, avx2::w8a8_tiles, nullptr, nullptr, nullptr, m);
#elif defined(SHRIKE_AARCH64)
  return pick<W8A8Tiles>(ref::w8a8_tiles, nullptr, dotprod::w8a8_tiles, i8mm::w8a8_tiles, sve2::w8a8_tiles, m);
#else
  return ref::w8a8_tiles;
#endif
}

// Decode (few rows) wants many small chunks so slow cores cannot stall the call; prefill
// wants chunks small enough that a chunk of tiles stays in L2 while every row block reuses it.
int64_t tiles_per_task(int64_t tiles, int64_t m) {
  int64_t threads = runtime::num_threads();
  int64_t cap = m <= 4 ? 16 : 4;
  return std::max<int64_t>(1, std::min(cap, tiles / (threads * 8)));
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

size_t element_bytes(DType dt) { return dt == DType::f32 ? 4 : 2; }

struct Workspace {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> zero, group_sum;
};

Workspace& workspace() {
  static thread_local Workspace ws;
  return ws;
}

}  // namespace

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
  const char* xb = static_cast<const char*>(x);
  over_row_blocks(m, k, [&](int64_t r0, int64_t r1) {
    AsymRows rows{ws.q.data() + r0 * k, ws.scale.data() + r0, ws.zero.data() + r0, ws.group_sum.data() + r0 * groups};
    quantize_asym(xb + r0 * k * element_bytes(x_dtype), x_dtype, r1 - r0, k, group, rows);
  });
  w4a8_linear_quantized({ws.q.data(), ws.scale.data(), ws.zero.data(), ws.group_sum.data(), packed, bias, out,
                         out_dtype, m, n, k, group});
}

void w4a8_linear_quantized(const W4A8Problem& p) {
  if (p.m == 0 || p.n == 0) return;
  run_tiles(p, w4a8_kernel(p.m));
}

void w8a8_linear_quantized(const W8A8Problem& p) {
  if (p.m == 0 || p.n == 0) return;
  run_tiles(p, w8a8_kernel(p.m));
}

void w8a8_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const uint8_t* packed, int64_t n,
                 const float* bias, void* out, DType out_dtype) {
  if (k % 16 != 0) throw std::invalid_argument("w8a8: K=" + std::to_string(k) + " is not a multiple of 16");
  if (m == 0 || n == 0) return;
  Workspace& ws = workspace();
  ws.q.resize(m * k);
  ws.scale.resize(m);
  const char* xb = static_cast<const char*>(x);
  over_row_blocks(m, k, [&](int64_t r0, int64_t r1) {
    quantize_sym(xb + r0 * k * element_bytes(x_dtype), x_dtype, r1 - r0, k, SymRows{ws.q.data() + r0 * k, ws.scale.data() + r0});
  });
  w8a8_linear_quantized({ws.q.data(), ws.scale.data(), packed, bias, out, out_dtype, m, n, k});
}

}  // namespace shrike
