// Bindings for the low-bit linear kernels, activation quantization and the thread pool.
// Every argument is checked here, so a wrong tensor raises instead of crashing.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "bindings_util.h"
#include "linear/layout.h"
#include "linear/linear.h"
#include "linear/repack.h"
#include "quant/act_quant.h"
#include "runtime/read_bandwidth.h"
#include "runtime/threadpool.h"

using namespace shrike::bindings;
using Array = StridedArray;

namespace {

template <typename T>
bool is(const Array& a) {
  return a.dtype() == nb::dtype<T>();
}

// Checks dtype (by `ok`), contiguity and the exact shape (-1 = any).
void expect(const Array& a, const char* name, bool dtype_ok, const char* dtype_text, std::vector<int64_t> shape) {
  if (!dtype_ok) throw nb::type_error((std::string(name) + " must be " + dtype_text).c_str());
  bool match = a.ndim() == shape.size();
  for (size_t i = 0; match && i < shape.size(); ++i)
    match = shape[i] < 0 || static_cast<int64_t>(a.shape(i)) == shape[i];
  if (!match) {
    std::string want = "(";
    for (size_t i = 0; i < shape.size(); ++i)
      want += (i ? ", " : "") + (shape[i] < 0 ? std::string("*") : std::to_string(shape[i]));
    throw nb::value_error((std::string(name) + " has shape " + shape_text(a) + ", expected " + want + ")").c_str());
  }
  if (!contiguous(a)) throw nb::value_error((std::string(name) + " must be contiguous").c_str());
}

shrike::DType float_kind(const Array& a, const char* name) {
  if (std::optional<shrike::DType> dt = float_dtype(a)) return *dt;
  throw nb::type_error((std::string(name) + " must be float32 or bfloat16").c_str());
}

template <typename T>
const T* ptr(const Array& a) {
  return static_cast<const T*>(a.data());
}
template <typename T>
T* mut(Array& a) {
  return static_cast<T*>(a.data());
}

// x: (m, k), out: (m, n); returns the dtypes.
std::pair<shrike::DType, shrike::DType> check_linear_io(const Array& x, int64_t k, int64_t n,
                                                        const std::optional<Array>& bias, const Array& out) {
  shrike::DType xt = float_kind(x, "x");
  expect(x, "x", true, "", {-1, k});
  shrike::DType ot = float_kind(out, "out");
  expect(out, "out", true, "", {dim(x, 0), n});
  if (bias) expect(*bias, "bias", is<float>(*bias), "float32", {n});
  return {xt, ot};
}

void check_packed(const Array& packed, int64_t bytes) {
  expect(packed, "packed", is<uint8_t>(packed), "uint8", {bytes});
}

void w4a8_linear(const Array& x, const Array& packed, int64_t n, int64_t group, const std::optional<Array>& bias,
                 Array& out) {
  if (x.ndim() != 2) throw nb::value_error(("x must be 2-D (M, K), got shape " + shape_text(x)).c_str());
  int64_t k = dim(x, 1);
  if (group != 32 && group != 64 && group != 128) throw nb::value_error("group size must be 32, 64 or 128");
  if (k % group) throw nb::value_error(("K=" + std::to_string(k) + " is not a multiple of the group size " + std::to_string(group)).c_str());
  auto [xt, ot] = check_linear_io(x, k, n, bias, out);
  check_packed(packed, shrike::w4a8_packed_bytes(n, k, group));
  nb::gil_scoped_release release;
  shrike::w4a8_linear(x.data(), xt, dim(x, 0), k, ptr<uint8_t>(packed), n, group, bias ? ptr<float>(*bias) : nullptr,
                      out.data(), ot);
}

void w8a8_linear(const Array& x, const Array& packed, int64_t n, const std::optional<Array>& bias, Array& out) {
  if (x.ndim() != 2) throw nb::value_error(("x must be 2-D (M, K), got shape " + shape_text(x)).c_str());
  int64_t k = dim(x, 1);
  if (k % 16) throw nb::value_error(("K=" + std::to_string(k) + " is not a multiple of 16").c_str());
  auto [xt, ot] = check_linear_io(x, k, n, bias, out);
  check_packed(packed, shrike::w8a8_packed_bytes(n, k));
  nb::gil_scoped_release release;
  shrike::w8a8_linear(x.data(), xt, dim(x, 0), k, ptr<uint8_t>(packed), n, bias ? ptr<float>(*bias) : nullptr,
                      out.data(), ot);
}

void check_w4a8_args(int64_t k, int64_t group) {
  if (group != 32 && group != 64 && group != 128) throw nb::value_error("group size must be 32, 64 or 128");
  if (k % group) throw nb::value_error(("K=" + std::to_string(k) + " is not a multiple of the group size " + std::to_string(group)).c_str());
}

void w4a8_pack_int8(const Array& w, const Array& scale, int64_t group, Array& packed) {
  if (w.ndim() != 2) throw nb::value_error(("weight must be 2-D (N, K), got shape " + shape_text(w)).c_str());
  int64_t n = dim(w, 0), k = dim(w, 1);
  check_w4a8_args(k, group);
  expect(w, "weight", is<int8_t>(w), "int8", {n, k});
  expect(scale, "scale", is<float>(scale), "float32", {n, k / group});
  check_packed(packed, shrike::w4a8_packed_bytes(n, k, group));
  nb::gil_scoped_release release;
  shrike::w4a8_pack_int8(ptr<int8_t>(w), ptr<float>(scale), n, k, group, mut<uint8_t>(packed));
}

void w4a8_pack_int32(const Array& w, const Array& scale, int64_t group, Array& packed) {
  if (w.ndim() != 2) throw nb::value_error(("weight_packed must be 2-D (N, K/8), got shape " + shape_text(w)).c_str());
  int64_t n = dim(w, 0), k = dim(w, 1) * 8;
  check_w4a8_args(k, group);
  expect(w, "weight_packed", is<int32_t>(w), "int32", {n, k / 8});
  expect(scale, "scale", is<float>(scale), "float32", {n, k / group});
  check_packed(packed, shrike::w4a8_packed_bytes(n, k, group));
  nb::gil_scoped_release release;
  shrike::w4a8_pack_int32(ptr<int32_t>(w), ptr<float>(scale), n, k, group, mut<uint8_t>(packed));
}

void w4a8_unpack(const Array& packed, int64_t n, int64_t k, int64_t group, Array& w, Array& scale) {
  check_w4a8_args(k, group);
  check_packed(packed, shrike::w4a8_packed_bytes(n, k, group));
  expect(w, "weight", is<int8_t>(w), "int8", {n, k});
  expect(scale, "scale", is<float>(scale), "float32", {n, k / group});
  nb::gil_scoped_release release;
  shrike::w4a8_unpack(ptr<uint8_t>(packed), n, k, group, mut<int8_t>(w), mut<float>(scale));
}

void w8a8_pack(const Array& w, const Array& scale, Array& packed) {
  if (w.ndim() != 2) throw nb::value_error(("weight must be 2-D (N, K), got shape " + shape_text(w)).c_str());
  int64_t n = dim(w, 0), k = dim(w, 1);
  if (k % 16) throw nb::value_error(("K=" + std::to_string(k) + " is not a multiple of 16").c_str());
  expect(w, "weight", is<int8_t>(w), "int8", {n, k});
  expect(scale, "scale", is<float>(scale), "float32", {n});
  check_packed(packed, shrike::w8a8_packed_bytes(n, k));
  nb::gil_scoped_release release;
  shrike::w8a8_pack(ptr<int8_t>(w), ptr<float>(scale), n, k, mut<uint8_t>(packed));
}

void w8a8_unpack(const Array& packed, int64_t n, int64_t k, Array& w, Array& scale) {
  if (k % 16) throw nb::value_error(("K=" + std::to_string(k) + " is not a multiple of 16").c_str());
  check_packed(packed, shrike::w8a8_packed_bytes(n, k));
  expect(w, "weight", is<int8_t>(w), "int8", {n, k});
  expect(scale, "scale", is<float>(scale), "float32", {n});
  nb::gil_scoped_release release;
  shrike::w8a8_unpack(ptr<uint8_t>(packed), n, k, mut<int8_t>(w), mut<float>(scale));
}

void quantize_asym(const Array& x, int64_t group, Array& q, Array& scale, Array& zero, Array& group_sum) {
  shrike::DType xt = float_kind(x, "x");
  if (x.ndim() != 2) throw nb::value_error(("x must be 2-D (M, K), got shape " + shape_text(x)).c_str());
  int64_t m = dim(x, 0), k = dim(x, 1);
  expect(x, "x", true, "", {m, k});
  if (group <= 0 || k % group || k % 16) throw nb::value_error("K must be a multiple of 16 and of the group size");
  expect(q, "q", is<int8_t>(q), "int8", {m, k});
  expect(scale, "scale", is<float>(scale), "float32", {m});
  expect(zero, "zero", is<int32_t>(zero), "int32", {m});
  expect(group_sum, "group_sum", is<int32_t>(group_sum), "int32", {m, k / group});
  nb::gil_scoped_release release;
  shrike::quantize_asym(x.data(), xt, m, k, group,
                        {mut<int8_t>(q), mut<float>(scale), mut<int32_t>(zero), mut<int32_t>(group_sum)});
}

void quantize_sym(const Array& x, Array& q, Array& scale) {
  shrike::DType xt = float_kind(x, "x");
  if (x.ndim() != 2) throw nb::value_error(("x must be 2-D (M, K), got shape " + shape_text(x)).c_str());
  int64_t m = dim(x, 0), k = dim(x, 1);
  expect(x, "x", true, "", {m, k});
  if (k % 16) throw nb::value_error("K must be a multiple of 16");
  expect(q, "q", is<int8_t>(q), "int8", {m, k});
  expect(scale, "scale", is<float>(scale), "float32", {m});
  nb::gil_scoped_release release;
  shrike::quantize_sym(x.data(), xt, m, k, {mut<int8_t>(q), mut<float>(scale)});
}

void set_threads(int n, const std::vector<int>& cpus) {
  if (n < 1) throw nb::value_error("thread count must be at least 1");
  std::vector<int> usable = shrike::runtime::usable_cpus();
  for (int c : cpus) {
    bool ok = false;
    for (int u : usable) ok = ok || u == c;
    if (!ok) throw nb::value_error(("CPU " + std::to_string(c) + " is not in this process's affinity mask").c_str());
  }
  nb::gil_scoped_release release;
  shrike::runtime::set_threads(n, cpus);
}

}  // namespace

void bind_linear(nb::module_& m) {
  m.def("linear_variant", [](const std::string& scheme, int64_t m, int64_t k, int64_t group) {
    if (scheme != "w4a8" && scheme != "w8a8") throw nb::value_error("scheme must be 'w4a8' or 'w8a8'");
    return std::string(shrike::linear_variant(m, k, scheme == "w4a8" ? group : 0));
  }, nb::arg("scheme"), nb::arg("m"), nb::arg("k") = 2048, nb::arg("group") = 128,
        "Variant (an ISA name) whose kernels run an m-row linear of this scheme at the active ISA level.");
  m.def("w4a8_packed_bytes", &shrike::w4a8_packed_bytes, nb::arg("n"), nb::arg("k"), nb::arg("group"));
  m.def("w8a8_packed_bytes", &shrike::w8a8_packed_bytes, nb::arg("n"), nb::arg("k"));
  m.def("w4a8_pack_int8", &w4a8_pack_int8, nb::arg("weight"), nb::arg("scale"), nb::arg("group"), nb::arg("out").noconvert());
  m.def("w4a8_pack_int32", &w4a8_pack_int32, nb::arg("weight_packed"), nb::arg("scale"), nb::arg("group"), nb::arg("out").noconvert());
  m.def("w4a8_unpack", &w4a8_unpack, nb::arg("packed"), nb::arg("n"), nb::arg("k"), nb::arg("group"), nb::arg("weight"),
        nb::arg("scale"));
  m.def("w8a8_pack", &w8a8_pack, nb::arg("weight"), nb::arg("scale"), nb::arg("out").noconvert());
  m.def("w8a8_unpack", &w8a8_unpack, nb::arg("packed"), nb::arg("n"), nb::arg("k"), nb::arg("weight"), nb::arg("scale"));
  m.def("w4a8_linear", &w4a8_linear, nb::arg("x"), nb::arg("packed"), nb::arg("n"), nb::arg("group"),
        nb::arg("bias").none(), nb::arg("out").noconvert());
  m.def("w8a8_linear", &w8a8_linear, nb::arg("x"), nb::arg("packed"), nb::arg("n"), nb::arg("bias").none(),
        nb::arg("out").noconvert());
  m.def("quantize_asym", &quantize_asym, nb::arg("x"), nb::arg("group"), nb::arg("q"), nb::arg("scale"),
        nb::arg("zero"), nb::arg("group_sum"));
  m.def("quantize_sym", &quantize_sym, nb::arg("x"), nb::arg("q"), nb::arg("scale"));
  m.def("set_threads", &set_threads, nb::arg("n"), nb::arg("cpus"));
  m.def("num_threads", &shrike::runtime::num_threads);
  m.def("usable_cpus", &shrike::runtime::usable_cpus);
  m.def("read_bandwidth_probe", [](const Array& buffer, const std::string& width, const std::string& pattern,
                                   int threads) {
    if (!contiguous(buffer)) throw nb::value_error("buffer must be contiguous");
    shrike::runtime::ReadMethod method{shrike::runtime::parse_read_width(width),
                                       shrike::runtime::parse_read_pattern(pattern), threads};
    size_t bytes = buffer.nbytes();
    const void* data = buffer.data();
    nb::gil_scoped_release release;
    return shrike::runtime::read_bandwidth_probe(data, bytes, method);
  }, nb::arg("buffer"), nb::arg("width"), nb::arg("pattern"), nb::arg("threads"),
        "Reads the whole buffer with one load width (read_widths()), pattern (chunks, slices, streams4) and "
        "thread count on the kernel thread pool; returns a checksum. Time it for read bandwidth.");
  m.def("read_widths", [] {
    std::vector<std::string> names;
    for (auto w : shrike::runtime::read_widths_available()) names.push_back(shrike::runtime::read_width_name(w));
    return names;
  }, "Load widths the read-bandwidth probe can use on this CPU, narrowest first.");
}
