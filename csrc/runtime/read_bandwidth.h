// What the CPU can read from memory: a read of a large buffer by several methods (load width, access
// pattern, thread count), so decode benchmarks can put a step's weight-read bandwidth next to the best
// of them. A single method under-reads on some CPUs (scalar loads, or one stream per core, stop short of
// what the memory system delivers), so benchmarks sweep the methods and report the best.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace shrike::runtime {

enum class ReadWidth { scalar64, avx2, avx512, avx512_stream };  // avx512_stream: vmovntdqa loads
enum class ReadPattern {
  chunks,   // 1 MiB chunks handed out from a shared counter, as the GEMV kernels split their work
  slices,   // one contiguous slice per thread
  streams4  // one slice per thread, read as 4 interleaved sequential streams (more prefetch streams in flight)
};

struct ReadMethod {
  ReadWidth width = ReadWidth::scalar64;
  ReadPattern pattern = ReadPattern::chunks;
  int threads = 1;  // at most the pool's thread count
};

// Reads the whole buffer by `method` and returns a checksum (it only keeps the reads from being optimised
// away). Throws std::invalid_argument for a width this build or CPU cannot run or a thread count outside
// [1, pool threads].
uint64_t read_bandwidth_probe(const void* data, size_t bytes, const ReadMethod& method);

// The load widths this build and CPU can run, narrowest first.
std::vector<ReadWidth> read_widths_available();
const char* read_width_name(ReadWidth width);
const char* read_pattern_name(ReadPattern pattern);
ReadWidth parse_read_width(const std::string& name);
ReadPattern parse_read_pattern(const std::string& name);

// One thread's read of [data, data + bytes) as `streams` interleaved sequential streams, per width
// (read_bandwidth_<isa>.cpp). bytes is a multiple of 256 * streams.
uint64_t read_range_scalar64(const unsigned char* data, size_t bytes, int streams);
uint64_t read_range_avx2(const unsigned char* data, size_t bytes, int streams);
uint64_t read_range_avx512(const unsigned char* data, size_t bytes, int streams);
uint64_t read_range_avx512_stream(const unsigned char* data, size_t bytes, int streams);

}  // namespace shrike::runtime
