// Per-core int8 (and bf16, fp32) multiply-add peak of this x86 CPU, for stating kernel efficiency:
// the clock from a dependent imul chain (3 cycles each), the throughput of 256-bit vpmaddubsw (the
// AVX2 int8 product: 16 pair sums of two u8 x s8 products each) and fp32 FMA (the AVX2 attention
// walk), of 512-bit vpdpbusd (AVX-512 VNNI) and 256-bit VEX vpdpbusd (AVX-VNNI), all on 12
// independent accumulators, and on AMX CPUs of
// tdpbssd (int8) and tdpbf16ps (bf16) on 4 independent accumulator tiles. Best of many short
// rounds, so other processes on a shared machine mostly drop out.
//   g++ -O3 benchmarks/int8_peak.cpp -o /tmp/int8_peak && /tmp/int8_peak
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Defines NAME(iterations): instructions per second of UPDATE(acc, w, x) on 12 independent accumulators
// of type T (started as SET1(i)), with operands w and x the compiler cannot see through; the
// accumulators are summed (ADD) and kept (SINK) so that nothing is optimised away.
#define SHRIKE_THROUGHPUT(NAME, TARGET, T, W, X, SET1, UPDATE, ADD, SINK)    \
  __attribute__((target(TARGET))) double NAME(long iterations) {            \
    auto w = W;                                                             \
    auto x = X;                                                             \
    T a[12];                                                                \
    for (int i = 0; i < 12; ++i) a[i] = SET1(i);                            \
    auto start = Clock::now();                                              \
    for (long n = 0; n < iterations; ++n) {                                 \
      _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) a[i] = UPDATE(a[i], w, x); \
      __asm__ volatile("" : : "v"(w), "v"(x));                              \
    }                                                                       \
    double seconds = since(start);                                          \
    T sum = a[0];                                                           \
    for (int i = 1; i < 12; ++i) sum = ADD(sum, a[i]);                      \
    volatile auto sink = SINK(sum);                                         \
    (void)sink;                                                             \
    return iterations * 12.0 / seconds;                                     \
  }

SHRIKE_THROUGHPUT(zmm_per_second, "avx512f,avx512bw,avx512vnni", __m512i, _mm512_set1_epi8(3), _mm512_set1_epi8(5),
                  _mm512_set1_epi32, _mm512_dpbusd_epi32, _mm512_add_epi32, _mm512_reduce_add_epi32)
SHRIKE_THROUGHPUT(ymm_per_second, "avx2,avxvnni", __m256i, _mm256_set1_epi8(3), _mm256_set1_epi8(5), _mm256_set1_epi32,
                  _mm256_dpbusd_avx_epi32, _mm256_add_epi32, _mm256_movemask_epi8)
SHRIKE_THROUGHPUT(fma_per_second, "avx2,fma", __m256, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-3f),
                  _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)

// vpmaddubsw writes its pair sums instead of accumulating, so eight of them on fixed operands into
// eight registers are independent (in asm: the compiler would fold them into one).
__attribute__((target("avx2"))) double maddubs_per_second(long iterations) {
  auto start = Clock::now();
  for (long n = 0; n < iterations; ++n)
    __asm__ volatile(
        "vpmaddubsw %%ymm0, %%ymm1, %%ymm2\n\tvpmaddubsw %%ymm0, %%ymm1, %%ymm3\n\t"
        "vpmaddubsw %%ymm0, %%ymm1, %%ymm4\n\tvpmaddubsw %%ymm0, %%ymm1, %%ymm5\n\t"
        "vpmaddubsw %%ymm0, %%ymm1, %%ymm6\n\tvpmaddubsw %%ymm0, %%ymm1, %%ymm7\n\t"
        "vpmaddubsw %%ymm0, %%ymm1, %%ymm8\n\tvpmaddubsw %%ymm0, %%ymm1, %%ymm9"
        ::: "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9");
  return iterations * 8.0 / since(start);
}

struct alignas(64) TileConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Linux grants the tile data state on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
bool amx_granted() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; }

// Tile instructions per second: 4 accumulators (tmm0-3), each updated from tmm4/5 x tmm6/7.
template <bool BF16>
__attribute__((target("amx-tile,amx-int8,amx-bf16"))) double tiles_per_second(long iterations) {
  TileConfig config{};
  config.palette_id = 1;
  for (int i = 0; i < 8; ++i) config.rows[i] = 16, config.colsb[i] = 64;
  _tile_loadconfig(&config);
  alignas(64) static int8_t operand[16 * 64];
  std::memset(operand, 1, sizeof operand);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, operand, 64); _tile_loadd(5, operand, 64); _tile_loadd(6, operand, 64); _tile_loadd(7, operand, 64);
  auto start = Clock::now();
  for (long n = 0; n < iterations; ++n) {
    if constexpr (BF16) {
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    } else {
      _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    }
  }
  alignas(64) static int32_t sink[16 * 16];
  _tile_stored(0, sink, 64); _tile_stored(1, sink, 64); _tile_stored(2, sink, 64); _tile_stored(3, sink, 64);
  double seconds = since(start);
  _tile_release();
  return iterations * 4.0 / seconds;
}

double cycles_per_second(long iterations) {
  uint64_t v = 3;
  auto start = Clock::now();
  for (long n = 0; n < iterations; ++n)
    __asm__ volatile("imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0" : "+r"(v));
  return iterations * 12.0 / since(start);
}
}  // namespace

int main() {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool zmm = __builtin_cpu_supports("avx512vnni"), ymm = __builtin_cpu_supports("avxvnni");
  bool amx = __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-bf16") && amx_granted();
  double hz = 0, mb = 0, f = 0, z = 0, y = 0, ti = 0, tb = 0;
  for (int round = 0; round < 400; ++round) {
    hz = std::max(hz, cycles_per_second(250000));
    if (avx2) mb = std::max(mb, maddubs_per_second(100000)), f = std::max(f, fma_per_second(100000));
    if (zmm) z = std::max(z, zmm_per_second(100000));
    if (ymm) y = std::max(y, ymm_per_second(100000));
    if (amx && round % 4 == 0) ti = std::max(ti, tiles_per_second<false>(20000)), tb = std::max(tb, tiles_per_second<true>(20000));
  }
  std::printf("clock %.2f GHz\n", hz / 1e9);
  // One vpmaddubsw does 32 int8 multiplies and 16 adds (its pair sums; summing those on is extra work).
  if (avx2) std::printf("vpmaddubsw ymm: %.2f per cycle, %.0f int8 Gop/s per core (32 multiply-adds each)\n", mb / hz,
                        mb * 32 * 2 / 1e9);
  if (avx2) std::printf("vfmadd ymm fp32: %.2f per cycle, %.0f Gflop/s per core\n", f / hz, f * 8 * 2 / 1e9);
  // One vpdpbusd does 4 multiply-adds per 32-bit lane; an op is a multiply or an add.
  if (zmm) std::printf("vpdpbusd zmm: %.2f per cycle, %.0f int8 Gop/s per core\n", z / hz, z * 16 * 4 * 2 / 1e9);
  if (ymm) std::printf("vpdpbusd ymm (VEX): %.2f per cycle, %.0f int8 Gop/s per core\n", y / hz, y * 8 * 4 * 2 / 1e9);
  // tdpbssd: 16 x 16 outputs x 64 K; tdpbf16ps: 16 x 16 x 32.
  if (amx) std::printf("tdpbssd: %.1f cycles each, %.0f int8 Gop/s per core\n", hz / ti, ti * 16 * 16 * 64 * 2 / 1e9);
  if (amx) std::printf("tdpbf16ps: %.1f cycles each, %.0f bf16 Gflop/s per core\n", hz / tb, tb * 16 * 16 * 32 * 2 / 1e9);
}
