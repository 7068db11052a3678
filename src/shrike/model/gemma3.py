"""Gemma 3 text models (Gemma3ForCausalLM).

Against the Llama decoder: RMSNorm scales by (1 + weight); four norms per layer (the attention
and MLP outputs are normed before they join the residual); q/k RMSNorm; GeGLU (tanh GELU);
sliding-window layers interleaved with global ones, each kind with its own RoPE base; the
attention scale from query_pre_attn_scalar; embeddings times sqrt(hidden); optional final
logit soft-capping. Like every model, it runs on the op executor (shrike.executor).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.layers.norm import RMSNorm
from shrike.layers.rotary import RotaryEmbedding
from shrike.model.config import ModelConfig
from shrike.model.llama import LinearFactory, dense_linear_factory, embedding_and_head
from shrike.model.weights import CheckpointTensors


def gemma_norm(tensors: CheckpointTensors, name: str, dim: int, eps: float, dtype: torch.dtype) -> RMSNorm:
    """Gemma's RMSNorm multiplies by (1 + weight): the offset is added once here, in float32."""
    return RMSNorm((tensors.get(name, (dim,), torch.float32) + 1.0).to(dtype), eps)


class Gemma3DecoderLayer:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                 make_linear: LinearFactory):
        c = config
        p, attn, mlp = f"model.layers.{index}", f"model.layers.{index}.self_attn", f"model.layers.{index}.mlp"

        def norm(name: str, dim: int = c.hidden_size) -> RMSNorm:
            return gemma_norm(tensors, name, dim, c.rms_norm_eps, dtype)

        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.config, self.q_size, self.kv_size = c, q_size, kv_size
        self.input_norm = norm(f"{p}.input_layernorm.weight")
        self.post_attention_norm = norm(f"{p}.post_attention_layernorm.weight")
        self.pre_feedforward_norm = norm(f"{p}.pre_feedforward_layernorm.weight")
        self.post_feedforward_norm = norm(f"{p}.post_feedforward_layernorm.weight")
        self.q_norm = norm(f"{attn}.q_norm.weight", c.head_dim)
        self.k_norm = norm(f"{attn}.k_norm.weight", c.head_dim)
        self.qkv_proj = make_linear(tensors, [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"],
                                    c.hidden_size, [q_size, kv_size, kv_size], c.attention_bias)
        self.o_proj = make_linear(tensors, [f"{attn}.o_proj"], q_size, [c.hidden_size], False)
        self.gate_up_proj = make_linear(tensors, [f"{mlp}.gate_proj", f"{mlp}.up_proj"], c.hidden_size,
                                        [c.intermediate_size, c.intermediate_size], False)
        self.down_proj = make_linear(tensors, [f"{mlp}.down_proj"], c.intermediate_size, [c.hidden_size], False)
        self.sliding_window = c.sliding_window if c.layer_types[index] == "sliding_attention" else 0

    def __call__(self, step, delta, residual, cos, sin, cache: KVCache):
        """residual: (T, hidden) stream, updated in place; delta: the previous layer's normed MLP output to
        add to it first (None for the first layer). Returns this layer's normed MLP output, not yet added."""
        c, ops, T = self.config, step.ops, step.tokens
        x = self.input_norm(step, residual, T) if delta is None else self.input_norm.add_and_norm(step, delta, residual, T)
        qkv = self.qkv_proj(step, x, T)  # (T, q_size + 2 * kv_size)
        normed = step.empty(T, self.q_size + 2 * self.kv_size, dtype=qkv.dtype)
        ops.head_rmsnorm(qkv, self.q_norm.weight, self.k_norm.weight, normed, c.num_heads, c.num_kv_heads,
                         c.rms_norm_eps)
        q = step.empty(T, c.num_heads, c.head_dim, dtype=qkv.dtype)
        ops.rope_write_kv(normed, cos, sin, step.slot_mapping, q, cache.key, cache.value)
        out = step.empty(T, c.num_heads, c.head_dim, dtype=qkv.dtype)
        # The window goes only to sliding layers, so an op without the parameter still runs global ones.
        window = {"sliding_window": self.sliding_window} if self.sliding_window else {}
        ops.paged_attention(q, cache.key, cache.value, *step.attention, step.block_size, c.query_scale, out, **window)
        attn = self.post_attention_norm(step, self.o_proj(step, out.view(T, self.q_size), T), T)
        gate_up = self.gate_up_proj(step, self.pre_feedforward_norm.add_and_norm(step, attn, residual, T), T)
        act = step.empty(T, c.intermediate_size, dtype=gate_up.dtype)
        ops.gelu_tanh_mul(gate_up, act)
        return self.post_feedforward_norm(step, self.down_proj(step, act, T), T)


class Gemma3ForCausalLM:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, dtype: torch.dtype,
                 make_linear: LinearFactory | None = None, max_positions: int | None = None,
                 progress: Callable[[int], None] | None = None, ops=None):
        from shrike.ops import builtin_op_table

        c = config
        if c.layer_types is None:
            raise ConfigError(f"{c.architecture} is not a Gemma 3 config")
        ops = ops or builtin_op_table()
        make_linear = make_linear or dense_linear_factory(dtype, ops)
        self.config, self.dtype, self.ops = c, dtype, ops
        tied = c.tie_word_embeddings or "lm_head.weight" not in tensors
        self.embed_tokens, self.lm_head = embedding_and_head(c, tensors, dtype, ops, make_linear, tied)
        # transformers rounds sqrt(hidden) to the weights' dtype before multiplying; so do we.
        self.embed_scale = float(torch.tensor(math.sqrt(c.hidden_size), dtype=dtype))
        self.layers = []
        for i in range(c.num_layers):
            self.layers.append(Gemma3DecoderLayer(c, tensors, i, dtype, make_linear))
            if progress:
                progress(i + 1)
        self.norm = gemma_norm(tensors, "model.norm.weight", c.hidden_size, c.rms_norm_eps, dtype)
        positions = max_positions or c.max_position_embeddings
        self.rotary = RotaryEmbedding(c, positions)  # global layers; the runner reads its long_threshold
        local = dataclasses.replace(c, rope_theta=c.rope_local_theta, rope_scaling=None)
        self.local_rotary = RotaryEmbedding(local, positions)

    def forward(self, step, kv_caches: list[KVCache], output: str = "logits"):
        """One step (shrike.executor.step) -> (step.logits, vocab) fp32 logits, soft-capped when the config asks;
        output="hidden": the final normed hidden states (step.logits, hidden) instead (embeddings)."""
        c, T = self.config, step.tokens
        residual = step.empty(T, c.hidden_size, dtype=self.dtype)  # (T, hidden)
        step.ops.embedding(step.token_ids, self.embed_tokens, residual, self.embed_scale)
        global_cos_sin, local_cos_sin = step.rope(self.rotary), step.rope(self.local_rotary)
        delta = None
        for layer, cache in zip(self.layers, kv_caches):
            cos, sin = local_cos_sin if layer.sliding_window else global_cos_sin
            delta = layer(step, delta, residual, cos, sin, cache)
        hidden = self.norm.add_and_norm(step, step.take_logits_rows(delta), step.take_logits_rows(residual), step.logits)
        if output == "hidden":
            return hidden
        logits = self.lm_head(step, hidden)
        if c.final_logit_softcapping:
            step.ops.softcap(logits, c.final_logit_softcapping)
        return logits


def register_architectures(registry) -> None:
    registry.register_architecture("Gemma3ForCausalLM", Gemma3ForCausalLM)
