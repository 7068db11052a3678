"""Gemma 3 text models (Gemma3ForCausalLM), on the eager path through the op table.

Against the Llama decoder: RMSNorm scales by (1 + weight); four norms per layer (the attention
and MLP outputs are normed before they join the residual); q/k RMSNorm; GeGLU (tanh GELU);
sliding-window layers interleaved with global ones, each kind with its own RoPE base; the
attention scale from query_pre_attn_scalar; embeddings times sqrt(hidden); optional final
logit soft-capping. The compiled plan (csrc/plan) does not implement these, so the model runner
runs this class eagerly (shrike.model.compiled.plan_blocker).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shrike.engine.batch import BatchContext
from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.layers.linear import weight_for_op
from shrike.layers.norm import RMSNorm
from shrike.layers.rotary import RotaryEmbedding
from shrike.model.config import ModelConfig
from shrike.model.llama import LinearFactory, dense_linear_factory
from shrike.model.weights import CheckpointTensors


def gemma_norm(tensors: CheckpointTensors, name: str, dim: int, eps: float, dtype: torch.dtype, ops) -> RMSNorm:
    """Gemma's RMSNorm multiplies by (1 + weight): the offset is added once here, in float32."""
    return RMSNorm((tensors.get(name, (dim,), torch.float32) + 1.0).to(dtype), eps, ops)


class Gemma3DecoderLayer:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                 make_linear: LinearFactory, ops):
        c = config
        p, attn, mlp = f"model.layers.{index}", f"model.layers.{index}.self_attn", f"model.layers.{index}.mlp"

        def norm(name: str, dim: int = c.hidden_size) -> RMSNorm:
            return gemma_norm(tensors, name, dim, c.rms_norm_eps, dtype, ops)

        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.config, self.ops, self.q_size, self.kv_size = c, ops, q_size, kv_size
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

    def __call__(self, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                 ctx: BatchContext) -> None:
        """residual: (T, hidden), updated in place by the attention and the MLP branch."""
        c, ops = self.config, self.ops
        tokens = residual.shape[0]
        qkv = self.qkv_proj(self.input_norm(residual))  # (T, q_size + 2 * kv_size)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(tokens, c.num_heads, c.head_dim))
        k = self.k_norm(k.reshape(tokens, c.num_kv_heads, c.head_dim))
        qkv = torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v), dim=-1)
        q = torch.empty(tokens, c.num_heads, c.head_dim, dtype=qkv.dtype)
        ops.rope_write_kv(qkv, cos, sin, ctx.slot_mapping, q, cache.key, cache.value)
        out = torch.empty_like(q)
        block_tables, query_start, context_lens = ctx.kernel_args
        # The window goes only to sliding layers, so an op without the parameter still runs global ones.
        window = {"sliding_window": self.sliding_window} if self.sliding_window else {}
        ops.paged_attention(q, cache.key, cache.value, block_tables, query_start, context_lens, ctx.block_size,
                            c.query_scale, out, **window)
        residual += self.post_attention_norm(self.o_proj(out.reshape(tokens, self.q_size)))
        gate, up = self.gate_up_proj(self.pre_feedforward_norm(residual)).chunk(2, dim=-1)  # (T, intermediate) each
        residual += self.post_feedforward_norm(self.down_proj(F.gelu(gate, approximate="tanh") * up))


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
        self.embed_tokens = tensors.get("model.embed_tokens.weight", (c.vocab_size, c.hidden_size), dtype)
        # transformers rounds sqrt(hidden) to the weights' dtype before multiplying; so do we.
        self.embed_scale = float(torch.tensor(math.sqrt(c.hidden_size), dtype=dtype))
        self.layers = []
        for i in range(c.num_layers):
            self.layers.append(Gemma3DecoderLayer(c, tensors, i, dtype, make_linear, ops))
            if progress:
                progress(i + 1)
        self.norm = gemma_norm(tensors, "model.norm.weight", c.hidden_size, c.rms_norm_eps, dtype, ops)
        if c.tie_word_embeddings or "lm_head.weight" not in tensors:
            lm_head = self.embed_tokens  # (vocab, hidden)
        else:
            lm_head = tensors.get("lm_head.weight", (c.vocab_size, c.hidden_size), dtype)
        self.lm_head = weight_for_op(lm_head, ops.dense_linear)  # as in llama.CausalLM
        self.lm_head_int8 = None  # set by the loader with --lm-head-quant int8
        positions = max_positions or c.max_position_embeddings
        self.rotary = RotaryEmbedding(c, positions)  # global layers; the runner reads its long_threshold
        local = dataclasses.replace(c, rope_theta=c.rope_local_theta, rope_scaling=None)
        self.local_rotary = RotaryEmbedding(local, positions)

    def forward(self, input_ids: torch.Tensor, ctx: BatchContext, kv_caches: list[KVCache],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """input_ids: (T,) int64; logits_indices: (L,) rows of T that need logits -> (L, vocab) fp32."""
        c = self.config
        residual = torch.empty(input_ids.shape[0], c.hidden_size, dtype=self.dtype)  # (T, hidden)
        self.ops.embedding(input_ids, self.embed_tokens, residual, self.embed_scale)
        global_cos_sin = self.rotary.cos_sin_for(ctx.positions, None)
        local_cos_sin = self.local_rotary.cos_sin_for(ctx.positions, None)
        for layer, cache in zip(self.layers, kv_caches):
            cos, sin = local_cos_sin if layer.sliding_window else global_cos_sin
            layer(residual, cos, sin, cache, ctx)
        return self.compute_logits(self.norm(residual[logits_indices]))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (L, hidden), normed -> (L, vocab) fp32, soft-capped when the config asks."""
        if self.lm_head_int8 is not None:
            logits = self.lm_head_int8(hidden)
        else:
            logits = torch.empty(hidden.shape[0], self.config.vocab_size, dtype=torch.float32)
            self.ops.dense_linear(hidden.contiguous(), self.lm_head, None, logits)
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits


def register_architectures(registry) -> None:
    registry.register_architecture("Gemma3ForCausalLM", Gemma3ForCausalLM)
