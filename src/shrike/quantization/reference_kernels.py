"""PyTorch reference of the W4A8 / W8A8 kernel semantics (csrc/quant, csrc/linear).

Activations are quantized exactly as the C++ core does, integer dot products are computed
exactly (in float arithmetic whose range provably holds them), and the float32 epilogue uses the
kernels' order of fused multiply-adds, so the outputs are bit-identical to the kernels'. Bit
identity matters: dynamic activation quantization turns a one-ulp difference in a row's extreme
value into a different scale for the whole row, and greedy tokens soon diverge.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Rows of x per chunk so that the per-group partial products stay near 64 MiB.
_PARTIALS_BUDGET = 1 << 24


def _round_half_away(v: torch.Tensor) -> torch.Tensor:
    """std::round: ties away from zero (torch.round rounds ties to even)."""
    truncated = torch.trunc(v)
    tie = (v - truncated).abs() == 0.5  # exact in float32
    return torch.where(tie, truncated + torch.sign(v), torch.round(v))


def _divide(numerator: float, t: torch.Tensor) -> torch.Tensor:
    """numerator / t rounded once, as C++ does (a Python scalar over a tensor becomes reciprocal * scalar)."""
    return torch.full_like(t, numerator) / t


def quantize_asym(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KleidiAI qai8dxp per-row rule. x (M, K) -> q (M, K) int8, scale (M,) fp32, zero (M,) int32."""
    x = x.float()
    lo = x.amin(dim=-1).clamp(max=0.0)  # (M,) the range always includes 0
    hi = x.amax(dim=-1).clamp(min=0.0)
    inv = torch.where(lo == hi, torch.ones_like(lo), _divide(255.0, hi - lo))
    scale = _divide(1.0, inv)
    lo_scaled, hi_scaled = lo * inv, hi * inv
    # The zero point comes from the end of the range with the smaller rounding error.
    zero = torch.where((-128.0 + lo_scaled) + (127.0 + hi_scaled) > 0, -128.0 - lo_scaled, 127.0 - hi_scaled)
    zero = torch.round(zero.clamp(-128.0, 127.0))  # lrintf: ties to even
    q = (_round_half_away(x * inv[:, None]) + zero[:, None]).clamp(-128, 127)
    return q.to(torch.int8), scale, zero.to(torch.int32)


def quantize_sym(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM CPU per-row rule. x (M, K) -> q (M, K) int8 in [-127, 127], scale (M,) fp32."""
    x = x.float()
    scale = x.abs().amax(dim=-1) / 127.0  # (M,)
    inv = torch.where(scale > 0, _divide(1.0, scale), torch.zeros_like(scale))
    q = torch.round(x * inv[:, None]).clamp(-127, 127)  # nearbyint: ties to even
    return q.to(torch.int8), scale


@dataclass
class ReferenceW4A8Weight:
    values: torch.Tensor  # (N, K) int8 in [-8, 7]
    scale: torch.Tensor  # (N, K/G) fp32
    group_size: int

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"values": self.values, "scale": self.scale}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "ReferenceW4A8Weight":
        values, scale = tensors["values"], tensors["scale"]
        return cls(values, scale, values.shape[1] // scale.shape[1])


@dataclass
class ReferenceW8A8Weight:
    values: torch.Tensor  # (N, K) int8
    scale: torch.Tensor  # (N,) fp32

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"values": self.values, "scale": self.scale}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "ReferenceW8A8Weight":
        return cls(tensors["values"], tensors["scale"])


@dataclass
class ReferenceWeightOnlyWeight:
    """W4A16 / W8A16: the dequantized weight in the kernel's column order, and that order."""

    weight: torch.Tensor  # (N, K) fp32, exactly the values the kernel multiplies by
    perm: torch.Tensor | None  # (K,) int64: column j multiplies x[:, perm[j]]

    @classmethod
    def build(cls, values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, bits: int, group_size: int,
              perm: torch.Tensor | None) -> "ReferenceWeightOnlyWeight":
        from shrike import kernels
        packed = kernels.WeightOnlyWeight.from_int8(values, scale, zero, bits, group_size, perm)
        return cls(packed.dequantize(), None if perm is None else perm.to(torch.int64))

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"weight": self.weight, "offset": torch.zeros(0)}  # "offset": the weight-only marker of the cache
        if self.perm is not None:
            out["perm"] = self.perm
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "ReferenceWeightOnlyWeight":
        return cls(tensors["weight"], tensors.get("perm"))


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 std::fma(a, b, c), rounded once: a * b is exact in float64 (24 + 24 bits)."""
    return (a.double() * b.double() + c.double()).float()


def w4a8_linear(x: torch.Tensor, weight: ReferenceW4A8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) fp32: int32 sums within each group, float32 fma across groups in K order."""
    n, k = weight.values.shape
    groups, g = k // weight.group_size, weight.group_size
    w = weight.values.float().reshape(n, groups, g).permute(1, 2, 0)  # (K/G, G, N), integers
    w_sums = w.sum(dim=1, keepdim=True)  # (K/G, 1, N) signed weight sums, for the zero point
    q, x_scale, zero = quantize_asym(x)
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    rows = max(1, _PARTIALS_BUDGET // max(1, groups * n))
    for start in range(0, x.shape[0], rows):
        qx = q[start:start + rows].float().reshape(-1, groups, g).transpose(0, 1)  # (K/G, m, G)
        z = zero[start:start + rows].float()[None, :, None]  # (1, m, 1)
        # |q - zero| <= 255, |w| <= 8, at most 128 terms: exact in float32.
        exact = torch.bmm(qx, w) - z * w_sums  # (K/G, m, N) = sum over the group of (q - zero) * w
        acc = torch.zeros(exact.shape[1:], dtype=torch.float32)  # (m, N)
        for group in range(groups):
            acc = _fma(exact[group], weight.scale[:, group][None, :], acc)
        out[start:start + rows] = _fma(acc, x_scale[start:start + rows, None], _bias_or_zero(bias, n))
    return out


def w8a8_linear(x: torch.Tensor, weight: ReferenceW8A8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) -> (M, N) fp32: one exact integer dot product per output, then fma(sum, x_scale * w_scale, bias)."""
    q, x_scale = quantize_sym(x)
    exact = (q.double() @ weight.values.double().t()).float()  # (M, N) exact, then rounded as int32 -> float
    return _fma(exact, x_scale[:, None] * weight.scale[None, :], _bias_or_zero(bias, weight.values.shape[0]))


def _bias_or_zero(bias: torch.Tensor | None, n: int) -> torch.Tensor:
    return (bias if bias is not None else torch.zeros(n)).float()[None, :]  # (1, N)
