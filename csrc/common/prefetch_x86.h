// Software prefetch for the decode GEMVs, which read each thread's weights as one sequential stream.
// Internal linkage on purpose: included by files built with different target flags.
#pragma once
#include <xmmintrin.h>

#include <cstdint>

namespace shrike {
namespace {

// How far ahead of its loads a stream prefetches. On Zen 5 the hardware prefetchers alone left decode at
// 36-40 GB/s of a 50 GB/s read probe; 4 KiB ahead gave the AVX-512 kernels 10-25% and the AVX2 W4A8 and
// grouped ones 5-13% (benchmarks/README.md, Zen 5 table; AVX2's W8A8 showed no gain within the noise and has
// none). One call per 64 bytes read.
constexpr int64_t kStreamPrefetchBytes = 4096;

inline void prefetch_stream(const uint8_t* at) {
  _mm_prefetch(reinterpret_cast<const char*>(at) + kStreamPrefetchBytes, _MM_HINT_T0);
}

}  // namespace
}  // namespace shrike
