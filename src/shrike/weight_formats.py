"""Every weight format a linear op runs, declared once (in the spirit of ggml's per-type traits).

An entry names the format's op (shrike.ops, where its kernel and torch reference live), the weight
object its loader builds, how the op executor describes such a layer to C++ (`tape_linear`,
csrc/executor/linear_format.{h,cpp} holds the kernel side), and its memory cost. A new format adds
one entry here, a row in csrc/executor/linear_format.cpp with its kernels, and its tests.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from shrike import _C
from shrike.kernels import DenseTileWeight, GroupedParts, GroupedWeight, W4A8Weight, W8A8Weight, WeightOnlyWeight


@dataclass(frozen=True)
class WeightFormat:
    name: str
    op: str  # the op of the op table that runs it
    weight_types: tuple[type, ...]  # what the kernel backend's loader builds
    # (weight, bias (N,) float32 or None) -> the executor's description of the layer
    tape_linear: Callable[[object, torch.Tensor | None], "_C.TapeLinear"]
    # bytes held per weight (packing metadata included), for the planner and doctor
    bytes_per_weight: Callable[[object], float]


def _dense_tape_linear(weight, bias):
    if isinstance(weight, DenseTileWeight):
        return _C.TapeLinear("dense_tiles", weight.tiles, bias, weight.n, weight.k, 0)
    n, k = weight.shape
    return _C.TapeLinear("dense", weight, bias, n, k, 0)


def _dense_bytes(weight) -> float:
    return 2.0 if isinstance(weight, DenseTileWeight) else float(weight.element_size())


def _packed_bytes(weight) -> float:
    return weight.packed.numel() / (weight.n * weight.k)


def _grouped_tape_linear(w, bias):
    parts = w.parts if isinstance(w, GroupedParts) else [w]
    first = parts[0]
    linear = _C.TapeLinear.grouped(first.packed, first.n, first.k, first.group_size, first.bits, first.has_min,
                                   first.codebook, first.params_code, bias)
    for part in parts[1:]:
        linear.append_grouped(part.packed, part.n, part.group_size, part.bits, part.has_min, part.codebook,
                              part.params_code)
    return linear


def _grouped_bytes(w) -> float:
    return (w.nbytes if isinstance(w, GroupedParts) else w.packed.numel()) / (w.n * w.k)


def _weight_only_tape_linear(w, bias):
    return _C.TapeLinear.weight_only(w.q, w.scale, w.offset, w.perm, w.bits, w.n, w.k, w.group_size, bias)


def _weight_only_bytes(w) -> float:
    return sum(t.numel() * t.element_size() for t in (w.q, w.scale, w.offset)) / (w.n * w.k)


FORMATS = {
    f.name: f for f in (
        WeightFormat("dense", "dense_linear", (torch.Tensor, DenseTileWeight), _dense_tape_linear, _dense_bytes),
        WeightFormat("w4a8", "w4a8_linear", (W4A8Weight,),
                     lambda w, bias: _C.TapeLinear("w4a8", w.packed, bias, w.n, w.k, w.group_size), _packed_bytes),
        WeightFormat("w8a8", "w8a8_linear", (W8A8Weight,),
                     lambda w, bias: _C.TapeLinear("w8a8", w.packed, bias, w.n, w.k, 0), _packed_bytes),
        WeightFormat("weight_only", "weight_only_linear", (WeightOnlyWeight,), _weight_only_tape_linear,
                     _weight_only_bytes),
        WeightFormat("grouped", "grouped_linear", (GroupedWeight, GroupedParts), _grouped_tape_linear,
                     _grouped_bytes),
    )
}
LINEAR_OPS = {f.op: f for f in FORMATS.values()}


def tape_linear(op: str, weight, bias: torch.Tensor | None) -> "tuple[_C.TapeLinear, torch.Tensor | None] | None":
    """The executor's form of a linear op call and the float32 bias it points into (keep it alive), or
    None when the weight is not one its format's kernels take (e.g. a reference-backend weight)."""
    fmt = LINEAR_OPS[op]
    if not isinstance(weight, fmt.weight_types):
        return None
    if bias is not None:
        bias = bias.float().contiguous()
    return fmt.tape_linear(weight, bias), bias


@dataclass
class ExpertWeights:
    """The experts of one mixture-of-experts block, all in one weight format: what the `moe` op takes.

    gate_up[e] is expert e's gate and up projections fused along the output ((2 * intermediate, hidden),
    gate rows first), down[e] its down projection ((hidden, intermediate)); no biases. With a shared intermediate
    width the last pair is Qwen2-MoE's shared expert, which every row runs, weighted by the sigmoid of the
    router's last logit."""

    op: str  # the linear op of their format (a key of LINEAR_OPS)
    gate_up: list
    down: list
    intermediate: int  # of the routed experts
    shared_intermediate: int = 0  # of the shared expert; 0: none
    _tape: tuple | None = None

    @property
    def shared(self) -> bool:
        return self.shared_intermediate > 0

    def tape_linears(self) -> "tuple[list[_C.TapeLinear], list[_C.TapeLinear]] | None":
        """The executor's description of every expert's linears (built once), or None when the weights are
        not ones the format's kernels take (reference-backend weights)."""
        if self._tape is None:
            described = [[tape_linear(self.op, w, None) for w in ws] for ws in (self.gate_up, self.down)]
            if any(d is None for ds in described for d in ds):
                return None
            self._tape = tuple([d[0] for d in ds] for ds in described)
        return self._tape
