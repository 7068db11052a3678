// Checks every available kernel variant (low-bit, weight-only and dense linears) against the scalar
// reference, bit for bit, on random data over many shapes (the idea of ggml's test-backend-ops). Built without Python so the
// Arm variants can run under qemu-user.
//
//   linear_consistency [--isa NAME] [--expect NAME,NAME] [--quick]
// --isa     test only this variant (besides the reference it is compared with)
// --expect  fail unless these variants are available (guards against a CPU model or build
//           that silently drops a variant)
// --quick   fewer row counts, group sizes and dtype combinations on the large shapes (qemu)
// Exit status 0 only if every comparison matched.
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/isa.h"
#include "dense/dense.h"
#include "dense/dense_tiles.h"
#include "grouped_linear/grouped_layout.h"
#include "grouped_linear/grouped_linear.h"
#include "linear/layout.h"
#include "linear/linear.h"
#include "linear/repack.h"
#include "quant/act_quant.h"
#include "runtime/threadpool.h"
#include "weight_only/weight_only.h"

namespace {

using namespace shrike;

struct Shape {
  int64_t n, k;
};

std::mt19937 rng(1234);

// Activations with a per-row offset so the asymmetric zero point moves; row 1 is all zero
// and row 2 all positive to hit the edge cases of the range rule.
std::vector<float> activations(int64_t m, int64_t k) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> offset(-1.5f, 1.5f);
  std::vector<float> x(m * k);
  for (int64_t i = 0; i < m; ++i) {
    float shift = offset(rng);
    for (int64_t j = 0; j < k; ++j) {
      float v = normal(rng) + shift;
      if (i == 1) v = 0.f;
      if (i == 2) v = std::abs(v) + 0.25f;
      x[i * k + j] = v;
    }
  }
  return x;
}

std::vector<uint8_t> as_input(const std::vector<float>& x, DType dt) {
  std::vector<uint8_t> bytes(x.size() * (dt == DType::f32 ? 4 : 2));
  if (dt == DType::f32) {
    std::memcpy(bytes.data(), x.data(), bytes.size());
  } else {
    for (size_t i = 0; i < x.size(); ++i) {
      bf16 b = float_to_bf16(x[i]);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  return bytes;
}

struct Tally {
  int checks = 0, failures = 0;
};

void expect_equal(Tally& tally, const void* got, const void* want, size_t bytes, const std::string& what) {
  ++tally.checks;
  if (std::memcmp(got, want, bytes) == 0) return;
  ++tally.failures;
  if (tally.failures <= 20) std::printf("  MISMATCH %s\n", what.c_str());
}

struct W4Case {
  Shape s;
  int64_t group;
  std::vector<uint8_t> packed;
  std::vector<float> bias;
};

W4Case make_w4a8(Shape s, int64_t group, Tally& tally) {
  std::uniform_int_distribution<int> nibble(-8, 7);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f), bias(-1.f, 1.f);
  std::vector<int8_t> w(s.n * s.k);
  for (auto& v : w) v = static_cast<int8_t>(nibble(rng));
  std::vector<float> scales(s.n * (s.k / group));
  for (auto& v : scales) v = scale(rng);
  W4Case c{s, group, std::vector<uint8_t>(w4a8_packed_bytes(s.n, s.k, group)), std::vector<float>(s.n)};
  for (auto& v : c.bias) v = bias(rng);
  w4a8_pack_int8(w.data(), scales.data(), s.n, s.k, group, c.packed.data());
  // The same weights in compressed-tensors pack-quantized form must give the same bytes.
  std::vector<int32_t> words(s.n * s.k / 8, 0);
  for (int64_t i = 0; i < s.n * s.k; ++i)
    words[i / 8] = static_cast<int32_t>(static_cast<uint32_t>(words[i / 8]) | static_cast<uint32_t>(w[i] + 8) << (4 * (i % 8)));
  std::vector<uint8_t> from_words(c.packed.size());
  w4a8_pack_int32(words.data(), scales.data(), s.n, s.k, group, from_words.data());
  std::string name = "w4a8 N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " G=" + std::to_string(group);
  expect_equal(tally, from_words.data(), c.packed.data(), c.packed.size(), name + " pack int32 vs int8");
  std::vector<int8_t> w_back(w.size());
  std::vector<float> scales_back(scales.size());
  w4a8_unpack(c.packed.data(), s.n, s.k, group, w_back.data(), scales_back.data());
  expect_equal(tally, w_back.data(), w.data(), w.size(), name + " unpack weights");
  expect_equal(tally, scales_back.data(), scales.data(), scales.size() * 4, name + " unpack scales");
  return c;
}

struct W8Case {
  Shape s;
  std::vector<uint8_t> packed;
  std::vector<float> bias;
};

W8Case make_w8a8(Shape s, Tally& tally) {
  std::uniform_int_distribution<int> byte(-128, 127);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f), bias(-1.f, 1.f);
  std::vector<int8_t> w(s.n * s.k);
  for (auto& v : w) v = static_cast<int8_t>(byte(rng));
  std::vector<float> scales(s.n);
  for (auto& v : scales) v = scale(rng);
  W8Case c{s, std::vector<uint8_t>(w8a8_packed_bytes(s.n, s.k)), std::vector<float>(s.n)};
  for (auto& v : c.bias) v = bias(rng);
  w8a8_pack(w.data(), scales.data(), s.n, s.k, c.packed.data());
  std::vector<int8_t> w_back(w.size());
  std::vector<float> scales_back(s.n);
  w8a8_unpack(c.packed.data(), s.n, s.k, w_back.data(), scales_back.data());
  std::string name = "w8a8 N=" + std::to_string(s.n) + " K=" + std::to_string(s.k);
  expect_equal(tally, w_back.data(), w.data(), w.size(), name + " unpack weights");
  expect_equal(tally, scales_back.data(), scales.data(), scales.size() * 4, name + " unpack scales");
  return c;
}

// Runs fn under the reference once and under every variant in `isas`, comparing the bytes.
template <typename Fn>
void compare(std::vector<Tally>& tallies, const std::vector<Isa>& isas, size_t bytes, const std::string& what, Fn fn) {
  std::vector<uint8_t> want(bytes), got(bytes);
  set_active_isa("scalar");
  fn(want.data());
  for (size_t i = 0; i < isas.size(); ++i) {
    std::fill(got.begin(), got.end(), 0xa5);
    set_active_isa(isa_name(isas[i]));
    fn(got.data());
    expect_equal(tallies[i], got.data(), want.data(), bytes, std::string(isa_name(isas[i])) + " " + what);
  }
}

void check_all(const std::vector<Isa>& isas, bool quick, std::vector<Tally>& tallies, Tally& packing) {
  const std::vector<Shape> small = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}, {13, 128}, {37, 256}, {8, 64}};
  const std::vector<Shape> large = {{2560, 2048}, {2048, 2048}, {12288, 2048}, {2048, 6144}};
  // Row counts cover every remainder of the register blocks (4 and 8 rows, 2 for smmla).
  const std::vector<int64_t> small_m = quick ? std::vector<int64_t>{1, 2, 3, 5, 17}
                                             : std::vector<int64_t>{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64};
  const std::vector<int64_t> large_m = quick ? std::vector<int64_t>{1, 5} : std::vector<int64_t>{1, 3, 8};
  // Prefill row counts on shapes small enough for the scalar reference (and qemu).
  const std::vector<Shape> prefill = {{576, 576}, {37, 256}};
  const std::vector<int64_t> prefill_m = quick ? std::vector<int64_t>{33} : std::vector<int64_t>{129, 512};
  for (int pass = 0; pass < 3; ++pass) {
    const auto& shapes = pass == 0 ? small : pass == 1 ? large : prefill;
    const auto& ms = pass == 0 ? small_m : pass == 1 ? large_m : prefill_m;
    const int variant_step = pass == 2 || (pass == 1 && quick) ? 3 : 1;
    for (Shape s : shapes) {
      for (int64_t group : {32, 64, 128}) {
        if (s.k % group) continue;
        // Keeps the emulated run short: the group loop is the same code for every shape.
        if (pass == 1 && group != 128 && (quick || s.n > 2560)) continue;
        W4Case c = make_w4a8(s, group, packing);
        for (int64_t m : ms) {
          std::vector<float> x = activations(m, s.k);
          for (int variant = 0; variant < 4; variant += variant_step) {
            DType xt = variant & 1 ? DType::bf16 : DType::f32, ot = variant & 2 ? DType::bf16 : DType::f32;
            std::vector<uint8_t> xin = as_input(x, xt);
            std::string name = "w4a8 M=" + std::to_string(m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                               " G=" + std::to_string(group) + (xt == DType::bf16 ? " x=bf16" : " x=f32") +
                               (ot == DType::bf16 ? " out=bf16" : " out=f32");
            const float* bias = variant == 1 ? nullptr : c.bias.data();
            compare(tallies, isas, m * s.n * (ot == DType::f32 ? 4 : 2), name, [&](void* out) {
              w4a8_linear(xin.data(), xt, m, s.k, c.packed.data(), s.n, group, bias, out, ot);
            });
            if (variant == 1) {
              int64_t groups = s.k / group;
              size_t bytes = m * s.k + m * 8 + m * groups * 4;
              compare(tallies, isas, bytes, name + " quantize", [&](void* out) {
                int8_t* q = static_cast<int8_t*>(out);
                AsymRows rows{q, reinterpret_cast<float*>(q + m * s.k), reinterpret_cast<int32_t*>(q + m * s.k + 4 * m),
                              reinterpret_cast<int32_t*>(q + m * s.k + 8 * m)};
                quantize_asym(xin.data(), xt, m, s.k, group, rows);
              });
            }
          }
        }
      }
      if (pass == 1 && s.n > 2560) continue;
      W8Case c = make_w8a8(s, packing);
      for (int64_t m : ms) {
        std::vector<float> x = activations(m, s.k);
        for (int variant = 0; variant < 4; variant += variant_step) {
          DType xt = variant & 1 ? DType::bf16 : DType::f32, ot = variant & 2 ? DType::bf16 : DType::f32;
          std::vector<uint8_t> xin = as_input(x, xt);
          std::string name = "w8a8 M=" + std::to_string(m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                             (xt == DType::bf16 ? " x=bf16" : " x=f32") + (ot == DType::bf16 ? " out=bf16" : " out=f32");
          const float* bias = variant == 1 ? nullptr : c.bias.data();
          compare(tallies, isas, m * s.n * (ot == DType::f32 ? 4 : 2), name, [&](void* out) {
            w8a8_linear(xin.data(), xt, m, s.k, c.packed.data(), s.n, bias, out, ot);
          });
          if (variant == 1)
            compare(tallies, isas, m * s.k + 4 * m, name + " quantize", [&](void* out) {
              int8_t* q = static_cast<int8_t*>(out);
              quantize_sym(xin.data(), xt, m, s.k, SymRows{q, reinterpret_cast<float*>(q + m * s.k)});
            });
        }
      }
    }
  }
}

// dense_linear: every variant equals the reference of its reduction order for each dtype combination
// (the lanes order, or the tile order for bf16 x bf16 at the amx level, on (n, k) rows and on packed
// tiles), and each row of a batched call equals the row computed alone (batch invariance).
void check_dense(const std::vector<Isa>& isas, bool quick, std::vector<Tally>& tallies) {
  struct Case {
    Shape s;
    std::vector<int64_t> ms;
  };
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1, 5} : std::vector<int64_t>{1, 2, 5, 17};
  // Tile edges: 16-row tiles and 32-row blocks, panels of 16 outputs, 32-K tiles.
  const std::vector<int64_t> tile_ms = quick ? std::vector<int64_t>{1, 17} : std::vector<int64_t>{1, 15, 16, 17, 33, 512};
  const std::vector<Case> cases = {{{13, 33}, ms}, {{40, 100}, ms}, {{64, 576}, ms}, {{7, 2048}, ms},
                                   {{300, 1100}, ms}, {{37, 31}, tile_ms}, {{49, 200}, tile_ms}};
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& cs : cases) {
    const Shape s = cs.s;
    std::vector<float> w(s.n * s.k), bias(s.n);
    for (auto& v : w) v = 0.05f * normal(rng);
    for (auto& v : bias) v = normal(rng);
    std::vector<uint8_t> w_bf16 = as_input(w, DType::bf16);
    std::vector<bf16> w_tiles(dense_tiles_elements(s.n, s.k));
    dense_pack_tiles(reinterpret_cast<const bf16*>(w_bf16.data()), s.n, s.k, w_tiles.data());
    for (int64_t m : cs.ms) {
      std::vector<float> x = activations(m, s.k);
      for (int variant = 0; variant < 8; ++variant) {
        DType xt = variant & 1 ? DType::bf16 : DType::f32, wt = variant & 2 ? DType::bf16 : DType::f32;
        DType ot = variant & 4 ? DType::bf16 : DType::f32;
        std::vector<uint8_t> xin = as_input(x, xt), win = as_input(w, wt);
        size_t out_bytes = ot == DType::f32 ? 4 : 2;
        std::string name = "dense M=" + std::to_string(m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                           " variant=" + std::to_string(variant);
        const float* b = variant & 1 ? nullptr : bias.data();
        std::vector<uint8_t> lanes(m * s.n * out_bytes), tiles(m * s.n * out_bytes), got(m * s.n * out_bytes);
        set_active_isa("scalar");
        dense_linear(xin.data(), xt, m, s.k, win.data(), wt, s.n, b, lanes.data(), ot);
        const bool bf16_pair = xt == DType::bf16 && wt == DType::bf16;
        if (bf16_pair)
          dense_linear(xin.data(), xt, m, s.k, w_tiles.data(), wt, s.n, b, tiles.data(), ot, DenseLayout::tiles);
        for (size_t i = 0; i < isas.size(); ++i) {
          set_active_isa(isa_name(isas[i]));
          const bool tile_order = std::string(dense_variant(xt, wt)) == "amx";
          const std::vector<uint8_t>& want = tile_order ? tiles : lanes;
          const std::string what = std::string(isa_name(isas[i])) + " " + name;
          std::fill(got.begin(), got.end(), 0xa5);
          dense_linear(xin.data(), xt, m, s.k, win.data(), wt, s.n, b, got.data(), ot);
          expect_equal(tallies[i], got.data(), want.data(), got.size(), what);
          if (bf16_pair) {  // tiles: the amx kernel, or below it the tile order's reference
            std::fill(got.begin(), got.end(), 0xa5);
            dense_linear(xin.data(), xt, m, s.k, w_tiles.data(), wt, s.n, b, got.data(), ot, DenseLayout::tiles);
            expect_equal(tallies[i], got.data(), tiles.data(), got.size(), what + " tiles");
          }
        }
        for (size_t i = 0; i < isas.size() && m > 1 && variant % 3 == 0; ++i) {
          set_active_isa(isa_name(isas[i]));
          std::vector<uint8_t> batched(m * s.n * out_bytes), alone(s.n * out_bytes);
          dense_linear(xin.data(), xt, m, s.k, win.data(), wt, s.n, b, batched.data(), ot);
          size_t x_row = s.k * (xt == DType::f32 ? 4 : 2);
          for (int64_t r = 0; r < m; ++r) {
            dense_linear(xin.data() + r * x_row, xt, 1, s.k, win.data(), wt, s.n, b, alone.data(), ot);
            expect_equal(tallies[i], batched.data() + r * s.n * out_bytes, alone.data(), alone.size(),
                         std::string(isa_name(isas[i])) + " " + name + " row " + std::to_string(r) + " alone");
          }
        }
      }
    }
  }
}

// weight_only_linear (W4A16 / W8A16): every variant equals the reference for both widths, group
// sizes, zero points and an act-order permutation, and batched rows equal rows alone.
void check_weight_only(const std::vector<Isa>& isas, bool quick, std::vector<Tally>& tallies) {
  const std::vector<Shape> shapes = {{13, 64}, {40, 96}, {64, 576}, {7, 2048}};
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1, 5} : std::vector<int64_t>{1, 2, 5, 17};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale_dist(0.001f, 0.02f);
  for (Shape s : shapes) {
    for (int bits : {4, 8}) {
      const int64_t group = s.k % 64 == 0 ? (bits == 4 ? 64 : s.k) : 32;
      const int64_t groups = s.n * (s.k / group);
      std::vector<uint8_t> q(s.n * s.k / (bits == 4 ? 2 : 1));
      for (auto& v : q) v = static_cast<uint8_t>(byte(rng));
      std::vector<float> scale(groups), offset(groups), bias(s.n);
      for (int64_t g = 0; g < groups; ++g) {
        scale[g] = bf16_to_float(float_to_bf16(scale_dist(rng)));  // bf16 scales: the dequantizing fma is exact
        offset[g] = -static_cast<float>(byte(rng) >> (bits == 4 ? 4 : 0)) * scale[g];
      }
      std::normal_distribution<float> normal(0.f, 1.f);
      for (auto& v : bias) v = normal(rng);
      std::vector<int32_t> perm(s.k);
      for (int64_t j = 0; j < s.k; ++j) perm[j] = static_cast<int32_t>(j);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (bool permuted : {false, true}) {
        WeightOnlyWeight w;
        w.q = q.data(), w.scale = scale.data(), w.offset = offset.data(), w.perm = permuted ? perm.data() : nullptr;
        w.bits = bits, w.n = s.n, w.k = s.k, w.group = group;
        for (int64_t m : ms) {
          std::vector<float> x = activations(m, s.k);
          for (int variant = 0; variant < 4; ++variant) {
            DType xt = variant & 1 ? DType::bf16 : DType::f32, ot = variant & 2 ? DType::bf16 : DType::f32;
            std::vector<uint8_t> xin = as_input(x, xt);
            size_t out_bytes = ot == DType::f32 ? 4 : 2;
            const float* b = variant & 1 ? nullptr : bias.data();
            std::string name = "weight_only bits=" + std::to_string(bits) + " M=" + std::to_string(m) + " N=" +
                               std::to_string(s.n) + " K=" + std::to_string(s.k) + " G=" + std::to_string(group) +
                               (permuted ? " act-order" : "") + " variant=" + std::to_string(variant);
            compare(tallies, isas, m * s.n * out_bytes, name,
                    [&](void* out) { weight_only_linear(xin.data(), xt, m, w, b, out, ot); });
            for (size_t i = 0; i < isas.size() && m > 1 && variant == 1; ++i) {
              set_active_isa(isa_name(isas[i]));
              std::vector<uint8_t> batched(m * s.n * out_bytes), alone(s.n * out_bytes);
              weight_only_linear(xin.data(), xt, m, w, b, batched.data(), ot);
              size_t x_row = s.k * (xt == DType::f32 ? 4 : 2);
              for (int64_t r = 0; r < m; ++r) {
                weight_only_linear(xin.data() + r * x_row, xt, 1, w, b, alone.data(), ot);
                expect_equal(tallies[i], batched.data() + r * s.n * out_bytes, alone.data(), alone.size(),
                             std::string(isa_name(isas[i])) + " " + name + " row " + std::to_string(r) + " alone");
              }
            }
          }
        }
      }
    }
  }
}

// v made exact in fp16, as GGUF block scales are: its mantissa cut to 10 bits, or below the normal halves a
// multiple of 2^-24.
float exact_f16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits &= ~((1u << 13) - 1u);
  float truncated;
  std::memcpy(&truncated, &bits, 4);
  f16 h;
  return float_to_f16_exact(truncated, &h) ? truncated : std::ldexp(std::round(std::ldexp(v, 24)), -24);
}

// grouped_linear (GGUF quant blocks): every variant equals the reference for int8, 6- and 4-bit values and 4-bit
// codebook indices (IQ4_NL / IQ4_XS levels), groups of
// 16 and 32, with and without mins, float32, fp16 and factored scales (K a multiple of 256), x and out in both
// dtypes, on shapes whose N leaves a partial tile and register block (all-zero activation rows included);
// packing round-trips.
void check_grouped(const std::vector<Isa>& isas, bool quick, std::vector<Tally>& tallies, Tally& packing) {
  const std::vector<Shape> shapes = {{13, 64}, {37, 256}, {130, 640}, {2049, 96}, {21, 768}};
  const std::vector<int64_t> ms = quick ? std::vector<int64_t>{1, 2, 3, 17} : std::vector<int64_t>{1, 2, 3, 5, 8, 9, 17, 64};
  std::uniform_real_distribution<float> scale_dist(0.001f, 0.02f), min_dist(-0.1f, 0.1f), bias_dist(-1.f, 1.f);
  struct Values {
    int bits;
    bool codebook;
  };
  for (Shape s : shapes)
    for (Values kind : {Values{8, false}, Values{6, false}, Values{4, false}, Values{4, true}})
      for (int64_t group : {16, 32})
        for (bool has_min : {false, true})
          for (GroupedParams form : {GroupedParams::kFloat32, GroupedParams::kFloat16, GroupedParams::kFactored}) {
            const int bits = kind.bits;
            if (form == GroupedParams::kFactored && s.k % kGroupedSuperblock != 0) continue;
            if (kind.codebook && has_min) continue;
            const bool f16_params = form == GroupedParams::kFloat16;
            // 4-bit: 0..15 with mins, -8..7 without; 6-bit: 0..63, -32..31
            const int lowest = bits == 8 ? -128 : has_min ? 0 : -(1 << (bits - 1));
            std::uniform_int_distribution<int> value(lowest, lowest + (1 << bits) - 1);
            const int64_t groups = s.n * (s.k / group);
            std::vector<int8_t> w(s.n * s.k);
            std::uniform_int_distribution<int> index(0, 15);
            for (auto& v : w) v = kind.codebook ? kGroupedCodebook[index(rng)] : static_cast<int8_t>(value(rng));
            std::vector<float> scale(groups), mins(groups), bias(s.n);
            for (auto& v : scale) v = f16_params ? exact_f16(scale_dist(rng)) : scale_dist(rng);
            for (auto& v : mins) v = f16_params ? exact_f16(min_dist(rng)) : min_dist(rng);
            for (auto& v : bias) v = bias_dist(rng);
            // factored: an fp16 d and dmin per 256 K of a row times int8 factors, as the K-quants hold them
            const int64_t superblocks = s.n * (s.k / kGroupedSuperblock), per = kGroupedSuperblock / group;
            std::vector<float> d(superblocks), dmin(superblocks);
            std::uniform_int_distribution<int> factor(-128, 127);
            if (form == GroupedParams::kFactored) {
              for (auto& v : d) v = exact_f16(scale_dist(rng) / 64.f);
              for (auto& v : dmin) v = exact_f16(min_dist(rng) / 64.f);
              for (int64_t i = 0; i < groups; ++i) {
                const int64_t sb = i / (s.k / group) * (s.k / kGroupedSuperblock) + i % (s.k / group) / per;
                scale[i] = d[sb] * static_cast<float>(factor(rng));
                mins[i] = dmin[sb] * static_cast<float>(factor(rng));
              }
            }
            GroupedWeight shape;
            shape.n = s.n, shape.k = s.k, shape.group = group, shape.bits = bits, shape.has_min = has_min;
            shape.codebook = kind.codebook, shape.params = form;
            std::vector<uint8_t> packed(grouped_packed_bytes(shape));
            const bool factored = form == GroupedParams::kFactored;
            grouped_pack(w.data(), scale.data(), has_min ? mins.data() : nullptr, factored ? d.data() : nullptr,
                         factored && has_min ? dmin.data() : nullptr, shape, packed.data());
            shape.packed = packed.data();
            const std::string name = "grouped bits=" + std::to_string(bits) + (kind.codebook ? " codebook" : "") + " G=" + std::to_string(group) +
                                     (has_min ? " min" : "") + (f16_params ? " f16" : factored ? " factored" : "") + " N=" + std::to_string(s.n) +
                                     " K=" + std::to_string(s.k);
            std::vector<int8_t> w_back(w.size());
            std::vector<float> scale_back(groups), mins_back(groups);
            grouped_unpack(shape, w_back.data(), scale_back.data(), has_min ? mins_back.data() : nullptr);
            expect_equal(packing, w_back.data(), w.data(), w.size(), name + " unpack values");
            expect_equal(packing, scale_back.data(), scale.data(), groups * 4, name + " unpack scales");
            if (has_min) expect_equal(packing, mins_back.data(), mins.data(), groups * 4, name + " unpack mins");
            for (int64_t m : ms) {
              std::vector<float> x = activations(m, s.k);
              for (int variant = 0; variant < 4; variant += quick ? 3 : 1) {
                DType xt = variant & 1 ? DType::bf16 : DType::f32, ot = variant & 2 ? DType::bf16 : DType::f32;
                std::vector<uint8_t> xin = as_input(x, xt);
                const float* b = variant == 1 ? nullptr : bias.data();
                compare(tallies, isas, m * s.n * (ot == DType::f32 ? 4 : 2), name + " M=" + std::to_string(m) +
                        " variant=" + std::to_string(variant),
                        [&](void* out) { grouped_linear(xin.data(), xt, m, shape, b, out, ot); });
                if (variant == 0) {  // rows 5 columns apart, as a part of a fused layer writes them: the gap untouched
                  const int64_t stride = s.n + 5;
                  const size_t bytes = m * stride * (ot == DType::f32 ? 4 : 2);
                  compare(tallies, isas, bytes, name + " M=" + std::to_string(m) + " out_stride=N+5", [&](void* out) {
                    std::memset(out, 0x5a, bytes);
                    grouped_linear(xin.data(), xt, m, shape, b, out, ot, stride);
                  });
                }
              }
            }
          }
}

}  // namespace

int main(int argc, char** argv) {
  std::string only, expect;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) only = argv[++i];
    else if (a == "--expect" && i + 1 < argc) expect = argv[++i];
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--isa NAME] [--expect NAME,NAME] [--quick]\n", argv[0]);
      return 2;
    }
  }
  runtime::set_threads(2, {});
  std::string available;
  for (int i = 0; i < kNumIsas; ++i)
    if (isa_available(static_cast<Isa>(i))) available += std::string(available.empty() ? "" : ",") + isa_name(static_cast<Isa>(i));
  std::printf("available variants: %s\n", available.c_str());
  int failures = 0;
  for (size_t pos = 0; !expect.empty() && pos != std::string::npos;) {
    size_t comma = expect.find(',', pos);
    std::string name = expect.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? comma : comma + 1;
    bool found = false;
    for (int i = 0; i < kNumIsas; ++i) found = found || (name == isa_name(static_cast<Isa>(i)) && isa_available(static_cast<Isa>(i)));
    if (!found) {
      std::printf("FAIL: expected variant %s is not available\n", name.c_str());
      ++failures;
    }
  }
  std::vector<Isa> isas;
  for (int i = 1; i < kNumIsas; ++i)
    if (isa_available(static_cast<Isa>(i)) && (only.empty() || only == isa_name(static_cast<Isa>(i))))
      isas.push_back(static_cast<Isa>(i));
  if (!only.empty() && isas.empty()) {
    std::printf("FAIL: variant %s is not available\n", only.c_str());
    ++failures;
  }
  // Variants of this architecture the CPU cannot run are named, never silently dropped.
#if defined(SHRIKE_X86)
  const Isa arch_first = Isa::avx2, arch_last = Isa::amx;
#else
  const Isa arch_first = Isa::dotprod, arch_last = Isa::sve2;
#endif
  for (int i = static_cast<int>(arch_first); i <= static_cast<int>(arch_last); ++i)
    if (!isa_available(static_cast<Isa>(i)) && (only.empty() || only == isa_name(static_cast<Isa>(i))))
      std::printf("%-8s SKIPPED: not runnable on this CPU or not in this build\n", isa_name(static_cast<Isa>(i)));
  std::vector<Tally> tallies(isas.size());
  Tally packing;
  check_all(isas, quick, tallies, packing);
  check_dense(isas, quick, tallies);
  check_weight_only(isas, quick, tallies);
  check_grouped(isas, quick, tallies, packing);
  std::printf("%-8s %5d checks, %d mismatches\n", "repack", packing.checks, packing.failures);
  failures += packing.failures;
  for (size_t i = 0; i < isas.size(); ++i) {
    std::printf("%-8s %5d checks, %d mismatches\n", isa_name(isas[i]), tallies[i].checks, tallies[i].failures);
    failures += tallies[i].failures;
  }
  std::printf(failures ? "RESULT: FAIL (%d)\n" : "RESULT: OK\n", failures);
  return failures ? 1 : 0;
}
