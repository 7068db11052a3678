"""Example Shrike plugin: registers one model architecture, one quantization scheme and one kernel op."""

import torch

from shrike.ops import rmsnorm_reference


class ToyForCausalLM:
    """An architecture name mapped to a model class; a real plugin builds its layers from ``config``."""

    def __init__(self, config: dict):
        self.config = config


class ToyAbsmaxInt8:
    """Symmetric int8 weights with one float scale per output row."""

    @staticmethod
    def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        return torch.round(weight / scale).to(torch.int8), scale

    @staticmethod
    def dequantize(quantized: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return quantized.float() * scale


class CountingRMSNorm:
    """Shrike's reference rmsnorm, counting calls so one can see that the plugin's kernel is the one run."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
        self.calls += 1
        rmsnorm_reference(x, weight, out, eps)


rmsnorm = CountingRMSNorm()


def register(registry) -> None:
    registry.register_architecture("ToyForCausalLM", ToyForCausalLM)
    registry.register_quantization("toy-absmax-int8", ToyAbsmaxInt8)
    registry.register_op("rmsnorm", rmsnorm)
