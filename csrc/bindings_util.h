// Argument checks shared by the binding files: a wrong tensor raises a Python exception
// with the op's name instead of reaching a kernel.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace shrike::bindings {

namespace nb = nanobind;
using Array = nb::ndarray<nb::device::cpu, nb::c_contig>;

inline shrike::DType float_dtype(const Array& a, const std::string& op, const char* name) {
  nb::dlpack::dtype dt = a.dtype();
  if (dt == nb::dtype<float>()) return shrike::DType::f32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return shrike::DType::bf16;
  throw nb::type_error((op + ": " + name + " must be float32 or bfloat16").c_str());
}

inline int64_t dim(const Array& a, size_t i) { return static_cast<int64_t>(a.shape(i)); }

inline void require(bool ok, const std::string& op, const std::string& message) {
  if (!ok) throw nb::value_error((op + ": " + message).c_str());
}

}  // namespace shrike::bindings
