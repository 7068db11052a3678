"""Dense linear layers, loaded from one or several checkpoint tensors fused along the output."""
from __future__ import annotations

import torch

from shrike.model.weights import CheckpointTensors


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel=None):
        from shrike.ops import dense_linear_reference

        self.weight = weight  # (out_features, in_features)
        self.bias = bias  # (out_features,) or None
        self.kernel = kernel or dense_linear_reference  # the op table's dense_linear

    @classmethod
    def load(cls, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
             bias: bool, dtype: torch.dtype, kernel=None) -> "DenseLinear":
        parts = [tensors.get(f"{p}.weight", (n, in_features), dtype) for p, n in zip(prefixes, out_features)]
        biases = [tensors.get(f"{p}.bias", (n,), dtype) for p, n in zip(prefixes, out_features)] if bias else None
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        return cls(weight.contiguous(), None if biases is None else torch.cat(biases), kernel)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty(x.shape[0], self.weight.shape[0], dtype=x.dtype)
        self.kernel(x, self.weight, self.bias, out)
        return out
