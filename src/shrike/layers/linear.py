"""Dense linear layers, loaded from one or several checkpoint tensors fused along the output."""
from __future__ import annotations

from collections.abc import Callable

import torch

from shrike import _C
from shrike.model.weights import CheckpointTensors

# The "dense_linear" op (shrike.ops): (x (M, K), weight (N, K), bias (N,) float32 or None, out (M, N)) -> None.
# The built-in one (_C.dense_linear) is batch-invariant: a row's result does not depend on the other rows.
DenseOp = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor], None]


class DenseLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, op: DenseOp = _C.dense_linear):
        self.weight = weight.contiguous()  # (out_features, in_features)
        self.bias = bias  # (out_features,) as loaded, or None
        self._bias_f32 = None if bias is None else bias.float().contiguous()  # what the op takes
        self.op = op

    @classmethod
    def load(cls, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
             bias: bool, dtype: torch.dtype, op: DenseOp = _C.dense_linear) -> "DenseLinear":
        parts = [tensors.get(f"{p}.weight", (n, in_features), dtype) for p, n in zip(prefixes, out_features)]
        biases = [tensors.get(f"{p}.bias", (n,), dtype) for p, n in zip(prefixes, out_features)] if bias else None
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        return cls(weight, None if biases is None else torch.cat(biases), op)

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x (..., in_features) -> (..., out_features) in out_dtype (default: x's dtype)."""
        n, k = self.weight.shape
        rows = x.reshape(-1, k).contiguous()  # (M, K)
        out = torch.empty(rows.shape[0], n, dtype=out_dtype or x.dtype)
        self.op(rows, self.weight, self._bias_f32, out)
        return out.reshape(*x.shape[:-1], n)
