"""The Llama family: Llama (incl. MiniCPM5), MiniCPM, Qwen2 and Qwen3 share one decoder.

Differences are switches on ModelConfig: q/k/v bias (Qwen2), q/k RMSNorm (Qwen3), and
MiniCPM's embedding, residual-branch and logit scalings.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from shrike.engine.batch import BatchContext
from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.layers.linear import DenseLinear, weight_for_op
from shrike.layers.norm import RMSNorm
from shrike.layers.rotary import RotaryEmbedding
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors

LLAMA_FAMILY = ("LlamaForCausalLM", "MiniCPMForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

# Builds a linear layer from checkpoint prefixes fused along the output dimension:
# (tensors, prefixes, in_features, out_features per prefix, has_bias) -> layer
LinearFactory = Callable[[CheckpointTensors, list[str], int, list[int], bool], Callable[[torch.Tensor], torch.Tensor]]


def dense_linear_factory(dtype: torch.dtype, ops) -> LinearFactory:
    def make(tensors, prefixes, in_features, out_features, bias):
        return DenseLinear.load(tensors, prefixes, in_features, out_features, bias, dtype, ops.dense_linear)
    return make


class DecoderLayer:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                 make_linear: LinearFactory, ops):
        c = config

        def norm(name: str, dim: int) -> RMSNorm:
            return RMSNorm(tensors.get(name, (dim,), dtype), c.rms_norm_eps, ops)

        p = f"model.layers.{index}"
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.config = c
        self.input_norm = norm(f"{p}.input_layernorm.weight", c.hidden_size)
        self.post_attention_norm = norm(f"{p}.post_attention_layernorm.weight", c.hidden_size)
        attn = f"{p}.self_attn"
        self.qkv_proj = make_linear(tensors, [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"],
                                    c.hidden_size, [q_size, kv_size, kv_size], c.attention_bias)
        self.o_proj = make_linear(tensors, [f"{attn}.o_proj"], q_size, [c.hidden_size], c.o_proj_bias)
        if c.qk_norm:
            self.q_norm = norm(f"{attn}.q_norm.weight", c.head_dim)
            self.k_norm = norm(f"{attn}.k_norm.weight", c.head_dim)
        mlp = f"{p}.mlp"
        self.gate_up_proj = make_linear(tensors, [f"{mlp}.gate_proj", f"{mlp}.up_proj"], c.hidden_size,
                                        [c.intermediate_size, c.intermediate_size], c.mlp_bias)
        self.down_proj = make_linear(tensors, [f"{mlp}.down_proj"], c.intermediate_size, [c.hidden_size], c.mlp_bias)
        self.q_size, self.kv_size = q_size, kv_size
        self.scale = c.head_dim ** -0.5
        self.ops = ops

    def __call__(self, delta: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cache: KVCache, ctx: BatchContext) -> torch.Tensor:
        """residual: (T, hidden) stream, updated in place; delta: the previous layer's output to add
        to it first (None for the first layer). Returns this layer's output, not yet added."""
        c, ops = self.config, self.ops
        tokens = residual.shape[0]
        x = self.input_norm(residual) if delta is None else self.input_norm.add_and_norm(delta, residual)
        qkv = self.qkv_proj(x)  # (T, q_size + 2 * kv_size)
        if c.qk_norm:
            qkv = self._norm_qk(qkv)
        q = torch.empty(tokens, c.num_heads, c.head_dim, dtype=qkv.dtype)
        ops.rope_write_kv(qkv, cos, sin, ctx.slot_mapping, q, cache.key, cache.value)
        out = torch.empty_like(q)
        block_tables, query_start, context_lens = ctx.kernel_args
        ops.paged_attention(q, cache.key, cache.value, block_tables, query_start, context_lens, ctx.block_size,
                            self.scale, out)
        attn = self.o_proj(out.reshape(tokens, self.q_size))
        if c.residual_scale != 1.0:
            attn = attn * c.residual_scale
        gate_up = self.gate_up_proj(self.post_attention_norm.add_and_norm(attn, residual))  # (T, 2 * intermediate)
        act = torch.empty(tokens, c.intermediate_size, dtype=gate_up.dtype)
        ops.silu_mul(gate_up, act)
        out = self.down_proj(act)
        return out * c.residual_scale if c.residual_scale != 1.0 else out

    def _norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen3: q and k are RMS-normalised per head before RoPE; v passes unchanged."""
        c = self.config
        tokens = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(tokens, c.num_heads, c.head_dim))
        k = self.k_norm(k.reshape(tokens, c.num_kv_heads, c.head_dim))
        return torch.cat((q.reshape(tokens, -1), k.reshape(tokens, -1), v), dim=-1)


class CausalLM:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, dtype: torch.dtype,
                 make_linear: LinearFactory | None = None, max_positions: int | None = None,
                 progress: Callable[[int], None] | None = None, ops=None):
        """ops: the op table resolved at load (shrike.registry.OpTable); default Shrike's built-ins."""
        from shrike.ops import builtin_op_table

        c = config
        ops = ops or builtin_op_table()
        make_linear = make_linear or dense_linear_factory(dtype, ops)
        self.config, self.dtype, self.ops = c, dtype, ops
        self.embed_tokens = tensors.get("model.embed_tokens.weight", (c.vocab_size, c.hidden_size), dtype)
        self.layers = []
        for i in range(c.num_layers):
            self.layers.append(DecoderLayer(c, tensors, i, dtype, make_linear, ops))
            if progress:
                progress(i + 1)
        self.norm = RMSNorm(tensors.get("model.norm.weight", (c.hidden_size,), dtype), c.rms_norm_eps, ops)
        if c.tie_word_embeddings:
            lm_head = self.embed_tokens  # (vocab, hidden)
        elif "lm_head.weight" in tensors:
            lm_head = tensors.get("lm_head.weight", (c.vocab_size, c.hidden_size), dtype)
        else:
            raise ConfigError("checkpoint has no lm_head.weight and config.json says tie_word_embeddings is false")
        # (vocab, hidden) on the dense_linear op, or its AMX tiles: then a tied head is a second copy of the
        # embedding (which the embedding op reads by rows), vocab * hidden * 2 bytes more.
        self.lm_head = weight_for_op(lm_head, ops.dense_linear)
        self.lm_head_int8 = None  # an Int8LMHead set by the loader with --lm-head-quant int8, used instead
        self.rotary = RotaryEmbedding(c, max_positions or c.max_position_embeddings)

    def forward(self, input_ids: torch.Tensor, ctx: BatchContext, kv_caches: list[KVCache],
                logits_indices: torch.Tensor) -> torch.Tensor:
        """input_ids: (T,) int64; logits_indices: (L,) rows of T that need logits -> (L, vocab) fp32."""
        c = self.config
        residual = torch.empty(input_ids.shape[0], c.hidden_size, dtype=self.dtype)  # (T, hidden)
        self.ops.embedding(input_ids, self.embed_tokens, residual, c.scale_emb)
        cos, sin = self.rotary.cos_sin_for(ctx.positions, ctx.use_long_rope)
        delta = None
        for layer, cache in zip(self.layers, kv_caches):
            delta = layer(delta, residual, cos, sin, cache, ctx)
        hidden = self.norm.add_and_norm(delta[logits_indices], residual[logits_indices])
        if c.logit_divisor != 1.0:
            hidden = hidden / c.logit_divisor
        return self.compute_logits(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (L, hidden), normed -> (L, vocab) fp32."""
        if self.lm_head_int8 is not None:
            return self.lm_head_int8(hidden)
        logits = torch.empty(hidden.shape[0], self.config.vocab_size, dtype=torch.float32)
        self.ops.dense_linear(hidden.contiguous(), self.lm_head, None, logits)
        return logits


def register_architectures(registry) -> None:
    for name in LLAMA_FAMILY:
        registry.register_architecture(name, CausalLM)
