// Registration functions of the binding files that make up the shrike._C module.
#pragma once
#include <nanobind/nanobind.h>

void bind_linear(nanobind::module_& m);
void bind_attention(nanobind::module_& m);
void bind_fused(nanobind::module_& m);
void bind_plan(nanobind::module_& m);
void bind_dense(nanobind::module_& m);
