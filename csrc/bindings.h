// Registration functions of the binding files that make up the shrike._C module.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "fused/fused.h"
#include "grouped_linear/grouped_linear.h"
#include "weight_only/weight_only.h"

void bind_linear(nanobind::module_& m);
void bind_attention(nanobind::module_& m);
void bind_fused(nanobind::module_& m);
void bind_executor(nanobind::module_& m);
void bind_dense(nanobind::module_& m);
void bind_weight_only(nanobind::module_& m);
void bind_grouped(nanobind::module_& m);

// A weight-only (W4A16 / W8A16) weight over the given arrays, checked (bindings_weight_only.cpp).
shrike::WeightOnlyWeight weight_only_weight(const nanobind::ndarray<nanobind::device::cpu>& q,
                                            const nanobind::ndarray<nanobind::device::cpu>& scale,
                                            const nanobind::ndarray<nanobind::device::cpu>& offset,
                                            const std::optional<nanobind::ndarray<nanobind::device::cpu>>& perm, int bits,
                                            int64_t n, int64_t k, int64_t group);

// A grouped (GGUF quant blocks) weight over packed, checked (bindings_grouped.cpp).
shrike::GroupedWeight grouped_weight(const nanobind::ndarray<nanobind::device::cpu>& packed, int64_t n, int64_t k,
                                     int64_t group, int bits, bool has_min, bool codebook, int params);
