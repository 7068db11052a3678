// Dispatch: pick the variant and its reduction order, then spread (row block, output block) tasks
// over the thread pool. A task computes whole dot products, so the split never changes a result
// (dense_kernels.h).
#include "dense/dense.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common/variants.h"
#include "dense/dense_kernels.h"
#include "dense/dense_tiles.h"
#include "runtime/threadpool.h"

namespace shrike {
namespace {

using DenseBlock = void (*)(const DenseProblem&, int64_t, int64_t, int64_t, int64_t);

// A variant is a block kernel and the reduction order it follows (dense_kernels.h).
struct DenseKernel {
  DenseBlock block;
  bool tile_order;
};
struct DenseCall {
  DType x_dtype, w_dtype;
  DenseLayout layout;
};

bool bf16_pair(const DenseCall& c) { return c.x_dtype == DType::bf16 && c.w_dtype == DType::bf16; }
bool tiles_weight(const DenseCall& c) { return c.layout == DenseLayout::tiles; }

const Variant<DenseKernel, DenseCall> kDense[] = {
#if defined(SHRIKE_X86)
    {Isa::amx, {amx::dense_tile_block, true}, bf16_pair, "bf16 x bf16 (tile order)"},
#endif
    // Below the amx level a tiles weight runs on the reference of the tile order, which reads x as it is.
    {Isa::scalar, {ref::dense_tile_block, true}, tiles_weight, "weight packed as tiles (tile order)"},
#if defined(SHRIKE_X86)
    {Isa::avx512bf16, {avx512bf16::dense_block, false}},
    {Isa::avx2, {avx2::dense_block, false}},
#elif defined(SHRIKE_AARCH64)
    {Isa::dotprod, {dotprod::dense_block, false}},
#endif
    {Isa::scalar, {ref::dense_block, false}},
};

const Variant<DenseKernel, DenseCall>& dense_kernel(DType x_dtype, DType w_dtype, DenseLayout layout) {
  return pick_variant(kDense, DenseCall{x_dtype, w_dtype, layout});
}

constexpr int64_t kSerialWork = 1 << 18;  // multiply-adds below which threads cost more than they save
// Rows per task: a task's activations (64 x K) stay in L2 while its weight rows are reused.
constexpr int64_t kRowsPerTask = 64;

// Decode wants many small output blocks so a slow core cannot stall the call; the block stays a
// multiple of 8 so the variants' register blocks are full.
int64_t outputs_per_task(int64_t n, int64_t row_tasks) {
  int64_t threads = runtime::num_threads();
  int64_t want_tasks = threads * 8;
  int64_t per = (n * row_tasks + want_tasks - 1) / want_tasks;
  per = std::clamp<int64_t>(per, 8, 64);
  return (per + 7) / 8 * 8;
}

void run_lanes(const DenseProblem& p, DenseBlock kernel) {
  if (p.m * p.n * p.k < kSerialWork) return kernel(p, 0, p.m, 0, p.n);
  int64_t row_tasks = (p.m + kRowsPerTask - 1) / kRowsPerTask;
  int64_t per = outputs_per_task(p.n, row_tasks);
  int64_t col_tasks = (p.n + per - 1) / per;
  runtime::parallel_for(row_tasks * col_tasks, [&](int64_t t) {
    int64_t rt = t % row_tasks, ct = t / row_tasks;
    kernel(p, rt * kRowsPerTask, std::min(p.m, (rt + 1) * kRowsPerTask), ct * per, std::min(p.n, (ct + 1) * per));
  });
}

// x (m, k) bf16 as the activation tiles of DenseProblem::x_tiles, row blocks [b0, b1).
void pack_activation_tiles(const bf16* x, int64_t m, int64_t k, int64_t b0, int64_t b1, bf16* tiles) {
  const int64_t rows = std::min<int64_t>(m, 16), k_tiles = dense_tiles_k(k) / kDenseTileK;
  for (int64_t b = b0; b < b1; ++b) {
    bf16* block = tiles + b * k_tiles * rows * kDenseTileK;
    std::memset(block, 0, static_cast<size_t>(k_tiles * rows * kDenseTileK) * sizeof(bf16));
    for (int64_t i = 0; i < rows && b * rows + i < m; ++i)
      for (int64_t t = 0; t < k_tiles; ++t)
        std::memcpy(block + (t * rows + i) * kDenseTileK, x + (b * rows + i) * k + t * kDenseTileK,
                    static_cast<size_t>(std::min(kDenseTileK, k - t * kDenseTileK)) * sizeof(bf16));
  }
}

// Rows per task of the amx kernel: a multiple of 32 (two activation tiles) whose activations
// (about 512 KiB) stay in L2 while the task's weight panels stream past them.
int64_t tile_rows_per_task(int64_t m, int64_t k) {
  if (m <= 16) return m;
  const int64_t fit = (int64_t{1} << 18) / std::max<int64_t>(dense_tiles_k(k), 1) / 32 * 32;
  return std::clamp<int64_t>(fit, 32, 256);
}

// Panels per task: an even count (whole two-panel blocks), small enough for about 8 tasks per
// thread so that both cores stay busy at M = 1, at most 64 (1024 outputs).
int64_t tile_panels_per_task(int64_t panels, int64_t row_tasks) {
  const int64_t want_tasks = runtime::num_threads() * 8;
  const int64_t per = std::clamp<int64_t>((panels * row_tasks + want_tasks - 1) / want_tasks, 2, 64);
  return (per + 1) / 2 * 2;
}

void run_tiles(DenseProblem p, DenseBlock kernel) {
  if (kernel != ref::dense_tile_block) {
    static thread_local std::vector<bf16> workspace;  // the caller's; workers get `tiles`
    const int64_t rows = std::min<int64_t>(p.m, 16), row_blocks = (p.m + rows - 1) / rows;
    workspace.resize(static_cast<size_t>(row_blocks * rows * dense_tiles_k(p.k)));
    bf16* tiles = workspace.data();
    const bf16* x = static_cast<const bf16*>(p.x);
    if (p.m * p.k < kSerialWork)
      pack_activation_tiles(x, p.m, p.k, 0, row_blocks, tiles);
    else
      runtime::parallel_for(row_blocks, [&](int64_t b) { pack_activation_tiles(x, p.m, p.k, b, b + 1, tiles); });
    p.x_tiles = tiles;
  }
  if (p.m * p.n * p.k < kSerialWork) return kernel(p, 0, p.m, 0, p.n);
  const int64_t row_step = tile_rows_per_task(p.m, p.k), row_tasks = (p.m + row_step - 1) / row_step;
  const int64_t col_step = tile_panels_per_task(dense_panels(p.n), row_tasks) * kDensePanelCols;
  const int64_t col_tasks = (p.n + col_step - 1) / col_step;
  runtime::parallel_for(row_tasks * col_tasks, [&](int64_t t) {
    const int64_t rt = t % row_tasks, ct = t / row_tasks;
    kernel(p, rt * row_step, std::min(p.m, (rt + 1) * row_step), ct * col_step, std::min(p.n, (ct + 1) * col_step));
  });
}

}  // namespace

void dense_linear(const void* x, DType x_dtype, int64_t m, int64_t k, const void* w, DType w_dtype, int64_t n,
                  const float* bias, void* out, DType out_dtype, DenseLayout w_layout) {
  if (m < 0 || n < 0 || k < 0) throw std::invalid_argument("dense_linear: negative dimension");
  if (w_layout == DenseLayout::tiles && (x_dtype != DType::bf16 || w_dtype != DType::bf16))
    throw std::invalid_argument("dense_linear: a weight packed as tiles is bfloat16 and takes bfloat16 activations");
  if (m == 0 || n == 0) return;
  DenseProblem p{x, x_dtype, w, w_dtype, w_layout, bias, out, out_dtype, m, n, k, nullptr};
  const DenseKernel& kernel = dense_kernel(x_dtype, w_dtype, w_layout).fn;
  if (kernel.tile_order) return run_tiles(p, kernel.block);
  run_lanes(p, kernel.block);
}

const char* dense_variant(DType x_dtype, DType w_dtype) {
  return isa_name(dense_kernel(x_dtype, w_dtype, DenseLayout::rows).level);
}

OpVariants dense_variants() { return describe_variants("dense_linear", kDense); }

}  // namespace shrike
