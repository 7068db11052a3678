// A STREAM-like read of a buffer on the kernel thread pool, so benchmarks can put the GEMV's
// weight-read bandwidth next to what plain sequential reads reach with the same threads.
#pragma once
#include <cstddef>
#include <cstdint>

namespace shrike::runtime {

// Sums the buffer as 64-bit words (the result only keeps the reads from being optimised away).
uint64_t read_bandwidth_probe(const void* data, size_t bytes);

}  // namespace shrike::runtime
