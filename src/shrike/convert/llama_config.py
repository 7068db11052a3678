"""config.json and generation_config.json for a llama-architecture GGUF file."""

from __future__ import annotations

from gguf import Keys, TokenType

from shrike.convert.gguf_metadata import GGUFMetadata, float32_value

def llama_config(meta: GGUFMetadata, vocab_size: int, has_output_weight: bool) -> dict:
    hidden_size = meta.require(meta.arch_key(Keys.LLM.EMBEDDING_LENGTH))
    num_heads = meta.require(meta.arch_key(Keys.Attention.HEAD_COUNT))
    num_kv_heads = meta.get(meta.arch_key(Keys.Attention.HEAD_COUNT_KV), num_heads)
    if isinstance(num_kv_heads, list) or isinstance(num_heads, list):
        raise ValueError("per-layer attention head counts are not supported; every layer must have the same heads")
    head_dim = meta.get(meta.arch_key(Keys.Attention.KEY_LENGTH), hidden_size // num_heads)
    value_dim = meta.get(meta.arch_key(Keys.Attention.VALUE_LENGTH), head_dim)
    rope_dims = meta.get(meta.arch_key(Keys.Rope.DIMENSION_COUNT), head_dim)
    if value_dim != head_dim:
        raise ValueError(f"key head size {head_dim} differs from value head size {value_dim}; Llama needs them equal")
    if rope_dims != head_dim:
        raise ValueError(f"RoPE covers {rope_dims} of {head_dim} head dimensions; only full-head RoPE is supported")

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": meta.require(meta.arch_key(Keys.LLM.FEED_FORWARD_LENGTH)),
        "num_hidden_layers": meta.require(meta.arch_key(Keys.LLM.BLOCK_COUNT)),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float32_value(meta.require(meta.arch_key(Keys.Attention.LAYERNORM_RMS_EPS))),
        # 10000 is llama.cpp's default when a file omits the base frequency
        "rope_theta": float32_value(meta.get(meta.arch_key(Keys.Rope.FREQ_BASE), 10000.0)),
        "rope_scaling": rope_scaling_config(meta),
        "max_position_embeddings": meta.require(meta.arch_key(Keys.LLM.CONTEXT_LENGTH)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": not has_output_weight,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }
    for name, key in (("bos_token_id", Keys.Tokenizer.BOS_ID), ("eos_token_id", Keys.Tokenizer.EOS_ID),
                      ("pad_token_id", Keys.Tokenizer.PAD_ID)):
        if key in meta:
            config[name] = meta.get(key)
    return config


def rope_scaling_config(meta: GGUFMetadata) -> dict | None:
    scaling_type = meta.get(meta.arch_key(Keys.Rope.SCALING_TYPE), "none")
    if scaling_type == "none":
        return None
    if scaling_type == "linear":
        factor = meta.require(meta.arch_key(Keys.Rope.SCALING_FACTOR))
        return {"rope_type": "linear", "factor": float32_value(factor)}
    raise ValueError(f"RoPE scaling {scaling_type!r} is not supported; only 'linear' scaling converts")


# End-of-turn control tokens llama.cpp recognises by their text when a file names no EOT token
_END_OF_TURN_TEXTS = ("<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>")


def generation_config(meta: GGUFMetadata) -> dict:
    """Generation stops at any of EOS, end-of-turn and end-of-message, as llama.cpp does."""
    stop_ids: list[int] = []
    for key in (Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID):
        token_id = meta.get(key)
        if token_id is not None and token_id not in stop_ids:
            stop_ids.append(token_id)
    if Keys.Tokenizer.EOT_ID not in meta:
        stop_ids += [token_id for token_id in _end_of_turn_ids(meta) if token_id not in stop_ids]
    config: dict = {}
    if Keys.Tokenizer.BOS_ID in meta:
        config["bos_token_id"] = meta.get(Keys.Tokenizer.BOS_ID)
    if stop_ids:
        config["eos_token_id"] = stop_ids[0] if len(stop_ids) == 1 else stop_ids
    if Keys.Tokenizer.PAD_ID in meta:
        config["pad_token_id"] = meta.get(Keys.Tokenizer.PAD_ID)
    return config


def _end_of_turn_ids(meta: GGUFMetadata) -> list[int]:
    tokens = meta.get(Keys.Tokenizer.LIST, [])
    types = meta.get(Keys.Tokenizer.TOKEN_TYPE, [])
    wanted = set(_END_OF_TURN_TEXTS)
    return [i for i, (text, kind) in enumerate(zip(tokens, types)) if kind == TokenType.CONTROL and text in wanted]
