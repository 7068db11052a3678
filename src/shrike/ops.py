"""Shrike's own kernel ops, registered into every registry.

Each op has the compiled kernel (dispatching to the active ISA inside ``shrike._C``) and a torch
reference with the same calling convention: inputs, a preallocated output, then scalars.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shrike import _C
from shrike.registry import Registry


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    """out = weight * x / rms(x) over the last dimension, normalised in float32 then rounded to x's dtype."""
    x32 = x.float()
    normalized = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out.copy_(weight * normalized)


def dense_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           out: torch.Tensor) -> None:
    """out (M, N) = x (M, K) . weight (N, K)^T (+ bias (N,) float32) with torch's matmul (not batch-invariant)."""
    dtype = x.dtype if x.dtype == weight.dtype else torch.float32
    y = F.linear(x.to(dtype), weight.to(dtype))
    out.copy_(y if bias is None else y.float() + bias)


def register_builtin_ops(registry: Registry) -> None:
    registry.register_op("rmsnorm", _C.rmsnorm, source=f"builtin:{_C.active_isa()}")
    registry.register_op("rmsnorm", rmsnorm_reference, source="reference")
    registry.register_op("dense_linear", _C.dense_linear, source=f"builtin:{_C.active_isa()}")
    registry.register_op("dense_linear", dense_linear_reference, source="reference")
