// Binding of the unquantized linear op (bf16/fp32 weights): out = x . w^T (+ bias).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "bindings_util.h"
#include "dense/dense.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

void check_contiguous(const Array& a, const std::string& op, const char* name) {
  require(contiguous(a), op, std::string(name) + " must be contiguous");
}

void dense_linear(const Array& x, const Array& w, const std::optional<Array>& bias, Array& out) {
  const std::string op = "dense_linear";
  shrike::DType xt = float_dtype(x, op, "x"), wt = float_dtype(w, op, "weight"), ot = float_dtype(out, op, "out");
  require(x.ndim() == 2, op, "x must be 2-D (M, K), got shape " + shape_text(x));
  require(w.ndim() == 2, op, "weight must be 2-D (N, K), got shape " + shape_text(w));
  int64_t m = dim(x, 0), k = dim(x, 1), n = dim(w, 0);
  require(dim(w, 1) == k, op, "weight has shape " + shape_text(w) + " but x has K=" + std::to_string(k));
  require(out.ndim() == 2 && dim(out, 0) == m && dim(out, 1) == n, op,
          "out has shape " + shape_text(out) + ", expected (" + std::to_string(m) + ", " + std::to_string(n) + ")");
  check_contiguous(x, op, "x");
  check_contiguous(w, op, "weight");
  check_contiguous(out, op, "out");
  const float* bias_ptr = nullptr;
  if (bias) {
    require(bias->dtype() == nb::dtype<float>(), op, "bias must be float32");
    require(bias->ndim() == 1 && dim(*bias, 0) == n, op, "bias has shape " + shape_text(*bias) + ", expected (" + std::to_string(n) + ",)");
    check_contiguous(*bias, op, "bias");
    bias_ptr = static_cast<const float*>(bias->data());
  }
  nb::gil_scoped_release release;
  shrike::dense_linear(x.data(), xt, m, k, w.data(), wt, n, bias_ptr, out.data(), ot);
}

}  // namespace

void bind_dense(nb::module_& m) {
  m.def("dense_linear", &dense_linear, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("out").noconvert(),
        "out (M, N) = x (M, K) . weight (N, K)^T (+ bias (N,) float32); x, weight, out float32 or bfloat16. "
        "Batch-invariant: a row's result does not depend on the other rows.");
}
