// The weight-format table of the executor's linear ops.
#include "executor/linear_format.h"

#include <algorithm>

#include "linear/linear.h"
#include "quant/act_quant.h"

namespace shrike::executor {

void QuantizedRows::reserve(int64_t rows, int64_t k) {
  const size_t r = static_cast<size_t>(rows), kk = static_cast<size_t>(k);
  q.resize(std::max(q.size(), r * kk));
  scale.resize(std::max(scale.size(), r));
  zero.resize(std::max(zero.size(), r));
  group_sum.resize(std::max(group_sum.size(), r * (kk / 32)));
}

namespace {

const uint8_t* packed(const Linear& l) { return static_cast<const uint8_t*>(l.weight); }

void w4a8_run(const Linear& l, const void* x, DType xt, int64_t rows, void* out, DType ot) {
  w4a8_linear(x, xt, rows, l.k, packed(l), l.n, l.group, l.bias, out, ot);
}
void w4a8_quantize_row(const Linear& l, const void* x, DType xt, int64_t row, QuantizedRows& q) {
  quantize_asym(x, xt, 1, l.k, l.group,
                {q.q.data() + row * l.k, q.scale.data() + row, q.zero.data() + row,
                 q.group_sum.data() + row * (l.k / l.group)});
}
void w4a8_run_quantized(const Linear& l, const QuantizedRows& q, int64_t rows, void* out, DType ot) {
  w4a8_linear_quantized({q.q.data(), q.scale.data(), q.zero.data(), q.group_sum.data(), nullptr, packed(l), l.bias,
                         out, ot, rows, l.n, l.k, l.group});
}

void w8a8_run(const Linear& l, const void* x, DType xt, int64_t rows, void* out, DType ot) {
  w8a8_linear(x, xt, rows, l.k, packed(l), l.n, l.bias, out, ot);
}
void w8a8_quantize_row(const Linear& l, const void* x, DType xt, int64_t row, QuantizedRows& q) {
  quantize_sym(x, xt, 1, l.k, {q.q.data() + row * l.k, q.scale.data() + row});
}
void w8a8_run_quantized(const Linear& l, const QuantizedRows& q, int64_t rows, void* out, DType ot) {
  w8a8_linear_quantized({q.q.data(), q.scale.data(), nullptr, nullptr, packed(l), l.bias, out, ot, rows, l.n, l.k});
}

void dense_run(const Linear& l, const void* x, DType xt, int64_t rows, void* out, DType ot) {
  dense_linear(x, xt, rows, l.k, l.weight, l.weight_dtype, l.n, l.bias, out, ot, l.dense_layout);
}

void weight_only_run(const Linear& l, const void* x, DType xt, int64_t rows, void* out, DType ot) {
  weight_only_linear(x, xt, rows, l.weight_only, l.bias, out, ot);
}

void grouped_run(const Linear& l, const void* x, DType xt, int64_t rows, void* out, DType ot) {
  int64_t col = 0;
  for (const GroupedWeight& part : l.grouped) {
    grouped_linear(x, xt, rows, part, l.bias ? l.bias + col : nullptr,
                   static_cast<uint8_t*>(out) + col * (ot == DType::f32 ? 4 : 2), ot, l.n);
    col += part.n;
  }
}

// Indexed by LinearKind.
const LinearFormat kFormats[] = {
    {"w4a8", true, w4a8_run, w4a8_quantize_row, w4a8_run_quantized},
    {"w8a8", true, w8a8_run, w8a8_quantize_row, w8a8_run_quantized},
    {"dense", false, dense_run, nullptr, nullptr},
    {"weight_only", false, weight_only_run, nullptr, nullptr},
    {"grouped", false, grouped_run, nullptr, nullptr},
};

}  // namespace

const LinearFormat& format_of(LinearKind kind) { return kFormats[static_cast<int>(kind)]; }

}  // namespace shrike::executor
