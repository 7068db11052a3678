"""Dense linear layers, loaded from one or several checkpoint tensors fused along the output."""
from __future__ import annotations

from collections.abc import Callable

import torch

from shrike.kernels import DenseTileWeight
from shrike.ops import weight_for_op
from shrike.model.weights import CheckpointTensors

# The "dense_linear" op (shrike.ops): (x (M, K), weight, bias (N,) float32 or None, out (M, N)) -> None, the
# weight as weight_for_op gives it. The built-in one is batch-invariant: a row's result does not depend on
# the other rows.
DenseOp = Callable[[torch.Tensor, "torch.Tensor | DenseTileWeight", "torch.Tensor | None", torch.Tensor], None]


class DenseLinear:
    op_name = "dense_linear"
    # The checkpoint projections fused into the layer, (prefix, out_features) each in output order (what LoRA
    # adapters name), and the layer's adapter slots once LoRA is on (shrike.layers.lora.LoRASlots).
    checkpoint_parts: tuple[tuple[str, int], ...] = ()
    lora = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, op: DenseOp):
        """op: the dense_linear the op table resolved, which decides the weight's form (weight_for_op)."""
        self.out_features, self.in_features = weight.shape
        self.weight = weight_for_op(weight.contiguous(), op)  # (out_features, in_features), or its tiles
        self.bias = None if bias is None else bias.float().contiguous()  # (out_features,) float32, what the op takes

    @classmethod
    def load(cls, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
             bias: bool, dtype: torch.dtype, op: DenseOp) -> "DenseLinear":
        parts = [tensors.get(f"{p}.weight", (n, in_features), dtype) for p, n in zip(prefixes, out_features)]
        biases = [tensors.get(f"{p}.bias", (n,), dtype) for p, n in zip(prefixes, out_features)] if bias else None
        weight = parts[0] if len(parts) == 1 else torch.cat(parts)
        layer = cls(weight, None if biases is None else torch.cat(biases), op)
        layer.checkpoint_parts = tuple(zip(prefixes, out_features))
        return layer

    def __call__(self, step, x, rows):
        """x (rows, in_features) -> (rows, out_features) in x's dtype, through step.ops."""
        return run_linear(step, self, x, rows)


def run_linear(step, layer, x, rows):
    """Any linear layer (op_name, weight, bias, out_features) on x (rows, K) -> (rows, N) in x's dtype; with
    adapter slots (`lora`), each row's LoRA update is added after the base linear has run for all rows."""
    out = step.empty(rows, layer.out_features, dtype=x.dtype)
    getattr(step.ops, layer.op_name)(x, layer.weight, layer.bias, out)
    adapters = getattr(layer, "lora", None)
    if adapters is not None:
        step.ops.lora(x, adapters, step.lora_slots, out)
    return out
