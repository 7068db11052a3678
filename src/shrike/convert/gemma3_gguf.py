"""config.json and Gemma3ForCausalLM tensors for a gemma3-architecture GGUF file.

llama.cpp stores Gemma's norm weights with the +1 of Gemma's RMSNorm already added (its norm
multiplies by the weight alone) and leaves q/k rows in Hugging Face order, so conversion
subtracts 1 from every norm weight and permutes nothing. The file does not record the pattern
of sliding-window layers, the local RoPE base or the query scale; llama.cpp fixes them for
Gemma 3 (every 6th layer global, base 10000, 1/sqrt(head_dim) except 27B's 1/sqrt(hidden/heads)),
and so does this.
"""

from __future__ import annotations

import numpy as np
from gguf import Keys, ReaderTensor

from shrike.convert.gguf_metadata import GGUFMetadata, float32_value
from shrike.convert.llama_config import rope_scaling_config
from shrike.convert.llama_weights import LAYER_NAMES, TensorConverter, attention_shapes, mlp_shapes

_SLIDING_WINDOW_PATTERN = 6
_LOCAL_ROPE_BASE = 10000.0
_LAYERS_OF_27B = 62  # the one size whose query scale is not 1/sqrt(head_dim)

# Llama's layer parts, plus Gemma's four norms per layer and its q/k norms.
_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}


def gemma3_config(meta: GGUFMetadata, vocab_size: int, has_output_weight: bool) -> dict:
    key = meta.arch_key
    hidden = meta.require(key(Keys.LLM.EMBEDDING_LENGTH))
    heads = meta.require(key(Keys.Attention.HEAD_COUNT))
    layers = meta.require(key(Keys.LLM.BLOCK_COUNT))
    head_dim = meta.get(key(Keys.Attention.KEY_LENGTH), hidden // heads)
    if meta.get(key(Keys.Attention.VALUE_LENGTH), head_dim) != head_dim:
        raise ValueError("the GGUF's key and value head sizes differ; Gemma 3 needs them equal")
    config = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": hidden,
        "intermediate_size": meta.require(key(Keys.LLM.FEED_FORWARD_LENGTH)),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(key(Keys.Attention.HEAD_COUNT_KV), heads),
        "head_dim": head_dim,
        "rms_norm_eps": float32_value(meta.require(key(Keys.Attention.LAYERNORM_RMS_EPS))),
        "rope_theta": float32_value(meta.get(key(Keys.Rope.FREQ_BASE), 1000000.0)),
        "rope_local_base_freq": _LOCAL_ROPE_BASE,
        "rope_scaling": rope_scaling_config(meta),
        "sliding_window": meta.require(key(Keys.Attention.SLIDING_WINDOW)),
        "layer_types": ["full_attention" if (i + 1) % _SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
                        for i in range(layers)],
        "query_pre_attn_scalar": hidden // heads if layers == _LAYERS_OF_27B else head_dim,
        "final_logit_softcapping": meta.get(key(Keys.LLM.FINAL_LOGIT_SOFTCAPPING)),
        "attn_logit_softcapping": meta.get(key(Keys.LLM.ATTN_LOGIT_SOFTCAPPING)),
        "max_position_embeddings": meta.require(key(Keys.LLM.CONTEXT_LENGTH)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": not has_output_weight,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    }
    for name, token_key in (("bos_token_id", Keys.Tokenizer.BOS_ID), ("eos_token_id", Keys.Tokenizer.EOS_ID),
                            ("pad_token_id", Keys.Tokenizer.PAD_ID)):
        if token_key in meta:
            config[name] = meta.get(token_key)
    return config


class Gemma3Tensors(TensorConverter):
    model = "a Gemma 3 text model"
    layer_names = _LAYER_NAMES

    def layer_shapes(self, config: dict) -> dict[str, tuple[int, ...]]:
        hidden, head_dim = config["hidden_size"], config["head_dim"]
        return {**attention_shapes(config), **mlp_shapes(config),
                "pre_feedforward_layernorm": (hidden,), "post_feedforward_layernorm": (hidden,),
                "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,)}

    def layout(self, tensor: ReaderTensor, weight: np.ndarray) -> dict[str, np.ndarray]:
        (name,) = self.names(tensor)
        # back to Hugging Face's (1 + weight) convention
        return {name: weight - np.float32(1.0) if name.endswith("norm.weight") else weight}
