#include "runtime/read_bandwidth.h"

#include <atomic>
#include <cstring>

#include "runtime/threadpool.h"

namespace shrike::runtime {

uint64_t read_bandwidth_probe(const void* data, size_t bytes) {
  constexpr size_t kChunk = 1 << 20;  // many chunks, like the GEMV's tile chunks
  const auto* base = static_cast<const unsigned char*>(data);
  std::atomic<uint64_t> total{0};
  parallel_for(static_cast<int64_t>((bytes + kChunk - 1) / kChunk), [&](int64_t c) {
    size_t begin = c * kChunk, end = begin + kChunk < bytes ? begin + kChunk : bytes;
    uint64_t lanes[8] = {};
    size_t i = begin;
    for (; i + 64 <= end; i += 64)
      for (int l = 0; l < 8; ++l) {
        uint64_t v;
        std::memcpy(&v, base + i + 8 * l, 8);
        lanes[l] += v;
      }
    uint64_t sum = 0;
    for (uint64_t l : lanes) sum += l;
    for (; i < end; ++i) sum += base[i];
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return total.load();
}

}  // namespace shrike::runtime
