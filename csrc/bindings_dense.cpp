// Binding of the unquantized linear op (bf16/fp32 weights): out = x . w^T (+ bias), the weight as
// (N, K) rows or as bf16 tiles packed for the AMX-BF16 kernel (dense/dense_tiles.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "bindings_util.h"
#include "dense/dense.h"
#include "dense/dense_tiles.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

void check_contiguous(const Array& a, const std::string& op, const char* name) {
  require(contiguous(a), op, std::string(name) + " must be contiguous");
}

// Checks x (M, K), out (M, N) and bias (N,); returns the bias pointer.
const float* check_operands(const std::string& op, const Array& x, int64_t n, const std::optional<Array>& bias,
                            const Array& out) {
  require(x.ndim() == 2, op, "x must be 2-D (M, K), got shape " + shape_text(x));
  const int64_t m = dim(x, 0);
  require(out.ndim() == 2 && dim(out, 0) == m && dim(out, 1) == n, op,
          "out has shape " + shape_text(out) + ", expected (" + std::to_string(m) + ", " + std::to_string(n) + ")");
  check_contiguous(x, op, "x");
  check_contiguous(out, op, "out");
  if (!bias) return nullptr;
  require(bias->dtype() == nb::dtype<float>(), op, "bias must be float32");
  require(bias->ndim() == 1 && dim(*bias, 0) == n, op, "bias has shape " + shape_text(*bias) + ", expected (" + std::to_string(n) + ",)");
  check_contiguous(*bias, op, "bias");
  return static_cast<const float*>(bias->data());
}

void check_bf16(const Array& a, const std::string& op, const char* name) {
  require(float_dtype(a, op, name) == shrike::DType::bf16, op, std::string(name) + " must be bfloat16");
}

void dense_linear(const Array& x, const Array& w, const std::optional<Array>& bias, Array& out) {
  const std::string op = "dense_linear";
  shrike::DType xt = float_dtype(x, op, "x"), wt = float_dtype(w, op, "weight"), ot = float_dtype(out, op, "out");
  require(w.ndim() == 2, op, "weight must be 2-D (N, K), got shape " + shape_text(w));
  const int64_t n = dim(w, 0);
  const float* bias_ptr = check_operands(op, x, n, bias, out);
  const int64_t m = dim(x, 0), k = dim(x, 1);
  require(dim(w, 1) == k, op, "weight has shape " + shape_text(w) + " but x has K=" + std::to_string(k));
  check_contiguous(w, op, "weight");
  nb::gil_scoped_release release;
  shrike::dense_linear(x.data(), xt, m, k, w.data(), wt, n, bias_ptr, out.data(), ot);
}

void dense_linear_tiles(const Array& x, const Array& tiles, int64_t n, const std::optional<Array>& bias, Array& out) {
  const std::string op = "dense_linear_tiles";
  const shrike::DType ot = float_dtype(out, op, "out");
  check_bf16(x, op, "x");
  check_bf16(tiles, op, "tiles");
  const float* bias_ptr = check_operands(op, x, n, bias, out);
  const int64_t m = dim(x, 0), k = dim(x, 1);
  require(tiles.ndim() == 1 && tiles.size() == shrike::dense_tiles_elements(n, k) && contiguous(tiles), op,
          "tiles of shape " + shape_text(tiles) + " were not packed for N=" + std::to_string(n) + ", K=" + std::to_string(k));
  nb::gil_scoped_release release;
  shrike::dense_linear(x.data(), shrike::DType::bf16, m, k, tiles.data(), shrike::DType::bf16, n, bias_ptr, out.data(),
                       ot, shrike::DenseLayout::tiles);
}

// A bf16 weight (N, K) and its tile form, both contiguous and of matching sizes -> (N, K).
std::pair<int64_t, int64_t> weight_and_tiles(const std::string& op, const Array& w, const Array& tiles) {
  check_bf16(w, op, "weight");
  check_bf16(tiles, op, "tiles");
  require(w.ndim() == 2 && contiguous(w), op, "weight must be contiguous (N, K), got shape " + shape_text(w));
  const int64_t n = dim(w, 0), k = dim(w, 1);
  require(tiles.ndim() == 1 && tiles.size() == shrike::dense_tiles_elements(n, k) && contiguous(tiles), op,
          "tiles of shape " + shape_text(tiles) + " do not hold N=" + std::to_string(n) + ", K=" + std::to_string(k) +
              " (contiguous, " + std::to_string(shrike::dense_tiles_elements(n, k)) + " elements)");
  return {n, k};
}

void dense_pack_tiles(const Array& w, Array& tiles) {
  const auto [n, k] = weight_and_tiles("dense_pack_tiles", w, tiles);
  nb::gil_scoped_release release;
  shrike::dense_pack_tiles(static_cast<const shrike::bf16*>(w.data()), n, k, static_cast<shrike::bf16*>(tiles.data()));
}

void dense_unpack_tiles(const Array& tiles, Array& w) {
  const auto [n, k] = weight_and_tiles("dense_unpack_tiles", w, tiles);
  nb::gil_scoped_release release;
  shrike::dense_unpack_tiles(static_cast<const shrike::bf16*>(tiles.data()), n, k, static_cast<shrike::bf16*>(w.data()));
}

shrike::DType dtype_named(const std::string& name) {
  if (name == "float32") return shrike::DType::f32;
  if (name == "bfloat16") return shrike::DType::bf16;
  throw nb::value_error(("dense_variant: dtype must be float32 or bfloat16, got " + name).c_str());
}

}  // namespace

void bind_dense(nb::module_& m) {
  m.def("dense_linear", &dense_linear, nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("out").noconvert(),
        "out (M, N) = x (M, K) . weight (N, K)^T (+ bias (N,) float32); x, weight, out float32 or bfloat16. "
        "Batch-invariant: a row's result does not depend on the other rows.");
  m.def("dense_linear_tiles", &dense_linear_tiles, nb::arg("x"), nb::arg("tiles"), nb::arg("n"), nb::arg("bias").none(),
        nb::arg("out").noconvert(),
        "dense_linear with the weight packed by dense_pack_tiles; x and tiles bfloat16.");
  m.def("dense_tiles_elements", [](int64_t n, int64_t k) { return shrike::dense_tiles_elements(n, k); },
        nb::arg("n"), nb::arg("k"), "bfloat16 elements of an (N, K) weight packed as tiles.");
  m.def("dense_pack_tiles", &dense_pack_tiles, nb::arg("weight"), nb::arg("tiles").noconvert(),
        "Packs a bfloat16 weight (N, K) into tiles (dense_tiles_elements(N, K),), the AMX-BF16 operand layout.");
  m.def("dense_unpack_tiles", &dense_unpack_tiles, nb::arg("tiles"), nb::arg("weight").noconvert(),
        "The inverse of dense_pack_tiles.");
  m.def("dense_variant", [](const std::string& x_dtype, const std::string& w_dtype) {
    return std::string(shrike::dense_variant(dtype_named(x_dtype), dtype_named(w_dtype)));
  }, nb::arg("x_dtype"), nb::arg("w_dtype"),
        "The variant dense_linear runs for these dtypes at the active level; amx: the tile order.");
}
