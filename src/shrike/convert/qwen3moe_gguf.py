"""config.json and Qwen3MoeForCausalLM tensors for a qwen3moe-architecture GGUF file.

llama.cpp stores each MoE layer's experts merged: ffn_gate_exps / ffn_up_exps (GGUF shape [hidden, I, E],
(E, I, hidden) here) and ffn_down_exps ((E, hidden, I) here); the router is ffn_gate_inp ((E, hidden)). They
are split back into Hugging Face's per-expert tensors. Qwen's q/k rows are stored in Hugging Face order (its
converter permutes only Llama's), and llama.cpp always renormalises Qwen3-MoE's top-k weights (norm_topk_prob).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from gguf import Keys, ReaderTensor

from shrike.convert.gguf_metadata import GGUFMetadata
from shrike.convert.llama_config import llama_config
from shrike.convert.llama_weights import LAYER_NAMES, dequantized, hf_tensor_name

_LAYER_NAMES = {
    **{k: v for k, v in LAYER_NAMES.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))},
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
}
_MERGED_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def qwen3moe_config(meta: GGUFMetadata, vocab_size: int, has_output_weight: bool) -> dict:
    config = llama_config(meta, vocab_size, has_output_weight)  # the same attention and norm metadata keys
    key = meta.arch_key
    config.update({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": meta.require(key(Keys.LLM.EXPERT_COUNT)),
        "num_experts_per_tok": meta.require(key(Keys.LLM.EXPERT_USED_COUNT)),
        "moe_intermediate_size": meta.require(key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)),
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    })
    return config


def _expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter, experts = config["hidden_size"], config["moe_intermediate_size"], config["num_experts"]
    head_dim = config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    per_layer = {
        "input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
        "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
        "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
        "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,), "mlp.gate": (experts, hidden),
        **{f"mlp.experts.{e}.{name}": shape for e in range(experts)
           for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter)))},
    }
    for layer in range(config["num_hidden_layers"]):
        for module, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{module}.weight"] = shape
    return shapes


def _split_experts(tensor: ReaderTensor) -> dict[str, torch.Tensor]:
    """blk.N.ffn_{gate,up,down}_exps.weight -> each expert's Hugging Face tensor."""
    layer, kind = tensor.name.split(".")[1], tensor.name.split(".")[2]
    merged = torch.from_numpy(dequantized(tensor))  # (E, rows, cols)
    return {f"model.layers.{layer}.mlp.experts.{e}.{_MERGED_EXPERTS[kind]}.weight": merged[e].to(torch.bfloat16)
            for e in range(merged.shape[0])}


def convert_qwen3moe_tensors(tensors: Iterable[ReaderTensor], config: dict) -> dict[str, torch.Tensor]:
    shapes = _expected_shapes(config)
    converted: dict[str, torch.Tensor] = {}
    for tensor in tensors:
        parts = tensor.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in _MERGED_EXPERTS:
            pieces = _split_experts(tensor)
        else:
            name = hf_tensor_name(tensor.name, _LAYER_NAMES, "a Qwen3-MoE model (merged experts: "
                                  + ", ".join(_MERGED_EXPERTS) + ")")
            pieces = {name: torch.from_numpy(dequantized(tensor)).to(torch.bfloat16)}
        for name, weight in pieces.items():
            if shapes.get(name) != tuple(weight.shape):
                raise ValueError(f"GGUF tensor {tensor.name!r} does not fit the Qwen3-MoE model described by the file's "
                                 f"metadata ({name}: {list(weight.shape)}, expected {list(shapes.get(name, ()))})")
            converted[name] = weight
    missing = sorted(set(shapes) - set(converted))
    if missing:
        raise ValueError(f"the GGUF file lacks {len(missing)} tensors a Qwen3-MoE model needs, e.g. {missing[:3]}")
    return converted

