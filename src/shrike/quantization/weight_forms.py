"""From what a checkpoint stores to what a kernel runs.

Weight-only layers (W4A16 / W8A16) keep their integers, scales and zero points; act-ordered ones
have their columns sorted by group, so every group is contiguous, and the permutation goes with
them for the activations. FP8 weights become int8 per output channel. The int8-activation
kernels (W4A8 / W8A8) take symmetric weights only, so asymmetric, act-ordered or otherwise
grouped weights are quantized again for them (`int8_kernel_weights`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike.errors import ConfigError
from shrike.quantization.compressed_tensors_format import StoredLinear
from shrike.quantization.quantizer import quantize_weight
from shrike.quantization.schemes import W4A8_GROUP_SIZES, QuantScheme


# Part of the repack cache key of weights converted for the int8 kernels: bump when the conversion changes.
INT8_CONVERSION = 2


@dataclass
class GroupedIntegers:
    """Integer weights with contiguous groups, in the column order the kernels read."""

    bits: int  # 4 or 8
    values: torch.Tensor  # (N, K) int8, signed
    scale: torch.Tensor  # (N, K/G)
    zero: torch.Tensor | None  # (N, K/G) int8, signed; None: symmetric
    group_size: int  # G; K for per-channel weights
    perm: torch.Tensor | None  # (K,) int64: column j holds input x[:, perm[j]]; None: checkpoint order

    def dequantize(self) -> torch.Tensor:
        """(N, K) fp32 in the checkpoint's column order."""
        n, k = self.values.shape
        v = self.values.float().reshape(n, -1, self.group_size)
        if self.zero is not None:
            v = v - self.zero.float()[..., None]
        w = (v * self.scale.float()[..., None]).reshape(n, k)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out


def fp8_to_int8(stored: StoredLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 weights x per-tensor/channel scales -> int8 (N, K) and fp32 scales (N, 1), round to nearest per channel.

    e4m3 keeps 3 mantissa bits at every magnitude; int8 per channel has a uniform step of absmax / 127,
    finer than fp8's for the largest weights of a row and coarser below absmax / 16.
    """
    weight = stored.float_values.float() * stored.scale.float()  # (N, K) exact: 4-bit mantissa x the scale
    return quantize_weight(weight, QuantScheme(8, None), torch.float32, "absmax")


def grouped_integers(stored: StoredLinear) -> GroupedIntegers:
    layer = stored.layer
    k = stored.in_features
    if layer.weight_type == "float":
        values, scale = fp8_to_int8(stored)
        return GroupedIntegers(8, values, scale, None, k, None)
    group = layer.group_size or k
    values, scale, zero = stored.int8_values(), stored.scale, stored.zero_point
    if stored.g_idx is None:
        return GroupedIntegers(layer.bits, values, scale, zero, group, None)
    g_idx = stored.g_idx
    groups = k // group
    if g_idx.min() < 0 or g_idx.max() >= groups or not torch.equal(torch.bincount(g_idx, minlength=groups),
                                                                   torch.full((groups,), group)):
        raise ConfigError(f"weight_g_idx does not assign exactly {group} columns to each of {groups} groups")
    perm = torch.sort(g_idx, stable=True).indices  # (K,) columns of group 0 first, then group 1, ...
    if torch.equal(perm, torch.arange(k)):
        return GroupedIntegers(layer.bits, values, scale, zero, group, None)
    return GroupedIntegers(layer.bits, values[:, perm].contiguous(), scale, zero, group, perm)


def int8_kernel_weights(stored: StoredLinear) -> tuple[QuantScheme, torch.Tensor, torch.Tensor, bool]:
    """(scheme, values (N, K) int8, scale (N, K/G), requantized) for the W4A8 / W8A8 kernels.

    Symmetric int4 per group of 32/64/128 and int8 per channel go as they are; int4 per channel is
    the same weight with its scale repeated per group. Anything else (zero points, act order, int8
    per group, other group sizes, fp8) is dequantized and rounded to int8 per output channel: a
    step of absmax/127 on top of the checkpoint's own rounding. (Re-rounding asymmetric int4 onto a
    symmetric int4 grid instead would add up to a whole int4 step and multiply SmolLM2's perplexity.)
    """
    layer, k = stored.layer, stored.in_features
    if layer.weight_type == "float":
        values, scale = fp8_to_int8(stored)
        return QuantScheme(8, None), values, scale, True
    if layer.symmetric and stored.g_idx is None:
        if layer.bits == 8 and layer.group_size is None:
            return QuantScheme(8, None), stored.int8_values(), stored.scale, False
        if layer.bits == 4 and layer.group_size in W4A8_GROUP_SIZES:
            return QuantScheme(4, layer.group_size), stored.int8_values(), stored.scale, False
        group = next((g for g in W4A8_GROUP_SIZES if k % g == 0), None)
        if layer.bits == 4 and layer.group_size is None and group is not None:
            scale = stored.scale.float().reshape(-1, 1).expand(-1, k // group)
            return QuantScheme(4, group), stored.int8_values(), scale, False
    if k % 16:
        raise ConfigError(f"--activation-quant int8 needs input features divisible by 16 (a layer has {k}); "
                          "use --activation-quant none")
    weight = grouped_integers(stored).dequantize()  # (N, K) fp32, checkpoint order
    values, scale = quantize_weight(weight, QuantScheme(8, None), torch.float32, "absmax")
    return QuantScheme(8, None), values, scale, True
