// Python bindings: kernels take tensors' memory through DLPack (no libtorch headers).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "bindings.h"
#include "common/isa.h"
#include "norm/rmsnorm.h"

namespace nb = nanobind;
using Array = nb::ndarray<nb::device::cpu, nb::c_contig>;

namespace {

shrike::DType float_dtype(const Array& a, const char* what) {
  nb::dlpack::dtype dt = a.dtype();
  if (dt == nb::dtype<float>()) return shrike::DType::f32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return shrike::DType::bf16;
  throw nb::type_error((std::string(what) + " must be float32 or bfloat16").c_str());
}

void rmsnorm(const Array& x, const Array& weight, Array& out, float eps) {
  shrike::DType dt = float_dtype(x, "x");
  if (float_dtype(weight, "weight") != dt || float_dtype(out, "out") != dt)
    throw nb::type_error("rmsnorm: x, weight and out must share one dtype");
  if (x.ndim() < 1 || weight.ndim() != 1) throw nb::value_error("rmsnorm: x must be (..., dim) and weight (dim,)");
  int64_t dim = static_cast<int64_t>(x.shape(x.ndim() - 1));
  if (static_cast<int64_t>(weight.shape(0)) != dim || out.size() != x.size())
    throw nb::value_error("rmsnorm: weight length and out size must match x");
  int64_t rows = dim ? static_cast<int64_t>(x.size()) / dim : 0;
  nb::gil_scoped_release release;
  shrike::rmsnorm(x.data(), weight.data(), out.data(), rows, dim, eps, dt);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "Shrike kernel core";
  m.def("active_isa", [] { return std::string(shrike::isa_name(shrike::active_isa())); },
        "Kernel variant in use (best available, or the one SHRIKE_ISA / set_isa chose).");
  m.def("set_isa", [](const std::string& name) {
    try {
      shrike::set_active_isa(name);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(e.what());
    }
  }, nb::arg("name"));
  m.def("available_isas", [] {
    nb::list out;
    for (int i = 0; i < shrike::kNumIsas; ++i)
      if (shrike::isa_available(static_cast<shrike::Isa>(i))) out.append(shrike::isa_name(static_cast<shrike::Isa>(i)));
    return out;
  });
  m.def("cpu_features", [] {
    const shrike::CpuFeatures& f = shrike::cpu_features();
    nb::dict d;
    d["avx2"] = f.avx2; d["fma"] = f.fma; d["f16c"] = f.f16c; d["avx_vnni"] = f.avx_vnni;
    d["avx512_vnni"] = f.avx512_vnni; d["asimddp"] = f.asimddp; d["i8mm"] = f.i8mm;
    d["sve"] = f.sve; d["sve2"] = f.sve2; d["bf16"] = f.bf16;
    return d;
  });
  bind_linear(m);
  bind_attention(m);
  m.def("rmsnorm", &rmsnorm, nb::arg("x"), nb::arg("weight"), nb::arg("out"), nb::arg("eps"));
}
