"""Mixture-of-experts decoders: Qwen3-MoE (top-k softmax routing, optional norm_topk_prob, q/k norm), Qwen2-MoE
(the same routing, q/k/v bias, and a shared expert every token runs, scaled by a sigmoid gate) and Mixtral
(top-2 softmax routing, renormalised). Attention is the Llama family's; the feed-forward block is a
router (a dense linear, never quantized) and the `moe` op, which groups the step's rows by expert and runs each
active expert's linears over only its rows (shrike.ops.moe_reference, csrc/moe/). Qwen2-MoE's shared expert is
one more expert of the op, and its gate one more router row: the op weights it by the sigmoid of that logit.
"""
from __future__ import annotations

import dataclasses

import torch

from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.llama import CausalLM, DecoderLayer, LinearFactory
from shrike.model.weights import CheckpointTensors
from shrike.weight_formats import ExpertWeights

MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM", "MixtralForCausalLM")


@dataclasses.dataclass(frozen=True)
class MoeSettings:
    num_experts: int
    top_k: int
    intermediate: int  # of each expert
    normalize: bool  # renormalise the chosen experts' probabilities to sum to 1
    sparse_layers: tuple[bool, ...]  # per layer: a MoE block (else Qwen3-MoE's dense MLP of intermediate_size)
    block: str  # checkpoint name of the block under model.layers.{i}
    expert_names: tuple[str, str, str]  # gate, up, down projection names under experts.{e}
    shared_intermediate: int = 0  # Qwen2-MoE's shared expert (block.shared_expert, gated by block.shared_expert_gate)

    @classmethod
    def of(cls, c: ModelConfig) -> "MoeSettings":
        raw = c.raw
        activation = raw.get("hidden_act", "silu")
        if activation != "silu":
            raise ConfigError(f"{c.architecture} with hidden_act {activation!r} is not supported; supported: silu")
        if raw.get("sliding_window") and raw.get("use_sliding_window", c.architecture == "MixtralForCausalLM"):
            raise ConfigError(f"{c.architecture} with sliding-window attention is not supported; "
                              "set sliding_window to null in config.json")
        num_experts = raw.get("num_experts") or raw.get("num_local_experts")
        top_k = raw.get("num_experts_per_tok")
        if not num_experts or not top_k or not 1 <= top_k <= num_experts:
            raise ConfigError(f"{c.architecture} needs num_experts (or num_local_experts) and num_experts_per_tok "
                              "between 1 and it in config.json")
        if c.architecture == "MixtralForCausalLM":
            return cls(num_experts, top_k, c.intermediate_size, True, (True,) * c.num_layers, "block_sparse_moe",
                       ("w1", "w3", "w2"))
        step, dense = int(raw.get("decoder_sparse_step", 1)), set(raw.get("mlp_only_layers") or [])
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(c.num_layers))
        shared = int(raw.get("shared_expert_intermediate_size") or 0) if c.architecture == "Qwen2MoeForCausalLM" else 0
        return cls(num_experts, top_k, int(raw.get("moe_intermediate_size") or c.intermediate_size),
                   bool(raw.get("norm_topk_prob", False)), sparse, "mlp", ("gate_proj", "up_proj", "down_proj"), shared)


class SparseMoeBlock:
    """Router, then the experts: x (T, hidden) -> (T, hidden)."""

    def __init__(self, c: ModelConfig, s: MoeSettings, tensors: CheckpointTensors, prefix: str, dtype: torch.dtype,
                 make_linear: LinearFactory, ops):
        from shrike.layers.linear import DenseLinear

        # The router stays dense: its logits pick experts, and a quantized router would change the choice. A shared
        # expert's gate (1, hidden) is its last row: the op takes that logit as the shared expert's gate.
        router = tensors.get(f"{prefix}.gate.weight", (s.num_experts, c.hidden_size), dtype)
        if s.shared_intermediate:
            router = torch.cat([router, tensors.get(f"{prefix}.shared_expert_gate.weight", (1, c.hidden_size), dtype)])
        self.router = DenseLinear(router, None, ops.dense_linear)
        gate, up, down = s.expert_names
        gate_up, down_layers = [], []
        experts = [(f"{prefix}.experts.{e}", s.intermediate) for e in range(s.num_experts)]
        if s.shared_intermediate:
            experts.append((f"{prefix}.shared_expert", s.shared_intermediate))
        for p, inter in experts:
            gate_up.append(make_linear(tensors, [f"{p}.{gate}", f"{p}.{up}"], c.hidden_size, [inter, inter], False))
            down_layers.append(make_linear(tensors, [f"{p}.{down}"], inter, [c.hidden_size], False))
        formats = {layer.op_name for layer in gate_up + down_layers}
        if len(formats) != 1:
            raise ConfigError(f"the experts of {prefix} are not all in one weight format ({', '.join(sorted(formats))}); "
                              "quantize every expert alike")
        self.experts = ExpertWeights(formats.pop(), [layer.weight for layer in gate_up],
                                     [layer.weight for layer in down_layers], s.intermediate, s.shared_intermediate)
        self.top_k, self.normalize, self.hidden = s.top_k, s.normalize, c.hidden_size

    def __call__(self, step, x, rows):
        logits = step.empty(rows, len(self.experts.down), dtype=torch.float32)  # (T, experts [+ shared gate])
        step.ops.dense_linear(x, self.router.weight, None, logits)
        out = step.empty(rows, self.hidden, dtype=x.dtype)  # (T, hidden)
        step.ops.moe(x, logits, self.experts, out, self.top_k, self.normalize)
        return out


class DenseMlp:
    """Qwen3-MoE's dense layers (mlp_only_layers, decoder_sparse_step): gate_up, silu * up, down."""

    def __init__(self, c: ModelConfig, tensors: CheckpointTensors, prefix: str, make_linear: LinearFactory):
        self.gate_up = make_linear(tensors, [f"{prefix}.gate_proj", f"{prefix}.up_proj"], c.hidden_size,
                                   [c.intermediate_size, c.intermediate_size], False)
        self.down = make_linear(tensors, [f"{prefix}.down_proj"], c.intermediate_size, [c.hidden_size], False)
        self.intermediate = c.intermediate_size

    def __call__(self, step, x, rows):
        gate_up = self.gate_up(step, x, rows)  # (T, 2 * intermediate)
        act = step.empty(rows, self.intermediate, dtype=gate_up.dtype)
        step.ops.silu_mul(gate_up, act)
        return self.down(step, act, rows)


class MoeDecoderLayer(DecoderLayer):
    """The Llama decoder layer's attention block, then a sparse MoE block (or a dense MLP)."""

    def __init__(self, c: ModelConfig, s: MoeSettings, tensors: CheckpointTensors, index: int, dtype: torch.dtype,
                 make_linear: LinearFactory, ops):
        self._load_attention(c, tensors, index, dtype, make_linear)
        p = f"model.layers.{index}"
        self.mlp = SparseMoeBlock(c, s, tensors, f"{p}.{s.block}", dtype, make_linear, ops) if s.sparse_layers[index] \
            else DenseMlp(c, tensors, f"{p}.mlp", make_linear)

    def __call__(self, step, delta, residual, cos, sin, cache: KVCache):
        """As shrike.model.llama.DecoderLayer: residual (T, hidden) updated in place with `delta` first;
        returns this layer's output, not yet added."""
        T = step.tokens
        x = self.input_norm(step, residual, T) if delta is None else self.input_norm.add_and_norm(step, delta, residual, T)
        attn = self.attention(step, x, cos, sin, cache)
        return self.mlp(step, self.post_attention_norm.add_and_norm(step, attn, residual, T), T)


class MoeCausalLM(CausalLM):
    """The Llama family's embedding, final norm, lm_head and forward over MoE decoder layers."""

    def __init__(self, config: ModelConfig, tensors: CheckpointTensors, dtype: torch.dtype,
                 make_linear: LinearFactory | None = None, max_positions: int | None = None, progress=None, ops=None):
        from shrike.model.llama import dense_linear_factory
        from shrike.ops import builtin_op_table

        qwen2 = config.architecture == "Qwen2MoeForCausalLM"
        c = dataclasses.replace(config, qk_norm=config.architecture == "Qwen3MoeForCausalLM",
                                attention_bias=config.attention_bias or (qwen2 and config.raw.get("qkv_bias", True)))
        settings = MoeSettings.of(c)
        ops = ops or builtin_op_table()
        # CausalLM builds everything but the layers (none with num_layers 0); the layers are built here.
        super().__init__(dataclasses.replace(c, num_layers=0), tensors, dtype, make_linear, max_positions, None, ops)
        self.config, self.moe = c, settings
        make_linear = make_linear or dense_linear_factory(dtype, ops)
        for i in range(c.num_layers):
            self.layers.append(MoeDecoderLayer(c, settings, tensors, i, dtype, make_linear, ops))
            if progress:
                progress(i + 1)


def quantizable_linears(config: ModelConfig) -> list[str]:
    """Prefixes of every linear a quantizer targets: attention, each expert's projections and Qwen3-MoE's dense
    MLPs; never the routers (they are what compressed-tensors' `ignore` lists as `router_ignore`)."""
    s = MoeSettings.of(config)
    attention = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
    prefixes = []
    for i, sparse in enumerate(s.sparse_layers):
        p = f"model.layers.{i}"
        prefixes += [f"{p}.{name}" for name in attention]
        if sparse:
            prefixes += [f"{p}.{s.block}.experts.{e}.{name}" for e in range(s.num_experts) for name in s.expert_names]
            if s.shared_intermediate:
                prefixes += [f"{p}.{s.block}.shared_expert.{name}" for name in s.expert_names]
        else:
            prefixes += [f"{p}.mlp.{name}" for name in ("gate_proj", "up_proj", "down_proj")]
    return prefixes


def router_ignore(config: ModelConfig) -> str:
    """The compressed-tensors `ignore` entry that keeps the routers (and Qwen2-MoE's shared expert gates) dense,
    as llm-compressor writes it."""
    s = MoeSettings.of(config)
    return f"re:.*{s.block}.(gate|shared_expert_gate)$" if s.shared_intermediate else f"re:.*{s.block}.gate$"


def register_architectures(registry) -> None:
    for name in MOE_ARCHITECTURES:
        registry.register_architecture(name, MoeCausalLM)
