// aarch64 NEON: bf16 widened to fp32 (exact) and multiplied with FMA. A block's 16 accumulator
// lanes (dense_kernels.h) live in four registers, lane j in register j / 4.
#include <arm_neon.h>

#include <cstring>

#include "common/pairs_neon.h"
#include "dense/dense_kernels.h"

namespace shrike::dotprod {

namespace {

using neon::Pairs;
using neon::load_pairs;
using neon::reduce16;

template <int RB, int CB, typename XT, typename WT>
void block(const DenseProblem& p, int64_t r0, int64_t c0) {
  const XT* x = static_cast<const XT*>(p.x) + r0 * p.k;
  const WT* w = static_cast<const WT*>(p.w) + c0 * p.k;
  float32x4_t acc[RB][CB][4];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c)
      SHRIKE_UNROLL for (int q = 0; q < 4; ++q) acc[r][c][q] = vdupq_n_f32(0.f);
  auto step = [&](auto x_at, auto w_at) {
    SHRIKE_UNROLL for (int q = 0; q < 4; ++q) {
      Pairs xp[RB];
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_pairs(x_at(r), q);
      SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
        Pairs wp = load_pairs(w_at(c), q);
        SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
          acc[r][c][q] = vfmaq_f32(acc[r][c][q], xp[r].odd, wp.odd);
          acc[r][c][q] = vfmaq_f32(acc[r][c][q], xp[r].even, wp.even);
        }
      }
    }
  };
  int64_t full = p.k / kDenseBlockK * kDenseBlockK;
  for (int64_t b = 0; b < full; b += kDenseBlockK)
    step([&](int r) { return x + r * p.k + b; }, [&](int c) { return w + c * p.k + b; });
  if (full < p.k) {
    // The last, partial block copied into zero-padded rows.
    int64_t rest = p.k - full;
    XT xt[RB][kDenseBlockK] = {};
    WT wt[CB][kDenseBlockK] = {};
    SHRIKE_UNROLL for (int r = 0; r < RB; ++r) std::memcpy(xt[r], x + r * p.k + full, rest * sizeof(XT));
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) std::memcpy(wt[c], w + c * p.k + full, rest * sizeof(WT));
    step([&](int r) { return static_cast<const XT*>(xt[r]); }, [&](int c) { return static_cast<const WT*>(wt[c]); });
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) dense_store(p, r0 + r, c0 + c, reduce16(acc[r][c]));
}

}  // namespace

void dense_block(const DenseProblem& p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  with_dtypes(p, [&](auto x, auto w) {
    using XT = decltype(x);
    using WT = decltype(w);
    walk_2x2(r0, r1, c0, c1, [&](auto rows, auto cols, int64_t r, int64_t c) {
      block<decltype(rows)::value, decltype(cols)::value, XT, WT>(p, r, c);
    });
  });
}

}  // namespace shrike::dotprod
