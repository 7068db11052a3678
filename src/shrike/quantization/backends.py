"""How quantized weights are held: packed for the compiled kernel core, or plain for the PyTorch
reference GEMMs (--kernel-backend reference). The GEMM itself is an op of the op table.

`build` turns a checkpoint's stored layer into the weight its op runs on: weight-only layers
(W4A16 / W8A16) into a weight-only weight, unless `activation_quant` is "int8"; everything else
(and weight-only layers with int8 activations) into a W4A8 / W8A8 weight.
"""
from __future__ import annotations

import sys

import torch

from shrike.errors import ConfigError
from shrike.quantization import reference_kernels as ref
from shrike.quantization.compressed_tensors_format import StoredLinear
from shrike.quantization.weight_forms import grouped_integers, int8_kernel_weights

KERNEL_BACKENDS = ("auto", "reference")  # auto: the compiled kernel core
ACTIVATION_QUANT = ("none", "int8")


def _runs_weight_only(stored: StoredLinear, activation_quant: str) -> bool:
    return stored.layer.weight_only and activation_quant == "none"


def format_of(weight) -> str:
    """"weight_only", "w4a8" or "w8a8": the linear op that runs a built weight of either backend."""
    from shrike import kernels
    if isinstance(weight, (kernels.WeightOnlyWeight, ref.ReferenceWeightOnlyWeight)):
        return "weight_only"
    return "w4a8" if isinstance(weight, (kernels.W4A8Weight, ref.ReferenceW4A8Weight)) else "w8a8"


def _weight_only_parts(stored: StoredLinear):
    k = stored.in_features
    if k % 32:
        raise ConfigError(f"weight-only layers need input features divisible by 32, a layer has {k}")
    return grouped_integers(stored)


class _Requantized:
    """One stderr line per model when weights are quantized again for the int8 kernels."""

    def __init__(self):
        self.told = False

    def note(self, stored: StoredLinear) -> None:
        if not self.told:
            what = "converted to int8 per channel" if stored.layer.weight_type == "float" else \
                "re-quantized to int8 per channel"
            print(f"shrike: {stored.layer.name} weights are {what} for the int8 kernels at load (rounding error: "
                  "see the README's format table); cached after the first load", file=sys.stderr)
            self.told = True


class KernelCoreBackend:
    def __init__(self):
        from shrike import kernels
        self.kernels = kernels
        # Part of the repack cache key: packed bytes depend on the layout and the variant's build.
        self.variant = f"kernels-layout{kernels.LAYOUT_VERSION}-{kernels.active_isa()}"
        self._requantized = _Requantized()

    def build(self, stored: StoredLinear, activation_quant: str = "none"):
        k = self.kernels
        if _runs_weight_only(stored, activation_quant):
            g = _weight_only_parts(stored)
            return k.WeightOnlyWeight.from_int8(g.values, g.scale, g.zero, g.bits, g.group_size, g.perm)
        scheme = stored.scheme
        if scheme is not None and stored.zero_point is None and stored.g_idx is None:
            if scheme.weight_bits == 8:
                return k.W8A8Weight.from_int8(stored.int8_values(), stored.scale)
            if stored.packed is not None:
                return k.W4A8Weight.from_packed_int32(stored.packed, stored.scale, scheme.group_size)
            return k.W4A8Weight.from_int8(stored.values, stored.scale, scheme.group_size)
        scheme, values, scale, requantized = int8_kernel_weights(stored)
        if requantized:
            self._requantized.note(stored)
        if scheme.weight_bits == 8:
            return k.W8A8Weight.from_int8(values, scale)
        return k.W4A8Weight.from_int8(values, scale, scheme.group_size)

    def restore(self, tensors: dict[str, torch.Tensor]):
        if "offset" in tensors:
            return self.kernels.WeightOnlyWeight.from_tensors(tensors)
        if len(tensors["meta"]) == 4:
            return self.kernels.W4A8Weight.from_tensors(tensors)
        return self.kernels.W8A8Weight.from_tensors(tensors)


class ReferenceBackend:
    variant = "reference1"

    def __init__(self):
        self._requantized = _Requantized()

    def build(self, stored: StoredLinear, activation_quant: str = "none"):
        if _runs_weight_only(stored, activation_quant):
            g = _weight_only_parts(stored)
            return ref.ReferenceWeightOnlyWeight.build(g.values, g.scale, g.zero, g.bits, g.group_size, g.perm)
        scheme, values, scale, requantized = int8_kernel_weights(stored)
        if requantized:
            self._requantized.note(stored)
        scale = scale.float()
        n = scale.shape[0]
        if scheme.weight_bits == 8:
            return ref.ReferenceW8A8Weight(values, scale.reshape(n))
        return ref.ReferenceW4A8Weight(values, scale.reshape(n, -1).contiguous(), scheme.group_size)

    def restore(self, tensors: dict[str, torch.Tensor]):
        if "offset" in tensors:
            return ref.ReferenceWeightOnlyWeight.from_tensors(tensors)
        if tensors["scale"].dim() == 2:
            return ref.ReferenceW4A8Weight.from_tensors(tensors)
        return ref.ReferenceW8A8Weight.from_tensors(tensors)


def select_backend(name: str) -> KernelCoreBackend | ReferenceBackend:
    if name not in KERNEL_BACKENDS:
        raise ConfigError(f"--kernel-backend {name!r} is not known; use {' or '.join(KERNEL_BACKENDS)}")
    return ReferenceBackend() if name == "reference" else KernelCoreBackend()
