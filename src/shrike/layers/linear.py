"""Dense linear layers, loaded from one or several checkpoint tensors fused along the output."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shrike.model.weights import CheckpointTensors


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight = weight  # (out_features, in_features)
        self.bias = bias  # (out_features,) or None

    @classmethod
    def load(cls, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
             bias: bool, dtype: torch.dtype) -> "DenseLinear":
        parts = [tensors.get(f"{p}.weight", (n, in_features), dtype) for p, n in zip(prefixes, out_features)]
        biases = [tensors.get(f"{p}.bias", (n,), dtype) for p, n in zip(prefixes, out_features)] if bias else None
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        return cls(weight.contiguous(), None if biases is None else torch.cat(biases))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
