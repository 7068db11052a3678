"""config.json and per-expert tensors for mixture-of-experts GGUF files: `qwen3moe` (Qwen3MoeForCausalLM) and
`llama` files with experts (Mixtral, MixtralForCausalLM).

llama.cpp stores each MoE layer's experts merged: ffn_gate_exps / ffn_up_exps (GGUF shape [hidden, I, E],
(E, I, hidden) here) and ffn_down_exps ((E, hidden, I) here); the router is ffn_gate_inp ((E, hidden)). They
are split back into Hugging Face's per-expert tensors. Llama files have their q/k rows permuted for llama.cpp's
RoPE (undone here); Qwen's are in Hugging Face order. llama.cpp renormalises the top-k weights of both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import Keys, ReaderTensor

from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.llama_config import llama_config
from shrike.convert.llama_weights import LAYER_NAMES, TensorConverter, attention_shapes, hf_tensor_name

_MERGED_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@dataclass(frozen=True)
class _Layout:
    model: str  # for messages
    block: str  # the MoE block under model.layers.{i}
    expert_names: tuple[str, str, str]  # gate, up, down under experts.{e}
    qk_norm: bool
    permuted_qk: bool


_QWEN3MOE = _Layout("a Qwen3-MoE model", "mlp", ("gate_proj", "up_proj", "down_proj"), True, False)
_MIXTRAL = _Layout("a Mixtral model", "block_sparse_moe", ("w1", "w3", "w2"), False, True)


def is_moe(meta: GGUFMetadata) -> bool:
    return meta.arch_key(Keys.LLM.EXPERT_COUNT) in meta


def qwen3moe_config(meta: GGUFMetadata, vocab_size: int, has_output_weight: bool) -> dict:
    config = llama_config(meta, vocab_size, has_output_weight)  # the same attention and norm metadata keys
    key = meta.arch_key
    config.update({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "num_experts": meta.require(key(Keys.LLM.EXPERT_COUNT)),
        "num_experts_per_tok": meta.require(key(Keys.LLM.EXPERT_USED_COUNT)),
        "moe_intermediate_size": meta.require(key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)),
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    })
    return config


def mixtral_config(meta: GGUFMetadata, vocab_size: int, has_output_weight: bool) -> dict:
    config = llama_config(meta, vocab_size, has_output_weight)
    key = meta.arch_key
    config.update({
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "sliding_window": None,
        "num_local_experts": meta.require(key(Keys.LLM.EXPERT_COUNT)),
        "num_experts_per_tok": meta.require(key(Keys.LLM.EXPERT_USED_COUNT)),
        "intermediate_size": meta.get(key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH), config["intermediate_size"]),
    })
    return config


class MoeTensors(TensorConverter):
    def __init__(self, config: dict):
        self.kind = _QWEN3MOE if config["architectures"][0] == "Qwen3MoeForCausalLM" else _MIXTRAL
        self.model = f"{self.kind.model} (experts merged as {', '.join(_MERGED_EXPERTS)})"
        self.layer_names = {**{k: v for k, v in LAYER_NAMES.items() if not k.startswith(("ffn_gate", "ffn_up",
                                                                                              "ffn_down"))},
                            "ffn_gate_inp": f"{self.kind.block}.gate"}
        if self.kind.qk_norm:
            self.layer_names.update({"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"})
        super().__init__(config)

    def layer_shapes(self, config: dict) -> dict[str, tuple[int, ...]]:
        hidden, head_dim = config["hidden_size"], config["head_dim"]
        inter = config.get("moe_intermediate_size") or config["intermediate_size"]
        experts = config.get("num_experts") or config["num_local_experts"]
        block = self.kind.block
        gate, up, down = self.kind.expert_names
        shapes = {
            **attention_shapes(config), f"{block}.gate": (experts, hidden),
            **{f"{block}.experts.{e}.{name}": shape for e in range(experts)
               for name, shape in ((gate, (inter, hidden)), (up, (inter, hidden)), (down, (hidden, inter)))},
        }
        if self.kind.qk_norm:
            shapes.update({"self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,)})
        return shapes

    def names(self, tensor: ReaderTensor) -> list[str]:
        merged = _merged_kind(tensor)
        if merged:  # (E, rows, cols): one tensor per expert; GGUF lists the expert dimension last
            expert_name = self.kind.expert_names[_MERGED_EXPERTS.index(merged)]
            layer = tensor.name.split(".")[1]
            names = [f"model.layers.{layer}.{self.kind.block}.experts.{e}.{expert_name}.weight"
                     for e in range(int(tensor.shape[-1]))]
        else:
            names = [hf_tensor_name(tensor.name, self.layer_names, self.model)]
        if any(name not in self.shapes for name in names):
            raise ValueError(f"GGUF tensor {tensor.name!r} does not fit the model described by the file's metadata")
        return names

    def layout(self, tensor: ReaderTensor, weight: np.ndarray) -> dict[str, np.ndarray]:
        if _merged_kind(tensor):
            return dict(zip(self.names(tensor), weight))
        if self.kind.permuted_qk:
            return super().layout(tensor, weight)
        return {self.names(tensor)[0]: weight}


def _merged_kind(tensor: ReaderTensor) -> str | None:
    """ffn_gate_exps, ffn_up_exps or ffn_down_exps for a layer's merged experts, else None."""
    parts = tensor.name.split(".")
    return parts[2] if len(parts) == 4 and parts[0] == "blk" and parts[2] in _MERGED_EXPERTS else None
