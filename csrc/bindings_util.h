// Argument checks shared by the binding files: a wrong tensor raises a Python exception
// with the op's name instead of reaching a kernel.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/dtype.h"

namespace shrike::bindings {

namespace nb = nanobind;
// Each binding file picks one as its `Array`. Strided arrays are for bindings that check
// contiguity themselves, so that the error names the argument.
using ContiguousArray = nb::ndarray<nb::device::cpu, nb::c_contig>;
using StridedArray = nb::ndarray<nb::device::cpu>;

// The helpers below take either.
template <typename A>
std::optional<DType> float_dtype(const A& a) {
  nb::dlpack::dtype dt = a.dtype();
  if (dt == nb::dtype<float>()) return DType::f32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return DType::bf16;
  return std::nullopt;
}

template <typename A>
DType float_dtype(const A& a, const std::string& op, const char* name) {
  if (std::optional<DType> dt = float_dtype(a)) return *dt;
  throw nb::type_error((op + ": " + name + " must be float32 or bfloat16").c_str());
}

// A KV cache's element type: float32, bfloat16, or int8 rows of attention/kv_int8.h.
template <typename A>
DType cache_dtype(const A& a, const std::string& op, const char* name) {
  if (a.dtype() == nb::dtype<int8_t>()) return DType::i8;
  if (std::optional<DType> dt = float_dtype(a)) return *dt;
  throw nb::type_error((op + ": " + name + " must be float32, bfloat16 or int8").c_str());
}

template <typename A>
int64_t dim(const A& a, size_t i) {
  return static_cast<int64_t>(a.shape(i));
}

// Python's spelling of the shape, e.g. "(2, 3)" or "(5,)".
template <typename A>
std::string shape_text(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// Row-major without gaps; strides of size-1 dimensions do not matter.
template <typename A>
bool contiguous(const A& a) {
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

inline void require(bool ok, const std::string& op, const std::string& message) {
  if (!ok) throw nb::value_error((op + ": " + message).c_str());
}

}  // namespace shrike::bindings
