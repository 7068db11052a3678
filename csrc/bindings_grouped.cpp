// Bindings of the grouped linear (GGUF quant blocks kept as they are, csrc/grouped_linear): packing,
// unpacking and the GEMM. Every argument is checked here, so a wrong tensor raises instead of crashing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "bindings.h"
#include "bindings_util.h"
#include "grouped_linear/grouped_layout.h"
#include "grouped_linear/grouped_linear.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

const std::string kOp = "grouped_linear";

template <typename T>
T* checked(const Array& a, const char* name, size_t size) {
  require(a.dtype() == nb::dtype<T>(), kOp, std::string(name) + " has the wrong dtype");
  require(contiguous(a) && a.size() == size, kOp, std::string(name) + " must be contiguous with " +
          std::to_string(size) + " elements, got shape " + shape_text(a));
  return static_cast<T*>(a.data());
}

shrike::GroupedWeight shape_of(int64_t n, int64_t k, int64_t group, int bits, bool has_min, bool codebook, int params) {
  shrike::GroupedWeight w;
  w.n = n, w.k = k, w.group = group, w.bits = bits, w.has_min = has_min, w.codebook = codebook;
  w.params = static_cast<shrike::GroupedParams>(params);
  try {
    shrike::check_grouped_shape(w);
  } catch (const std::invalid_argument& e) {
    throw nb::value_error(e.what());
  }
  require(n >= 0, kOp, "N must not be negative");
  return w;
}

void grouped_pack(const Array& values, const Array& scale, const std::optional<Array>& min, int64_t group, int bits,
                  bool codebook, int params, Array& packed, const std::optional<Array>& d,
                  const std::optional<Array>& dmin) {
  require(values.ndim() == 2, kOp, "values must be (N, K), got shape " + shape_text(values));
  shrike::GroupedWeight w = shape_of(dim(values, 0), dim(values, 1), group, bits, min.has_value(), codebook, params);
  const size_t groups = static_cast<size_t>(w.n * (w.k / group));
  const int8_t* v = checked<int8_t>(values, "values", static_cast<size_t>(w.n * w.k));
  const float* s = checked<float>(scale, "scale", groups);
  const float* m = min ? checked<float>(*min, "min", groups) : nullptr;
  const size_t superblocks = static_cast<size_t>(w.n * (w.k / shrike::kGroupedSuperblock));
  const float* sd = d ? checked<float>(*d, "d", superblocks) : nullptr;
  const float* sm = dmin ? checked<float>(*dmin, "dmin", superblocks) : nullptr;
  uint8_t* out = checked<uint8_t>(packed, "packed", static_cast<size_t>(shrike::grouped_packed_bytes(w)));
  nb::gil_scoped_release release;
  try {
    shrike::grouped_pack(v, s, m, sd, sm, w, out);
  } catch (const std::invalid_argument& e) {
    nb::gil_scoped_acquire acquire;
    throw nb::value_error(e.what());
  }
}

void grouped_unpack(const Array& packed, int64_t n, int64_t k, int64_t group, int bits, bool has_min, bool codebook,
                    int params, Array& values, Array& scale, std::optional<Array> min) {
  shrike::GroupedWeight w = grouped_weight(packed, n, k, group, bits, has_min, codebook, params);
  require(min.has_value() == has_min, kOp, "pass min exactly when the weight has mins");
  const size_t groups = static_cast<size_t>(n * (k / group));
  int8_t* v = checked<int8_t>(values, "values", static_cast<size_t>(n * k));
  float* s = checked<float>(scale, "scale", groups);
  float* m = min ? checked<float>(*min, "min", groups) : nullptr;
  nb::gil_scoped_release release;
  shrike::grouped_unpack(w, v, s, m);
}

void grouped_linear(const Array& x, const Array& packed, int64_t n, int64_t group, int bits, bool has_min,
                    bool codebook, int params, const std::optional<Array>& bias, Array& out) {
  shrike::DType xt = float_dtype(x, kOp, "x"), ot = float_dtype(out, kOp, "out");
  require(x.ndim() == 2 && contiguous(x), kOp, "x must be a contiguous 2-D (M, K) tensor, got shape " + shape_text(x));
  const int64_t m = dim(x, 0), k = dim(x, 1);
  shrike::GroupedWeight w = grouped_weight(packed, n, k, group, bits, has_min, codebook, params);
  const std::string out_shape = "out must be (" + std::to_string(m) + ", " + std::to_string(n) +
                                ") with contiguous rows, got " + shape_text(out);
  require(out.ndim() == 2 && dim(out, 0) == m && dim(out, 1) == n, kOp, out_shape);
  // rows may lie further apart than n (a part's columns of a wider output), but each row is contiguous
  const int64_t out_stride = m > 1 ? static_cast<int64_t>(out.stride(0)) : n;
  require((n <= 1 || out.stride(1) == 1) && out_stride >= n, kOp, out_shape);
  const float* b = bias ? checked<float>(*bias, "bias", static_cast<size_t>(n)) : nullptr;
  nb::gil_scoped_release release;
  shrike::grouped_linear(x.data(), xt, m, w, b, out.data(), ot, out_stride);
}

}  // namespace

shrike::GroupedWeight grouped_weight(const Array& packed, int64_t n, int64_t k, int64_t group, int bits, bool has_min,
                                     bool codebook, int params) {
  shrike::GroupedWeight w = shape_of(n, k, group, bits, has_min, codebook, params);
  w.packed = checked<uint8_t>(packed, "packed", static_cast<size_t>(shrike::grouped_packed_bytes(w)));
  return w;
}

void bind_grouped(nb::module_& m) {
  m.def("grouped_packed_bytes", [](int64_t n, int64_t k, int64_t group, int bits, bool has_min, bool codebook, int params) {
    return shrike::grouped_packed_bytes(shape_of(n, k, group, bits, has_min, codebook, params));
  }, nb::arg("n"), nb::arg("k"), nb::arg("group"), nb::arg("bits"), nb::arg("has_min"), nb::arg("codebook"),
     nb::arg("params"));
  m.def("grouped_pack", &grouped_pack, nb::arg("values"), nb::arg("scale"), nb::arg("min").none(), nb::arg("group"),
        nb::arg("bits"), nb::arg("codebook"), nb::arg("params"), nb::arg("packed").noconvert(),
        nb::arg("d").none() = nb::none(), nb::arg("dmin").none() = nb::none(),
        "Packs values (N, K) int8 (bits=4: 0..15 with mins, -8..7 without; 6: 0..63, -32..31; codebook: levels of "
        "the IQ4_NL grid) with scale and min (N, K / group) float32 into packed uint8. params 0 keeps them as "
        "float32, 1 as fp16 (each must be exact in fp16), 2 as int8 factors of d and dmin "
        "(N, K / 256) float32 (each exact in fp16; scale = d * factor exactly).");
  m.def("grouped_unpack", &grouped_unpack, nb::arg("packed"), nb::arg("n"), nb::arg("k"), nb::arg("group"),
        nb::arg("bits"), nb::arg("has_min"), nb::arg("codebook"), nb::arg("params"), nb::arg("values").noconvert(),
        nb::arg("scale").noconvert(), nb::arg("min").none().noconvert());
  m.def("grouped_linear", &grouped_linear, nb::arg("x"), nb::arg("packed"), nb::arg("n"), nb::arg("group"),
        nb::arg("bits"), nb::arg("has_min"), nb::arg("codebook"), nb::arg("params"), nb::arg("bias").none(),
        nb::arg("out").noconvert(),
        "out (M, N) = x (M, K) . W^T (+ bias), W[c, j] = scale[c, g] * values[c, j] - min[c, g], x quantized to int8 "
        "per block of 32 (csrc/grouped_linear/grouped_linear.h); x, out float32 or bfloat16.");
  m.def("grouped_variant", &shrike::grouped_variant, nb::arg("m"));
}
