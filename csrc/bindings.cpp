// Python bindings: kernels take tensors' memory through DLPack (no libtorch headers).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "bindings.h"
#include "bindings_util.h"
#include "common/isa.h"
#include "common/variants.h"
#include "norm/rmsnorm.h"

using namespace shrike::bindings;
using Array = ContiguousArray;

namespace {

void rmsnorm(const Array& x, const Array& weight, Array& out, float eps) {
  const std::string op = "rmsnorm";
  shrike::DType dt = float_dtype(x, op, "x");
  require(float_dtype(weight, op, "weight") == dt && float_dtype(out, op, "out") == dt, op,
          "x, weight and out must share one dtype");
  require(x.ndim() >= 1 && weight.ndim() == 1, op, "x must be (..., dim) and weight (dim,)");
  int64_t width = dim(x, x.ndim() - 1);
  require(dim(weight, 0) == width && out.size() == x.size(), op, "weight length and out size must match x");
  int64_t rows = width ? static_cast<int64_t>(x.size()) / width : 0;
  nb::gil_scoped_release release;
  shrike::rmsnorm(x.data(), weight.data(), out.data(), rows, width, eps, dt);
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
    d["avx512_bf16"] = f.avx512_bf16; d["amx"] = f.amx;
    d["sve"] = f.sve; d["sve2"] = f.sve2; d["bf16"] = f.bf16;
    return d;
  });
  m.def("variant_tables", [] {
    nb::list out;
    for (const shrike::OpVariants& op : shrike::variant_tables()) {
      nb::list variants;
      for (const shrike::VariantInfo& v : op.variants) variants.append(nb::make_tuple(v.name, v.condition));
      out.append(nb::make_tuple(op.op, variants));
    }
    return out;
  }, "Every op's variants, best first: (op, [(variant, condition)]). A call runs the first whose level the active "
     "level includes and whose condition holds; the last is the scalar reference.");
  bind_linear(m);
  bind_attention(m);
  bind_fused(m);
  bind_executor(m);
  bind_dense(m);
  bind_weight_only(m);
  bind_grouped(m);
  m.def("rmsnorm", &rmsnorm, nb::arg("x"), nb::arg("weight"), nb::arg("out").noconvert(), nb::arg("eps"));
}
