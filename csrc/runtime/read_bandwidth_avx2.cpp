#include <immintrin.h>

#include "runtime/read_bandwidth.h"

namespace shrike::runtime {

uint64_t read_range_avx2(const unsigned char* data, size_t bytes, int streams) {
  size_t part = bytes / streams;
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (size_t i = 0; i < part; i += 256)
    for (int s = 0; s < streams; ++s) {
      const auto* p = reinterpret_cast<const __m256i*>(data + s * part + i);
      for (int j = 0; j < 8; ++j) acc[j & 3] = _mm256_add_epi64(acc[j & 3], _mm256_loadu_si256(p + j));
    }
  __m256i all = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), all);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace shrike::runtime
