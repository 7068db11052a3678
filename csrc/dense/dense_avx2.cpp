// AVX2 + FMA: bf16 weights widened to fp32 (exact) and multiplied with FMA, fp32 weights as they
// are. A block's 16 lanes (dense_kernels.h) live in two registers: lo = pairs of K 0..15, hi = 16..31.
#include <immintrin.h>

#include <cstring>

#include "common/pairs_avx2.h"
#include "dense/dense_kernels.h"

namespace shrike::avx2 {

namespace {

// RB rows x CB outputs; each output owns two accumulators (lo, hi) over the whole of K.
template <int RB, int CB, typename XT, typename WT>
void block(const DenseProblem& p, int64_t r0, int64_t c0) {
  const XT* x = static_cast<const XT*>(p.x) + r0 * p.k;
  const WT* w = static_cast<const WT*>(p.w) + c0 * p.k;
  __m256 lo[RB][CB], hi[RB][CB];
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  auto step = [&](auto x_at, auto w_at) {
    SHRIKE_UNROLL for (int half = 0; half < 2; ++half) {
      Pairs xp[RB];
      SHRIKE_UNROLL for (int r = 0; r < RB; ++r) xp[r] = load_pairs(x_at(r) + 16 * half);
      SHRIKE_UNROLL for (int c = 0; c < CB; ++c) {
        Pairs wp = load_pairs(w_at(c) + 16 * half);
        SHRIKE_UNROLL for (int r = 0; r < RB; ++r) {
          __m256& acc = half ? hi[r][c] : lo[r][c];
          acc = _mm256_fmadd_ps(xp[r].odd, wp.odd, acc);
          acc = _mm256_fmadd_ps(xp[r].even, wp.even, acc);
        }
      }
    }
  };
  int64_t full = p.k / kDenseBlockK * kDenseBlockK;
  for (int64_t b = 0; b < full; b += kDenseBlockK)
    step([&](int r) { return x + r * p.k + b; }, [&](int c) { return w + c * p.k + b; });
  if (full < p.k) {
    int64_t rest = p.k - full;
    // The last, partial block copied into zero-padded rows.
    XT xt[RB][kDenseBlockK] = {};
    WT wt[CB][kDenseBlockK] = {};
    SHRIKE_UNROLL for (int r = 0; r < RB; ++r) std::memcpy(xt[r], x + r * p.k + full, rest * sizeof(XT));
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) std::memcpy(wt[c], w + c * p.k + full, rest * sizeof(WT));
    step([&](int r) { return static_cast<const XT*>(xt[r]); }, [&](int c) { return static_cast<const WT*>(wt[c]); });
  }
  SHRIKE_UNROLL for (int r = 0; r < RB; ++r)
    SHRIKE_UNROLL for (int c = 0; c < CB; ++c) dense_store(p, r0 + r, c0 + c, reduce8(_mm256_add_ps(lo[r][c], hi[r][c])));
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

}  // namespace shrike::avx2
