"""Example Shrike plugin: one model architecture, one quantization scheme and one kernel op, all usable.

- ``ToyForCausalLM``: a checkpoint whose config.json names this architecture loads as a Llama
  with a marker, showing where a plugin would build its own layers.
- ``toy-absmax-int8``: a checkpoint whose ``quantization_config.quant_method`` is this stores
  ordinary float weights; they are quantized at load to int8 with one scale per output row and run on
  Shrike's ``w8a8_linear`` op (so the layers stay on the op executor).
- ``rmsnorm`` and ``dense_linear`` (the unquantized linear op, which runs every lm_head): Shrike's
  references, counting their calls, so that one can see they are the implementations the model runs.
  Being Python functions, each splits the model's op tape where it runs: the executor runs the built-in
  ops up to it, the plugin's function runs on the same buffers, and the executor goes on.
"""

import torch

from shrike.kernels import W8A8Weight
from shrike.layers.linear import run_linear
from shrike.model.llama import CausalLM
from shrike.quantization.reference_kernels import ReferenceW8A8Weight
from shrike.ops import dense_linear_reference, rmsnorm_reference


class ToyForCausalLM(CausalLM):
    built_by_plugin = True


class AbsmaxInt8Linear:
    """A linear layer the model calls as layer(step, x, rows); it runs on the op table's w8a8_linear."""

    op_name = "w8a8_linear"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel_backend: str):
        scale = weight.float().abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
        values = torch.round(weight.float() / scale[:, None]).to(torch.int8)  # (N, K)
        self.weight = ReferenceW8A8Weight(values, scale) if kernel_backend == "reference" \
            else W8A8Weight.from_int8(values, scale)
        self.bias = None if bias is None else bias.float()
        self.out_features = weight.shape[0]

    def __call__(self, step, x, rows):
        return run_linear(step, self, x, rows)


class ToyAbsmaxInt8:
    """A quantization scheme: built per checkpoint, then called once per (fused) linear layer."""

    description = "Quantizing"

    def __init__(self, config, model_dir, dtype: torch.dtype, kernel_backend: str):
        self.dtype, self.kernel_backend = dtype, kernel_backend

    def __call__(self, tensors, prefixes, in_features, out_features, bias):
        weight = torch.cat([tensors.get(f"{p}.weight", (n, in_features), torch.float32)
                            for p, n in zip(prefixes, out_features)])
        biases = torch.cat([tensors.get(f"{p}.bias", (n,), torch.float32) for p, n in zip(prefixes, out_features)]) \
            if bias else None
        return AbsmaxInt8Linear(weight, biases, self.kernel_backend)


class CountingOp:
    """An op implementation (same calling convention as the op it replaces) that counts its calls."""

    def __init__(self, implementation) -> None:
        self.implementation = implementation
        self.calls = 0

    def __call__(self, *args) -> None:
        self.calls += 1
        self.implementation(*args)


rmsnorm = CountingOp(rmsnorm_reference)
dense_linear = CountingOp(dense_linear_reference)


def register(registry) -> None:
    registry.register_architecture("ToyForCausalLM", ToyForCausalLM)
    registry.register_quantization("toy-absmax-int8", ToyAbsmaxInt8)
    registry.register_op("rmsnorm", rmsnorm)
    registry.register_op("dense_linear", dense_linear)
