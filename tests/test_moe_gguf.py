"""A qwen3moe GGUF written by the `gguf` package from a tiny random Qwen3MoeForCausalLM (merged ffn_*_exps expert
tensors, as llama.cpp stores them) converts to the same logits as the model's own safetensors."""
from __future__ import annotations

import gguf
import numpy as np
import torch
import transformers
from safetensors.torch import load_file

from shrike.convert import convert_gguf
from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.moe import MoeCausalLM
from shrike.model.weights import CheckpointTensors

from test_gguf_tensor_types import VOCAB

EXPERTS, USED, HIDDEN, INTER, LAYERS = 4, 2, 64, 32, 2


def _tiny_hf() -> transformers.Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(vocab_size=len(VOCAB), hidden_size=HIDDEN, intermediate_size=96,
                                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=16, num_experts=EXPERTS, num_experts_per_tok=USED,
                                         moe_intermediate_size=INTER, norm_topk_prob=True, max_position_embeddings=64,
                                         rms_norm_eps=1e-6)
    model = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():  # bf16-representable weights, so that the bf16 checkpoint conversion writes is exact
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
            p.copy_(p.bfloat16().float())
    return model


def _write_gguf(path, model_dir) -> None:
    c = transformers.AutoConfig.from_pretrained(model_dir)
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    writer.add_expert_feed_forward_length(INTER)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 5)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    # the checkpoint as saved: per-expert tensors (transformers fuses them in memory)
    state = {k: v.float().numpy() for k, v in load_file(model_dir / "model.safetensors").items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp"}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for hf, name in names.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", state[f"{p}.{hf}.weight"])
        for hf, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            merged = np.stack([state[f"{p}.mlp.experts.{e}.{hf}.weight"] for e in range(EXPERTS)])  # (E, rows, cols)
            writer.add_tensor(f"blk.{i}.{name}.weight", merged.astype(np.float16), raw_dtype=gguf.GGMLQuantizationType.F16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    config = ModelConfig.from_dir(model_dir)
    model = MoeCausalLM(config, CheckpointTensors(model_dir), torch.float32)
    caches = [KVCache(4, 16, config.num_kv_heads, config.head_dim, torch.float32) for _ in range(config.num_layers)]
    return model.forward(EagerStep.prefill(model.ops, ids, 16, torch.arange(len(ids))), caches)


def test_qwen3moe_gguf_converts_to_the_same_logits(tmp_path):
    hf = _tiny_hf()
    with torch.no_grad():  # experts go through fp16 in the GGUF: keep the model's weights what the file holds
        for name, p in hf.named_parameters():
            if ".experts." in name:
                p.copy_(p.half().float())
    hf.save_pretrained(tmp_path / "hf")
    _write_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted", progress=False)
    config = ModelConfig.from_dir(tmp_path / "converted")
    assert (config.architecture, config.raw["num_experts"], config.raw["num_experts_per_tok"]) == \
        ("Qwen3MoeForCausalLM", EXPERTS, USED)
    ids = torch.randint(0, len(VOCAB), (21,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(_logits(tmp_path / "converted", ids), _logits(tmp_path / "hf", ids))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(_logits(tmp_path / "converted", ids), expected, atol=2e-4, rtol=1e-4)
