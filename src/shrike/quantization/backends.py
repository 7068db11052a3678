"""How quantized weights are held: packed for the compiled kernel core, or plain for the PyTorch
reference GEMMs (--kernel-backend reference). The GEMM itself is an op of the op table."""
from __future__ import annotations

import torch

from shrike.errors import ConfigError
from shrike.quantization import reference_kernels as ref
from shrike.quantization.compressed_tensors_format import StoredLinear
from shrike.quantization.schemes import QuantScheme

KERNEL_BACKENDS = ("auto", "reference")  # auto: the compiled kernel core


class KernelCoreBackend:
    def __init__(self):
        from shrike import kernels
        self.kernels = kernels
        # Part of the repack cache key: packed bytes depend on the layout and the variant's build.
        self.variant = f"kernels-layout{kernels.LAYOUT_VERSION}-{kernels.active_isa()}"

    def build(self, stored: StoredLinear):
        k = self.kernels
        if stored.scheme.weight_bits == 8:
            return k.W8A8Weight.from_int8(stored.int8_values(), stored.scale)
        if stored.packed is not None:
            return k.W4A8Weight.from_packed_int32(stored.packed, stored.scale, stored.scheme.group_size)
        return k.W4A8Weight.from_int8(stored.values, stored.scale, stored.scheme.group_size)

    def restore(self, scheme: QuantScheme, tensors: dict[str, torch.Tensor]):
        cls = self.kernels.W8A8Weight if scheme.weight_bits == 8 else self.kernels.W4A8Weight
        return cls.from_tensors(tensors)


class ReferenceBackend:
    variant = "reference1"

    def build(self, stored: StoredLinear):
        scale = stored.scale.float()
        n = scale.shape[0]
        if stored.scheme.weight_bits == 8:
            return ref.ReferenceW8A8Weight(stored.int8_values(), scale.reshape(n))
        return ref.ReferenceW4A8Weight(stored.int8_values(), scale.reshape(n, -1), stored.scheme.group_size)

    def restore(self, scheme: QuantScheme, tensors: dict[str, torch.Tensor]):
        if scheme.weight_bits == 8:
            return ref.ReferenceW8A8Weight.from_tensors(tensors)
        return ref.ReferenceW4A8Weight.from_tensors(tensors, scheme.group_size)


def select_backend(name: str) -> KernelCoreBackend | ReferenceBackend:
    if name not in KERNEL_BACKENDS:
        raise ConfigError(f"--kernel-backend {name!r} is not known; use {' or '.join(KERNEL_BACKENDS)}")
    return ReferenceBackend() if name == "reference" else KernelCoreBackend()
