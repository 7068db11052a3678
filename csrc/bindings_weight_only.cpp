// Binding of the weight-only quantized linear op (W4A16 / W8A16): out = x . dequant(W)^T (+ bias).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "bindings_util.h"
#include "weight_only/weight_only.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

const std::string kOp = "weight_only_linear";

template <typename T>
const T* checked(const Array& a, const char* name, size_t size) {
  require(a.dtype() == nb::dtype<T>(), kOp, std::string(name) + " has the wrong dtype");
  require(contiguous(a) && a.size() == size, kOp, std::string(name) + " must be contiguous with " +
          std::to_string(size) + " elements, got shape " + shape_text(a));
  return static_cast<const T*>(a.data());
}

}  // namespace

shrike::WeightOnlyWeight weight_only_weight(const Array& q, const Array& scale, const Array& offset,
                                            const std::optional<Array>& perm, int bits, int64_t n, int64_t k,
                                            int64_t group) {
  require(bits == 4 || bits == 8, kOp, "bits must be 4 or 8");
  require(n >= 0 && k > 0 && k % 32 == 0, kOp, "K must be a positive multiple of 32, got " + std::to_string(k));
  require(group > 0 && group % 32 == 0 && k % group == 0, kOp,
          "group must be a multiple of 32 dividing K, got " + std::to_string(group));
  shrike::WeightOnlyWeight w;
  w.bits = bits, w.n = n, w.k = k, w.group = group;
  w.q = checked<uint8_t>(q, "q", static_cast<size_t>(n * k / (bits == 4 ? 2 : 1)));
  w.scale = checked<float>(scale, "scale", static_cast<size_t>(n * (k / group)));
  w.offset = checked<float>(offset, "offset", static_cast<size_t>(n * (k / group)));
  if (perm) w.perm = checked<int32_t>(*perm, "perm", static_cast<size_t>(k));
  return w;
}

namespace {

void weight_only_linear(const Array& x, const Array& q, const Array& scale, const Array& offset,
                        const std::optional<Array>& perm, int bits, int64_t n, int64_t group,
                        const std::optional<Array>& bias, Array& out) {
  shrike::DType xt = float_dtype(x, kOp, "x"), ot = float_dtype(out, kOp, "out");
  require(x.ndim() == 2 && contiguous(x), kOp, "x must be a contiguous 2-D (M, K) tensor, got shape " + shape_text(x));
  int64_t m = dim(x, 0), k = dim(x, 1);
  shrike::WeightOnlyWeight w = weight_only_weight(q, scale, offset, perm, bits, n, k, group);
  if (perm)
    for (int64_t j = 0; j < k; ++j) require(w.perm[j] >= 0 && w.perm[j] < k, kOp, "perm holds an index outside [0, K)");
  require(out.ndim() == 2 && dim(out, 0) == m && dim(out, 1) == n && contiguous(out), kOp,
          "out must be contiguous (" + std::to_string(m) + ", " + std::to_string(n) + "), got " + shape_text(out));
  const float* bias_ptr = bias ? checked<float>(*bias, "bias", static_cast<size_t>(n)) : nullptr;
  nb::gil_scoped_release release;
  shrike::weight_only_linear(x.data(), xt, m, w, bias_ptr, out.data(), ot);
}

}  // namespace

void bind_weight_only(nb::module_& m) {
  m.def("weight_only_linear", &weight_only_linear, nb::arg("x"), nb::arg("q"), nb::arg("scale"), nb::arg("offset"),
        nb::arg("perm").none(), nb::arg("bits"), nb::arg("n"), nb::arg("group"), nb::arg("bias").none(),
        nb::arg("out").noconvert(),
        "out (M, N) = x (M, K) . W^T (+ bias (N,) float32), W[c, j] = fma(q[c, j], scale[c, g], offset[c, g]) with "
        "q unsigned int4 (two per byte, low nibble first) or int8; x, out float32 or bfloat16. Batch-invariant.");
}
