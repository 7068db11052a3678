// Per-core int8 dot-product peak of this x86 CPU, for stating kernel efficiency: the clock from
// a dependent imul chain (3 cycles each), and the throughput of 512-bit vpdpbusd (AVX-512 VNNI)
// and 256-bit VEX vpdpbusd (AVX-VNNI) on 12 independent accumulators. Best of many short
// rounds, so other processes on a shared machine mostly drop out.
//   g++ -O3 benchmarks/int8_peak.cpp -o /tmp/int8_peak && /tmp/int8_peak
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

#define SHRIKE_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double zmm_per_second(long iterations) {
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
#define INIT(i) __m512i a##i = _mm512_set1_epi32(i);
  SHRIKE_12(INIT)
#undef INIT
  auto start = Clock::now();
  for (long n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm512_dpbusd_epi32(a##i, w, x);
    SHRIKE_12(STEP)
#undef STEP
    __asm__ volatile("" : : "v"(w), "v"(x));
  }
  double seconds = since(start);
  __m512i sum = _mm512_setzero_si512();
#define ADD(i) sum = _mm512_add_epi32(sum, a##i);
  SHRIKE_12(ADD)
#undef ADD
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return iterations * 12.0 / seconds;
}

__attribute__((target("avx2,avxvnni"))) double ymm_per_second(long iterations) {
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
#define INIT(i) __m256i a##i = _mm256_set1_epi32(i);
  SHRIKE_12(INIT)
#undef INIT
  auto start = Clock::now();
  for (long n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm256_dpbusd_avx_epi32(a##i, w, x);
    SHRIKE_12(STEP)
#undef STEP
    __asm__ volatile("" : : "x"(w), "x"(x));
  }
  double seconds = since(start);
  __m256i sum = _mm256_setzero_si256();
#define ADD(i) sum = _mm256_add_epi32(sum, a##i);
  SHRIKE_12(ADD)
#undef ADD
  volatile int sink = _mm256_extract_epi32(sum, 0);
  (void)sink;
  return iterations * 12.0 / seconds;
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
  bool zmm = __builtin_cpu_supports("avx512vnni"), ymm = __builtin_cpu_supports("avxvnni");
  double hz = 0, z = 0, y = 0;
  for (int round = 0; round < 400; ++round) {
    hz = std::max(hz, cycles_per_second(250000));
    if (zmm) z = std::max(z, zmm_per_second(100000));
    if (ymm) y = std::max(y, ymm_per_second(100000));
  }
  std::printf("clock %.2f GHz\n", hz / 1e9);
  // One vpdpbusd does 4 multiply-adds per 32-bit lane; an op is a multiply or an add.
  if (zmm) std::printf("vpdpbusd zmm: %.2f per cycle, %.0f int8 Gop/s per core\n", z / hz, z * 16 * 4 * 2 / 1e9);
  if (ymm) std::printf("vpdpbusd ymm (VEX): %.2f per cycle, %.0f int8 Gop/s per core\n", y / hz, y * 8 * 4 * 2 / 1e9);
}
