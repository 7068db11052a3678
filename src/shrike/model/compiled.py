"""The compiled forward: a whole engine step of a Llama-family model as one C++ call (csrc/plan).

At load the plan gets pointers to every weight, KV cache and rotary table, and to the step-input
buffers the model runner owns and updates in place between steps. It runs only built-in kernels,
so it is chosen only when every op of the model resolved to one; otherwise (a plugin's op or
architecture, ``--kernel-backend reference``) the eager Python model runs through the op table.
The lm_head is the one exception: when a plugin replaces ``dense_linear``, the plan stops at the
final normed rows and the plugin's op computes the logits from them, so a quantized model keeps
its compiled layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike import _C, kernels
from shrike.layers.attention import KVCache
from shrike.kernels import DenseTileWeight
from shrike.layers.linear import DenseLinear
from shrike.model.llama import CausalLM
from shrike.quantization.loading import QuantizedLinear

# Ops the plan runs inline for every model; the linear formats are checked per layer.
PLAN_OPS = ("embedding", "rmsnorm", "add_rmsnorm", "rope_write_kv", "paged_attention", "silu_mul")
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
_CACHE_DTYPES = {**_DTYPES, torch.int8: "int8"}  # int8: rows of values and scales (shrike.layers.kv_int8)


def _has_dense_kernel(ops) -> bool:
    return ops.is_builtin("dense_linear")


def _dense_plan_linear(weight, bias, n: int, k: int) -> "_C.PlanLinear":
    """weight: (N, K) tensor or DenseTileWeight (shrike.layers.linear.weight_for_op)."""
    if isinstance(weight, DenseTileWeight):
        return _C.PlanLinear("dense_tiles", weight.tiles, bias, n, k, 0)
    return _C.PlanLinear("dense", weight, bias, n, k, 0)


def _plan_linear(layer, ops, keep: list) -> "_C.PlanLinear | str":
    """The plan's description of a linear layer, or why it has none."""
    if isinstance(layer, QuantizedLinear):
        op = f"{layer.format}_linear"
        if not ops.is_builtin(op):
            return f"op {op} resolves to {ops.chosen[op].source}"
        w = layer.weight
        if isinstance(w, kernels.W4A8Weight):
            return _C.PlanLinear("w4a8", w.packed, layer.bias, w.n, w.k, w.group_size)
        if isinstance(w, kernels.W8A8Weight):
            return _C.PlanLinear("w8a8", w.packed, layer.bias, w.n, w.k, 0)
        if isinstance(w, kernels.WeightOnlyWeight):
            return _C.PlanLinear.weight_only(w.q, w.scale, w.offset, w.perm, w.bits, w.n, w.k, w.group_size, layer.bias)
        return f"weights of type {type(w).__name__} are not packed for the kernels"
    if isinstance(layer, DenseLinear):
        if not _has_dense_kernel(ops):
            return "no built-in dense linear kernel"
        bias = None if layer.bias is None else layer.bias.float().contiguous()
        keep.append(bias)
        return _dense_plan_linear(layer.weight, bias, layer.out_features, layer.in_features)
    return f"linear layer of type {type(layer).__name__}"


@dataclass
class StepBuffers:
    """Step inputs the runner writes in place and the plan reads (numpy views share the memory)."""

    token_ids: torch.Tensor  # (max_tokens,) int64
    seqs: torch.Tensor  # (max_seqs, 3) int32: block-table row, tokens already cached, new tokens
    block_tables: torch.Tensor  # (max_seqs, max_blocks_per_seq) int32, one row per running sequence
    logits_rows: torch.Tensor  # (max_tokens,) int32: token rows whose logits are wanted
    logits: torch.Tensor  # (max_seqs, vocab) fp32; steps wanting more rows pass their own buffer

    @classmethod
    def allocate(cls, max_tokens: int, max_seqs: int, max_blocks: int, vocab: int) -> "StepBuffers":
        return cls(torch.zeros(max_tokens, dtype=torch.int64), torch.zeros(max_seqs, 3, dtype=torch.int32),
                   torch.zeros(max_seqs, max_blocks, dtype=torch.int32), torch.zeros(max_tokens, dtype=torch.int32),
                   torch.empty(max_seqs, vocab, dtype=torch.float32))


class CompiledForward:
    def __init__(self, model: CausalLM, kv_caches: list[KVCache], block_size: int, buffers: StepBuffers):
        c = model.config
        self.model, self.buffers = model, buffers
        max_tokens, max_seqs = buffers.token_ids.shape[0], buffers.seqs.shape[0]
        self._keep: list = [kv_caches]  # what the plan points into, beyond the model and the buffers
        cache_dtype = kv_caches[0].key.dtype
        shape = dict(hidden=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                     intermediate=c.intermediate_size, vocab=c.vocab_size, block_size=block_size,
                     num_slots=kv_caches[0].key.shape[0], eps=c.rms_norm_eps, attn_scale=c.head_dim ** -0.5,
                     scale_emb=c.scale_emb, residual_scale=c.residual_scale, logit_divisor=c.logit_divisor,
                     act_dtype=_DTYPES[model.dtype], cache_dtype=_CACHE_DTYPES[cache_dtype])
        plan = _C.ForwardPlan(shape, max_tokens, max_seqs)
        rotary = model.rotary
        long_table = getattr(rotary, "cos_sin_long", None)
        plan.set_rope(rotary.cos_sin, long_table, rotary.long_threshold if long_table is not None else -1)
        for layer, cache in zip(model.layers, kv_caches):
            linears = [_plan_linear(getattr(layer, name), model.ops, self._keep)
                       for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")]
            q_norm, k_norm = (layer.q_norm.weight, layer.k_norm.weight) if c.qk_norm else (None, None)
            plan.add_layer(layer.input_norm.weight, layer.post_attention_norm.weight, q_norm, k_norm, *linears,
                           cache.key, cache.value)
        int8_head = getattr(model, "lm_head_int8", None)
        if int8_head is not None:  # --lm-head-quant int8: the W8A8 kernel, unless the reference backend holds it
            w = int8_head.weight
            self.lm_head_in_plan = isinstance(w, kernels.W8A8Weight) and model.ops.is_builtin("w8a8_linear")
            lm_head = _C.PlanLinear("w8a8", w.packed, None, w.n, w.k, 0) if self.lm_head_in_plan else None
        else:
            self.lm_head_in_plan = _has_dense_kernel(model.ops)
            lm_head = _dense_plan_linear(model.lm_head, None, c.vocab_size, c.hidden_size) \
                if self.lm_head_in_plan else None
        plan.set_final(model.embed_tokens, model.norm.weight, lm_head)
        self.hidden_out = torch.empty(max_tokens, c.hidden_size, dtype=model.dtype)  # (max_tokens, hidden)
        b = buffers
        plan.set_inputs(b.token_ids, b.seqs, b.block_tables, b.logits_rows, b.logits, self.hidden_out)
        self.plan = plan

    def run(self, num_seqs: int, num_tokens: int, num_logits: int) -> torch.Tensor:
        """One step over the buffers' first num_seqs sequences -> (num_logits, vocab) fp32 logits."""
        logits = self.buffers.logits
        own = num_logits > logits.shape[0]
        if own:  # e.g. prompt logprobs over a long chunk
            logits = torch.empty(num_logits, logits.shape[1], dtype=torch.float32)
        self.plan.run(num_seqs, num_tokens, num_logits, logits if own else None)
        logits = logits[:num_logits]
        if not self.lm_head_in_plan and num_logits:
            logits.copy_(self.model.compute_logits(self.hidden_out[:num_logits]))
        return logits


def plan_blocker(model, kv_caches: list[KVCache]) -> str | None:
    """Why this model cannot run as a compiled plan, or None when it can."""
    if type(model) is not CausalLM:
        return f"architecture {type(model).__name__} runs its own Python forward"
    ops = model.ops
    for name in PLAN_OPS:
        if not ops.is_builtin(name):
            return f"op {name} resolves to {ops.chosen[name].source}"
    if model.dtype not in _DTYPES or kv_caches[0].key.dtype not in _CACHE_DTYPES:
        return "activations or KV cache in a dtype the kernels do not take"
    for layer in model.layers:
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            described = _plan_linear(getattr(layer, name), ops, [])
            if isinstance(described, str):
                return f"{name}: {described}"
    return None
