// One decode step's linear layers of an N-layer MiniCPM5-2B-shaped model (hidden 2048, intermediate 6144,
// 16 query heads and 2 KV heads of 128: q 2048x2048, k and v 256x2048, o 2048x2048, gate and up
// 6144x2048, down 2048x6144), batch 1, one thread, through Shrike's kernels or llama.cpp's (ggml's CPU
// backend with its weight repacking). Run under qemu-user by benchmarks/arm_kernels.py, which counts the
// guest instructions executed between count_begin() and count_end().
//
//   decode_count shrike int4|int8 LAYERS      (variant: SHRIKE_ISA=dotprod|i8mm|sve2)
//   decode_count llama  int4|int8 LAYERS      (Q4_0 / Q8_0 weights; ggml picks its repacked layout)
//
// Weights are random values in each engine's storage format (Shrike: the packed tiles of
// csrc/linear/layout.h with valid float scales; ggml: Q4_0 / Q8_0 blocks with a valid fp16 scale, repacked by
// ggml at load). No kernel branches on weight values, so the instruction counts do not depend on them.
// Prints the weight bytes each engine reads per step.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "linear/layout.h"
#include "linear/linear.h"
#include "runtime/threadpool.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

extern "C" {
__attribute__((noinline)) void count_begin() { asm volatile("" ::: "memory"); }
__attribute__((noinline)) void count_end() { asm volatile("" ::: "memory"); }
}

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};
const Shape kLayer[] = {{"q", 2048, 2048}, {"k", 256, 2048},  {"v", 256, 2048},   {"o", 2048, 2048},
                        {"gate", 6144, 2048}, {"up", 6144, 2048}, {"down", 2048, 6144}};
constexpr int64_t kGroup = 128;

uint64_t g_state = 0x9e3779b97f4a7c15ull;
inline uint64_t next() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}
void fill(void* p, size_t bytes) {
  auto* b = static_cast<uint8_t*>(p);
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64)  // 64 bytes per iteration: fewer translation blocks for qemu to log in setup
    for (int j = 0; j < 8; ++j) {
      uint64_t v = next();
      std::memcpy(b + i + 8 * j, &v, 8);
    }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v = next();
    std::memcpy(b + i, &v, 8);
  }
  for (; i < bytes; ++i) b[i] = static_cast<uint8_t>(next());
}
float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f; }

int run_shrike(bool int4, int layers) {
  shrike::runtime::set_threads(1, {});
  struct Linear {
    std::vector<uint8_t> packed;
    int64_t n, k;
  };
  std::vector<Linear> lin;
  double weight_bytes = 0;
  for (int l = 0; l < layers; ++l)
    for (const Shape& s : kLayer) {
      Linear L{{}, s.n, s.k};
      int64_t tiles = shrike::tile_count(s.n);
      if (int4) {
        L.packed.resize(shrike::w4a8_packed_bytes(s.n, s.k, kGroup));
        fill(L.packed.data(), L.packed.size());
        // per tile and group: 4G nibble bytes, 8 float scales, 8 int16 weight sums (layout.h)
        for (int64_t t = 0; t < tiles; ++t)
          for (int64_t g = 0; g < s.k / kGroup; ++g) {
            uint8_t* grp = L.packed.data() + t * shrike::w4a8_tile_bytes(s.k, kGroup) + g * shrike::w4a8_group_bytes(kGroup);
            float* scale = reinterpret_cast<float*>(grp + 4 * kGroup);
            for (int r = 0; r < 8; ++r) scale[r] = 0.01f * (1.f + 0.5f * uniform());
          }
      } else {
        L.packed.resize(shrike::w8a8_packed_bytes(s.n, s.k));
        fill(L.packed.data(), L.packed.size());
        for (int64_t t = 0; t < tiles; ++t) {
          float* scale = reinterpret_cast<float*>(L.packed.data() + t * shrike::w8a8_tile_bytes(s.k) + 8 * s.k);
          for (int r = 0; r < 8; ++r) scale[r] = 0.01f * (1.f + 0.5f * uniform());
        }
      }
      weight_bytes += static_cast<double>(L.packed.size());
      lin.push_back(std::move(L));
    }
  // bf16 activations and outputs, as a bf16 model runs them
  std::vector<uint16_t> x(6144), y(6144);
  for (auto& v : x) {
    float f = uniform();
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  auto step = [&] {
    for (const Linear& L : lin) {
      if (int4)
        shrike::w4a8_linear(x.data(), shrike::DType::bf16, 1, L.k, L.packed.data(), L.n, kGroup, nullptr, y.data(),
                            shrike::DType::bf16);
      else
        shrike::w8a8_linear(x.data(), shrike::DType::bf16, 1, L.k, L.packed.data(), L.n, nullptr, y.data(),
                            shrike::DType::bf16);
    }
  };
  step();  // warm-up: workspaces sized
  count_begin();
  step();
  count_end();
  std::printf("variant=%s weight_bytes=%.0f y0=%u\n", shrike::linear_variant(1, 2048, int4 ? kGroup : 0), weight_bytes,
              static_cast<unsigned>(y[0]));
  return 0;
}

int run_llama(bool int4, int layers) {
  ggml_backend_t backend = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(backend, 1);
  ggml_backend_reg_t reg = ggml_backend_cpu_reg();
  ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
  auto get_extra = reinterpret_cast<ggml_backend_buffer_type_t* (*)(ggml_backend_dev_t)>(
      ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
  ggml_backend_buffer_type_t repack = nullptr;
  for (ggml_backend_buffer_type_t* b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b)
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
  if (!repack) {
    std::fprintf(stderr, "no CPU_REPACK buffer type\n");
    return 1;
  }
  const ggml_type type = int4 ? GGML_TYPE_Q4_0 : GGML_TYPE_Q8_0;
  const int n_weights = layers * 7;
  ggml_init_params wp{ggml_tensor_overhead() * (n_weights + 1), nullptr, true};
  ggml_context* wctx = ggml_init(wp);
  std::vector<ggml_tensor*> w;
  for (int l = 0; l < layers; ++l)
    for (const Shape& s : kLayer) w.push_back(ggml_new_tensor_2d(wctx, type, s.k, s.n));
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
  if (!wbuf) {
    std::fprintf(stderr, "weight buffer allocation failed\n");
    return 1;
  }
  double weight_bytes = 0;
  for (ggml_tensor* t : w) {
    size_t bytes = ggml_nbytes(t);
    std::vector<uint8_t> data(bytes);
    fill(data.data(), bytes);
    // block_q4_0 {fp16 d; 16 bytes} / block_q8_0 {fp16 d; 32 bytes}: a valid scale (0.0625) in every block
    size_t block = int4 ? 18 : 34;
    for (size_t off = 0; off < bytes; off += block) data[off] = 0x00, data[off + 1] = 0x2c;
    ggml_backend_tensor_set(t, data.data(), 0, bytes);  // repacks into the interleaved layout
    weight_bytes += static_cast<double>(bytes);
  }
  ggml_init_params ap{64u << 20, nullptr, false};
  ggml_context* ctx = ggml_init(ap);
  ggml_tensor* x2048 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 2048);
  ggml_tensor* x6144 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 6144);
  for (int i = 0; i < 2048; ++i) ggml_set_f32_1d(x2048, i, uniform());
  for (int i = 0; i < 6144; ++i) ggml_set_f32_1d(x6144, i, uniform());
  ggml_cgraph* gf = ggml_new_graph(ctx);
  for (size_t i = 0; i < w.size(); ++i)
    ggml_build_forward_expand(gf, ggml_mul_mat(ctx, w[i], w[i]->ne[0] == 6144 ? x6144 : x2048));
  ggml_backend_graph_compute(backend, gf);  // warm-up: work buffer sized
  count_begin();
  ggml_backend_graph_compute(backend, gf);
  count_end();
  const char* rp = ggml_backend_buft_name(wbuf ? ggml_backend_buffer_get_type(wbuf) : nullptr);
  std::printf("buffer=%s type=%s weight_bytes=%.0f y0=%g\n", rp, ggml_type_name(type), weight_bytes,
              ggml_get_f32_1d(ggml_graph_node(gf, 0), 0));
  ggml_free(ctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
  ggml_backend_free(backend);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "shrike") && std::strcmp(argv[1], "llama")) ||
      (std::strcmp(argv[2], "int4") && std::strcmp(argv[2], "int8"))) {
    std::fprintf(stderr, "usage: %s shrike|llama int4|int8 LAYERS\n", argv[0]);
    return 2;
  }
  bool int4 = std::strcmp(argv[2], "int4") == 0;
  int layers = std::atoi(argv[3]);
  return std::strcmp(argv[1], "shrike") == 0 ? run_shrike(int4, layers) : run_llama(int4, layers);
}
