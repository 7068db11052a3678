#include <immintrin.h>

#include "runtime/read_bandwidth.h"

namespace shrike::runtime {
namespace {

// Non-temporal loads (vmovntdqa) need 64-byte aligned addresses; on ordinary write-back memory they
// behave like plain loads on most cores, but some memory systems stream them with less cache pollution.
template <bool NonTemporal>
uint64_t read_range(const unsigned char* data, size_t bytes, int streams) {
  size_t part = bytes / streams;
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  for (size_t i = 0; i < part; i += 256)
    for (int s = 0; s < streams; ++s) {
      const unsigned char* p = data + s * part + i;
      for (int j = 0; j < 4; ++j) {
        __m512i v = NonTemporal ? _mm512_stream_load_si512(const_cast<unsigned char*>(p + 64 * j))
                                : _mm512_loadu_si512(p + 64 * j);
        acc[j] = _mm512_add_epi64(acc[j], v);
      }
    }
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3])));
}

}  // namespace

uint64_t read_range_avx512(const unsigned char* data, size_t bytes, int streams) {
  return read_range<false>(data, bytes, streams);
}

uint64_t read_range_avx512_stream(const unsigned char* data, size_t bytes, int streams) {
  return read_range<true>(data, bytes, streams);
}

}  // namespace shrike::runtime
