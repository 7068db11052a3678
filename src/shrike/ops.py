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
    """out (M, N) = x (M, K) . weight (N, K)^T (+ bias (N,) float32): F.linear's math in the reduction order
    of the compiled kernel (csrc/dense/dense_kernels.h), so both give the same bits.

    K is taken in blocks of 32 (zero-padded); lane j of 16 adds x*w of the block's element 2j+1, then 2j,
    with a fused multiply-add; the lanes are summed pairwise (j += j + 8, + 4, + 2, + 1), then bias added.
    bf16 x bf16 products are exact in fp32, so a plain add is the fma; otherwise the fma is emulated in
    float64, which could differ from a true fma by double rounding (about one operation in 2^28).
    """
    m, k = x.shape
    n = weight.shape[0]
    blocks = -(-k // 32)
    xs = F.pad(x.float(), (0, blocks * 32 - k)).reshape(m, 1, blocks, 16, 2)
    ws = F.pad(weight.float(), (0, blocks * 32 - k)).reshape(1, n, blocks, 16, 2)
    exact_products = x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
    chunk = max(1, (1 << 22) // max(1, m * 16))  # outputs per pass: bounded temporaries
    for n0 in range(0, n, chunk):
        w = ws[:, n0:n0 + chunk]
        acc = torch.zeros(m, w.shape[1], 16)  # (M, chunk, lanes)
        for b in range(blocks):
            for element in (1, 0):
                a, c = xs[:, :, b, :, element], w[:, :, b, :, element]
                acc = acc + a * c if exact_products else (a.double() * c.double() + acc.double()).float()
        for half in (8, 4, 2, 1):
            acc = acc[..., :half] + acc[..., half:2 * half]
        y = acc[..., 0]
        out[:, n0:n0 + chunk] = y if bias is None else y + bias[n0:n0 + chunk]


def register_builtin_ops(registry: Registry) -> None:
    registry.register_op("rmsnorm", _C.rmsnorm, source=f"builtin:{_C.active_isa()}")
    registry.register_op("rmsnorm", rmsnorm_reference, source="reference")
    registry.register_op("dense_linear", _C.dense_linear, source=f"builtin:{_C.active_isa()}")
    registry.register_op("dense_linear", dense_linear_reference, source="reference")
