// One entry per weight format a linear op of the tape can run: how a layer of that format is
// described (Linear), whether it takes int8 rows its producer quantized, and its kernel entries.
// A new format adds an enumerator, a row in linear_format.cpp's table and a kind name the
// bindings accept; nothing else in the executor knows the formats.
#pragma once
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "dense/dense.h"
#include "grouped_linear/grouped_linear.h"
#include "weight_only/weight_only.h"

namespace shrike::executor {

enum class LinearKind { w4a8, w8a8, dense, weight_only, grouped };

struct Linear {
  LinearKind kind = LinearKind::dense;
  // packed bytes (w4a8, w8a8: linear/layout.h), or (n, k) floats or bf16 tiles (dense)
  const void* weight = nullptr;
  DType weight_dtype = DType::f32;  // dense only
  DenseLayout dense_layout = DenseLayout::rows;  // dense only
  const float* bias = nullptr;  // (n,) or null
  int64_t n = 0, k = 0, group = 0;  // group: w4a8 only
  WeightOnlyWeight weight_only;  // weight_only only (W4A16 / W8A16)
  // grouped only (GGUF quant blocks): the parts along N of a fused layer (q/k/v, gate/up) whose types pack
  // differently, each writing its own columns; usually one
  std::vector<GroupedWeight> grouped;
};

// Activations quantized by a producer op for the quantized linear right after it (the executor's
// one workspace; sized for max_tokens rows of the widest quantized input).
struct QuantizedRows {
  std::vector<int8_t> q;            // (rows, k)
  std::vector<float> scale;         // (rows,)
  std::vector<int32_t> zero;        // (rows,) w4a8 only
  std::vector<int32_t> group_sum;   // (rows, k / 32) w4a8 only
  void reserve(int64_t rows, int64_t k);
};

struct LinearFormat {
  const char* name;
  bool quantized_input;  // takes int8 rows its producer may write while they are in L1
  // y (rows, n) = x (rows, k) . W^T (+ bias), quantizing x itself when the format needs it
  void (*run)(const Linear& l, const void* x, DType x_dtype, int64_t rows, void* out, DType out_dtype);
  // row `row` of x (k values) into `q` (null for float-input formats)
  void (*quantize_row)(const Linear& l, const void* x, DType x_dtype, int64_t row, QuantizedRows& q);
  // y from rows quantized already (null for float-input formats)
  void (*run_quantized)(const Linear& l, const QuantizedRows& q, int64_t rows, void* out, DType out_dtype);
};

const LinearFormat& format_of(LinearKind kind);

}  // namespace shrike::executor
