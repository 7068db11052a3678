#include "runtime/read_bandwidth.h"

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "common/isa.h"
#include "runtime/threadpool.h"

namespace shrike::runtime {
namespace {

constexpr size_t kChunk = 1 << 20;
constexpr size_t kBlock = 256;  // every reader consumes 256 bytes per stream and step

using RangeReader = uint64_t (*)(const unsigned char*, size_t, int);

RangeReader reader_for(ReadWidth width) {
  switch (width) {
    case ReadWidth::scalar64: return read_range_scalar64;
#if defined(SHRIKE_X86)
    case ReadWidth::avx2: return read_range_avx2;
    case ReadWidth::avx512: return read_range_avx512;
    case ReadWidth::avx512_stream: return read_range_avx512_stream;
#else
    default: break;
#endif
  }
  throw std::invalid_argument("read width not built for this architecture");
}

bool width_runs(ReadWidth width) {
  switch (width) {
    case ReadWidth::scalar64: return true;
    case ReadWidth::avx2: return isa_available(Isa::avx2);
    case ReadWidth::avx512:
    case ReadWidth::avx512_stream: return isa_available(Isa::avx512vnni);
  }
  return false;
}

// A reader over any length: whole 256 * streams blocks by the width's reader, the tail byte by byte.
uint64_t read_any(RangeReader reader, const unsigned char* data, size_t bytes, int streams) {
  size_t step = kBlock * streams, body = bytes / step * step;
  uint64_t sum = body ? reader(data, body, streams) : 0;
  for (size_t i = body; i < bytes; ++i) sum += data[i];
  return sum;
}

}  // namespace

uint64_t read_range_scalar64(const unsigned char* data, size_t bytes, int streams) {
  size_t part = bytes / streams;
  uint64_t lanes[8] = {};
  for (size_t i = 0; i < part; i += kBlock)
    for (int s = 0; s < streams; ++s)
      for (size_t j = 0; j < kBlock; j += 64)
        for (int l = 0; l < 8; ++l) {
          uint64_t v;
          std::memcpy(&v, data + s * part + i + j + 8 * l, 8);
          lanes[l] += v;
        }
  uint64_t sum = 0;
  for (uint64_t l : lanes) sum += l;
  return sum;
}

uint64_t read_bandwidth_probe(const void* data, size_t bytes, const ReadMethod& method) {
  if (!width_runs(method.width))
    throw std::invalid_argument(std::string("read width ") + read_width_name(method.width) + " does not run here");
  if (method.threads < 1 || method.threads > num_threads())
    throw std::invalid_argument("read threads must be in [1, " + std::to_string(num_threads()) + "]");
  if (method.width == ReadWidth::avx512_stream && reinterpret_cast<uintptr_t>(data) % 64)
    throw std::invalid_argument("read width avx512_stream needs a 64-byte aligned buffer");
  RangeReader reader = reader_for(method.width);
  const auto* base = static_cast<const unsigned char*>(data);
  std::atomic<uint64_t> total{0};
  std::atomic<size_t> next_chunk{0};
  size_t n_chunks = (bytes + kChunk - 1) / kChunk;
  int streams = method.pattern == ReadPattern::streams4 ? 4 : 1;
  // One task per thread of the method; the pool runs them at once when it has that many threads.
  parallel_for(method.threads, [&](int64_t lane) {
    uint64_t sum = 0;
    if (method.pattern == ReadPattern::chunks) {
      for (size_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
        size_t begin = c * kChunk;
        sum += read_any(reader, base + begin, (bytes - begin < kChunk ? bytes - begin : kChunk), 1);
      }
    } else {
      size_t slice = (bytes / method.threads + kChunk - 1) / kChunk * kChunk;
      size_t begin = slice * lane < bytes ? slice * lane : bytes;
      size_t end = begin + slice < bytes ? begin + slice : bytes;
      sum = read_any(reader, base + begin, end - begin, streams);
    }
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return total.load();
}

std::vector<ReadWidth> read_widths_available() {
  std::vector<ReadWidth> out;
  for (ReadWidth w : {ReadWidth::scalar64, ReadWidth::avx2, ReadWidth::avx512, ReadWidth::avx512_stream})
    if (width_runs(w)) out.push_back(w);
  return out;
}

const char* read_width_name(ReadWidth width) {
  switch (width) {
    case ReadWidth::scalar64: return "scalar64";
    case ReadWidth::avx2: return "avx2";
    case ReadWidth::avx512: return "avx512";
    case ReadWidth::avx512_stream: return "avx512_stream";
  }
  return "?";
}

const char* read_pattern_name(ReadPattern pattern) {
  switch (pattern) {
    case ReadPattern::chunks: return "chunks";
    case ReadPattern::slices: return "slices";
    case ReadPattern::streams4: return "streams4";
  }
  return "?";
}

ReadWidth parse_read_width(const std::string& name) {
  for (ReadWidth w : {ReadWidth::scalar64, ReadWidth::avx2, ReadWidth::avx512, ReadWidth::avx512_stream})
    if (name == read_width_name(w)) return w;
  throw std::invalid_argument("unknown read width '" + name + "'; one of scalar64, avx2, avx512, avx512_stream");
}

ReadPattern parse_read_pattern(const std::string& name) {
  for (ReadPattern p : {ReadPattern::chunks, ReadPattern::slices, ReadPattern::streams4})
    if (name == read_pattern_name(p)) return p;
  throw std::invalid_argument("unknown read pattern '" + name + "'; one of chunks, slices, streams4");
}

}  // namespace shrike::runtime
