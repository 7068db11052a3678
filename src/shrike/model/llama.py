"""The Llama family: Llama (incl. MiniCPM5), MiniCPM, Qwen2 and Qwen3 share one decoder.

Differences are switches on ModelConfig: q/k/v bias (Qwen2), q/k RMSNorm (Qwen3), and
MiniCPM's embedding, residual-branch and logit scalings.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.layers.linear import DenseLinear
from shrike.ops import weight_for_op
from shrike.layers.lm_head import LMHead
from shrike.layers.norm import RMSNorm
from shrike.layers.rotary import RotaryEmbedding
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors

LLAMA_FAMILY = ("LlamaForCausalLM", "MiniCPMForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

# Builds a linear layer from checkpoint prefixes fused along the output dimension:
# (tensors, prefixes, in_features, out_features per prefix, has_bias) -> layer
LinearFactory = Callable[[CheckpointTensors, list[str], int, list[int], bool], Callable[[torch.Tensor], torch.Tensor]]


def embedding_and_head(c: ModelConfig, tensors: CheckpointTensors, dtype: torch.dtype, ops, make_linear: LinearFactory,
                       tied: bool) -> tuple[object, LMHead]:
    """The embedding table (vocab, hidden) and the lm_head (the table itself when tied). A factory that holds them
    in another form builds both (GGUFLinearFactory.embedding_and_head: from a GGUF file's blocks, never converted)."""
    build = getattr(make_linear, "embedding_and_head", None)
    if build is not None:
        return build(tensors, c, dtype, tied)
    shape = (c.vocab_size, c.hidden_size)
    table = tensors.get("model.embed_tokens.weight", shape, dtype)
    head = table if tied else tensors.get("lm_head.weight", shape, dtype)
    # (vocab, hidden) on the dense_linear op, or its AMX tiles: then a tied head is a second copy of the
    # embedding (which the embedding op reads by rows), vocab * hidden * 2 bytes more.
    return table, LMHead(weight_for_op(head, ops.dense_linear), c.vocab_size)


def dense_linear_factory(dtype: torch.dtype, ops) -> LinearFactory:
    def make(tensors, prefixes, in_features, out_features, bias):
        return DenseLinear.load(tensors, prefixes, in_features, out_features, bias, dtype, ops.dense_linear)
    return make


class DecoderLayer:
    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                 make_linear: LinearFactory):
        c = config
        self._load_attention(c, tensors, index, dtype, make_linear)
        mlp = f"model.layers.{index}.mlp"
        self.gate_up_proj = make_linear(tensors, [f"{mlp}.gate_proj", f"{mlp}.up_proj"], c.hidden_size,
                                        [c.intermediate_size, c.intermediate_size], c.mlp_bias)
        self.down_proj = make_linear(tensors, [f"{mlp}.down_proj"], c.intermediate_size, [c.hidden_size], c.mlp_bias)

    def _load_attention(self, c: ModelConfig, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                        make_linear: LinearFactory) -> None:
        """The norms around the attention block and its projections (shared with the MoE decoder layer)."""
        def norm(name: str, dim: int) -> RMSNorm:
            return RMSNorm(tensors.get(name, (dim,), dtype), c.rms_norm_eps)

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
        self.q_size, self.kv_size = q_size, kv_size
        self.scale = c.head_dim ** -0.5

    def attention(self, step, x, cos, sin, cache: KVCache):
        """x (T, hidden), normed -> the attention block's output (T, hidden), K/V of the new tokens cached."""
        c, ops, T = self.config, step.ops, step.tokens
        qkv = self.qkv_proj(step, x, T)  # (T, q_size + 2 * kv_size)
        if c.qk_norm:  # Qwen3: q and k RMS-normalised per head before RoPE; v passes unchanged
            normed = step.empty(T, self.q_size + 2 * self.kv_size, dtype=qkv.dtype)
            ops.head_rmsnorm(qkv, self.q_norm.weight, self.k_norm.weight, normed, c.num_heads, c.num_kv_heads,
                             c.rms_norm_eps)
            qkv = normed
        q = step.empty(T, c.num_heads, c.head_dim, dtype=qkv.dtype)
        ops.rope_write_kv(qkv, cos, sin, step.slot_mapping, q, cache.key, cache.value)
        out = step.empty(T, c.num_heads, c.head_dim, dtype=qkv.dtype)
        ops.paged_attention(q, cache.key, cache.value, *step.attention, step.block_size, self.scale, out)
        return self.o_proj(step, out.view(T, self.q_size), T)

    def __call__(self, step, delta, residual, cos, sin, cache: KVCache):
        """residual: (T, hidden) stream, updated in place; delta: the previous layer's output to add
        to it first (None for the first layer). Returns this layer's output, not yet added."""
        c, ops, T = self.config, step.ops, step.tokens
        x = self.input_norm(step, residual, T) if delta is None else self.input_norm.add_and_norm(step, delta, residual, T)
        attn = self.attention(step, x, cos, sin, cache)
        if c.residual_scale != 1.0:
            ops.mul_scalar(attn, c.residual_scale)
        gate_up = self.gate_up_proj(step, self.post_attention_norm.add_and_norm(step, attn, residual, T), T)
        act = step.empty(T, c.intermediate_size, dtype=gate_up.dtype)
        ops.silu_mul(gate_up, act)
        out = self.down_proj(step, act, T)
        if c.residual_scale != 1.0:
            ops.mul_scalar(out, c.residual_scale)
        return out


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
        if not c.tie_word_embeddings and "lm_head.weight" not in tensors:
            raise ConfigError("checkpoint has no lm_head.weight and config.json says tie_word_embeddings is false")
        self.embed_tokens, self.lm_head = embedding_and_head(c, tensors, dtype, ops, make_linear, c.tie_word_embeddings)
        self.layers = []
        for i in range(c.num_layers):
            self.layers.append(DecoderLayer(c, tensors, i, dtype, make_linear))
            if progress:
                progress(i + 1)
        self.norm = RMSNorm(tensors.get("model.norm.weight", (c.hidden_size,), dtype), c.rms_norm_eps)
        self.rotary = RotaryEmbedding(c, max_positions or c.max_position_embeddings)

    def forward(self, step, kv_caches: list[KVCache], output: str = "logits"):
        """One step (shrike.executor.step) -> (step.logits, vocab) fp32 logits of the rows that need them, or with
        output="hidden" their final normed hidden states (step.logits, hidden) in the model's dtype (embeddings)."""
        c, T = self.config, step.tokens
        residual = step.empty(T, c.hidden_size, dtype=self.dtype)  # (T, hidden)
        step.ops.embedding(step.token_ids, self.embed_tokens, residual, c.scale_emb)
        cos, sin = step.rope(self.rotary)
        delta = None
        for layer, cache in zip(self.layers, kv_caches):
            delta = layer(step, delta, residual, cos, sin, cache)
        hidden = self.norm.add_and_norm(step, step.take_logits_rows(delta), step.take_logits_rows(residual), step.logits)
        if output == "hidden":
            return hidden
        if c.logit_divisor != 1.0:
            step.ops.div_scalar(hidden, c.logit_divisor)
        return self.lm_head(step, hidden)


def register_architectures(registry) -> None:
    for name in LLAMA_FAMILY:
        registry.register_architecture(name, CausalLM)
