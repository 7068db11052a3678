"""Example Shrike plugin: one model architecture, one quantization scheme and one kernel op, all usable.

- ``ToyForCausalLM``: a checkpoint whose config.json names this architecture loads as a Llama
  with a marker, showing where a plugin would build its own layers.
- ``toy-absmax-int8``: a checkpoint whose ``quantization_config.quant_method`` is this stores
  ordinary float weights; they are quantized at load to int8 with one scale per output row.
- ``rmsnorm`` and ``dense_linear`` (the unquantized linear op, which runs every lm_head): Shrike's
  references, counting their calls, so that one can see they are the implementations the model runs.
  A model whose every other op is built in keeps its compiled forward and calls the plugin's
  ``dense_linear`` for the lm_head; other models run the eager forward through the op table.
"""

import torch

from shrike.layers.linear import DenseLinear
from shrike.model.llama import CausalLM
from shrike.ops import dense_linear_reference, rmsnorm_reference


class ToyForCausalLM(CausalLM):
    built_by_plugin = True


class AbsmaxInt8Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        scale = weight.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127  # (N, 1)
        self.quantized = torch.round(weight.float() / scale).to(torch.int8)  # (N, K)
        self.scale = scale
        self.bias = bias
        self.dtype = dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight = (self.quantized.float() * self.scale).to(self.dtype)
        return torch.nn.functional.linear(x, weight, self.bias)


class ToyAbsmaxInt8:
    """A quantization scheme: built per checkpoint, then called once per (fused) linear layer."""

    description = "Quantizing"

    def __init__(self, config, model_dir, dtype: torch.dtype, kernel_backend: str):
        self.dtype = dtype

    def __call__(self, tensors, prefixes, in_features, out_features, bias):
        dense = DenseLinear.load(tensors, prefixes, in_features, out_features, bias, self.dtype)
        return AbsmaxInt8Linear(dense.weight, dense.bias, self.dtype)


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
