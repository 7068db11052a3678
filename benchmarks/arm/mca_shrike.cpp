// Static-analysis entry points for Shrike's Arm linear kernels (benchmarks/arm_kernels.py).
// Compiled to assembly only, once per Arm variant with that variant's flags from csrc/kernels.cmake
// (-O3 -fno-math-errno and the variant's -march, nothing else):
// it includes the kernel's own source file, so the tile kernels below are the shipped ones, not
// copies. Each mca_* function wraps exactly one instantiation (one row-block height), so the
// loops the script finds in it belong to that shape alone. Row indices, tile and pass arrive as run-time
// arguments, as in the library, so no address arithmetic folds away that the shipped code has to do.
#include <cstdint>

#include "linear/linear.h"

#if defined(SHRIKE_MCA_DOTPROD)
#include "dense/dense_dotprod.cpp"
#include "linear/w4a8_dotprod.cpp"
#include "linear/w8a8_dotprod.cpp"
using namespace shrike::dotprod;
#define ROWS(MR, P) rows_x_tile<MR>(P, i0, t)
#elif defined(SHRIKE_MCA_I8MM)
#include "linear/w4a8_i8mm.cpp"
#include "linear/w8a8_i8mm.cpp"
using namespace shrike::i8mm;
#define PAIRS(NP, P) pairs_x_tile<NP>(P, row_a, row_b, t)
#elif defined(SHRIKE_MCA_SVE2)
#include "linear/w4a8_sve2.cpp"
#include "linear/w8a8_sve2.cpp"
using namespace shrike::sve2;
#define ROWS(MR, P) rows_x_pass<MR>(P, i0, t, h, per_pass)
#define PAIRS(NP, P) pairs_x_pass<NP>(P, row_a, row_b, t, h, per_pass)
#else
#error "define SHRIKE_MCA_DOTPROD, SHRIKE_MCA_I8MM or SHRIKE_MCA_SVE2"
#endif

using shrike::W4A8Problem;
using shrike::W8A8Problem;

extern "C" {
#if defined(SHRIKE_MCA_DOTPROD)
__attribute__((flatten)) void mca_w4a8_rows1(const W4A8Problem& p, int64_t i0, int64_t t) { ROWS(1, p); }
__attribute__((flatten)) void mca_w4a8_rows4(const W4A8Problem& p, int64_t i0, int64_t t) { ROWS(4, p); }
__attribute__((flatten)) void mca_w8a8_rows1(const W8A8Problem& p, int64_t i0, int64_t t) { ROWS(1, p); }
__attribute__((flatten)) void mca_w8a8_rows4(const W8A8Problem& p, int64_t i0, int64_t t) { ROWS(4, p); }
// bf16 x bf16 dense block of 1 row x 2 columns: what the bf16 lm_head runs at decode (walk_2x2).
__attribute__((flatten)) void mca_dense_bf16_r1c2(const shrike::DenseProblem& p, int64_t r0, int64_t c0) {
  block<1, 2, shrike::bf16, shrike::bf16>(p, r0, c0);
}
#elif defined(SHRIKE_MCA_I8MM)
__attribute__((flatten)) void mca_w4a8_pairs1(const W4A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) { PAIRS(1, p); }
__attribute__((flatten)) void mca_w4a8_pairs2(const W4A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) { PAIRS(2, p); }
__attribute__((flatten)) void mca_w8a8_pairs1(const W8A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) { PAIRS(1, p); }
__attribute__((flatten)) void mca_w8a8_pairs2(const W8A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t) { PAIRS(2, p); }
#else
__attribute__((flatten)) void mca_w4a8_rows1(const W4A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) { ROWS(1, p); }
__attribute__((flatten)) void mca_w4a8_rows4(const W4A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) { ROWS(4, p); }
__attribute__((flatten)) void mca_w4a8_pairs2(const W4A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t, int64_t h,
                     int64_t per_pass) { PAIRS(2, p); }
__attribute__((flatten)) void mca_w8a8_rows1(const W8A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) { ROWS(1, p); }
__attribute__((flatten)) void mca_w8a8_rows4(const W8A8Problem& p, int64_t i0, int64_t t, int64_t h, int64_t per_pass) { ROWS(4, p); }
__attribute__((flatten)) void mca_w8a8_pairs2(const W8A8Problem& p, const int64_t* row_a, const int64_t* row_b, int64_t t, int64_t h,
                     int64_t per_pass) { PAIRS(2, p); }
#endif
}
