"""Qwen2, Qwen3 and Llama variants against Hugging Face transformers on tiny random models,
and MiniCPM's scalings against their formulas (transformers has no native MiniCPM class)."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import transformers

from shrike.executor.step import EagerStep
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.layers.attention import KVCache
from shrike.layers.rotary import RotaryEmbedding
from shrike.model.config import ModelConfig
from shrike.model.llama import CausalLM
from shrike.model.weights import CheckpointTensors
from shrike.sampling.params import SamplingParams

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)
VARIANTS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama-tied-llama3-rope": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        tie_word_embeddings=True, rope_theta=5e6, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32)),
}


def _save_tiny(kind: str, directory, tokenizer_dir) -> transformers.PreTrainedModel:
    config_cls, model_cls, extra = VARIANTS[kind]
    torch.manual_seed(0)
    return save_random(model_cls(config_cls(**TINY, **extra)).eval(), directory, tokenizer_dir)


def save_random(model: transformers.PreTrainedModel, directory, tokenizer_dir) -> transformers.PreTrainedModel:
    """Saves `model` with its matrices redrawn larger than the init default (so that logits, and a MoE's
    routing, are far from uniform) and the default model's tokenizer files beside it."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, directory / name)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request, tmp_path_factory, default_model_dir):
    directory = tmp_path_factory.mktemp(request.param)
    return request.param, directory, _save_tiny(request.param, directory, default_model_dir)


def _prefill_logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    config = ModelConfig.from_dir(model_dir)
    model = CausalLM(config, CheckpointTensors(model_dir), torch.float32)
    caches = [KVCache(4, 16, config.num_kv_heads, config.head_dim, torch.float32) for _ in range(config.num_layers)]
    n = len(ids)
    return model.forward(EagerStep.prefill(model.ops, ids, 16, torch.arange(n)), caches)


def test_prefill_logits_match_transformers(tiny):
    _, directory, hf = tiny
    ids = torch.randint(0, TINY["vocab_size"], (37,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(_prefill_logits(directory, ids), expected, atol=2e-4, rtol=1e-4)


def test_greedy_generation_matches_transformers(tiny):
    _, directory, hf = tiny
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float32", max_model_len=256, progress=False))
    prompts = [[1, 200, 3000, 45], [9, 8, 7, 6, 5, 4, 3, 2, 1, 600, 700]]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    for prompt, (out,) in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert out.token_ids == ref


# MiniCPM ----------------------------------------------------------------------------------

MINICPM_SCALES = dict(scale_emb=12.0, scale_depth=1.4, dim_model_base=16)


def _minicpm_dir(tmp_path, llama_dir, scales: dict):
    """The tiny Llama's weights relabelled as MiniCPM with the given scalings."""
    directory = tmp_path / ("minicpm-" + "-".join(f"{k}{v}" for k, v in scales.items()))
    shutil.copytree(llama_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(architectures=["MiniCPMForCausalLM"], model_type="minicpm", **scales)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, default_model_dir):
    directory = tmp_path_factory.mktemp("llama-for-minicpm")
    return directory, _save_tiny("llama", directory, default_model_dir)


def test_minicpm_with_neutral_scales_is_llama(tiny_llama, tmp_path):
    llama_dir, _ = tiny_llama
    neutral = _minicpm_dir(tmp_path, llama_dir, dict(scale_emb=1.0, scale_depth=math.sqrt(TINY["num_hidden_layers"]),
                                                       dim_model_base=TINY["hidden_size"]))
    ids = torch.arange(5, 25)
    assert torch.equal(_prefill_logits(neutral, ids), _prefill_logits(llama_dir, ids))


def test_minicpm_scalings_follow_their_formulas(tiny_llama, tmp_path):
    """Recompute the MiniCPM forward by hand from the HF Llama modules with each scaling inserted."""
    llama_dir, hf = tiny_llama
    directory = _minicpm_dir(tmp_path, llama_dir, MINICPM_SCALES)
    config = ModelConfig.from_dir(directory)
    assert config.scale_emb == 12.0
    assert config.residual_scale == pytest.approx(1.4 / math.sqrt(TINY["num_hidden_layers"]))
    assert config.logit_divisor == pytest.approx(TINY["hidden_size"] / 16)
    ids = torch.arange(5, 25)
    m = hf.model
    with torch.no_grad():
        hidden = m.embed_tokens(ids[None]) * MINICPM_SCALES["scale_emb"]
        positions = torch.arange(len(ids))[None]
        rotary = m.rotary_emb(hidden, positions)
        for layer in m.layers:
            attn, _ = layer.self_attn(layer.input_layernorm(hidden), position_embeddings=rotary, attention_mask=None)
            hidden = hidden + attn * config.residual_scale
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden)) * config.residual_scale
        expected = hf.lm_head(m.norm(hidden) / config.logit_divisor)[0]
    torch.testing.assert_close(_prefill_logits(directory, ids), expected, atol=2e-4, rtol=1e-4)


def test_longrope_uses_long_factors_past_the_original_context():
    head_dim, original = 16, 32
    short, long = [1.0 + i / 8 for i in range(head_dim // 2)], [2.0 + i for i in range(head_dim // 2)]
    config = ModelConfig.from_dict(dict(
        architectures=["MiniCPMForCausalLM"], vocab_size=10, hidden_size=64, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=128, rope_theta=10000.0,
        rope_scaling={"rope_type": "longrope", "short_factor": short, "long_factor": long,
                      "original_max_position_embeddings": original}))
    rotary = RotaryEmbedding(config, 128)
    positions = torch.tensor([3, 40])
    scale = math.sqrt(1 + math.log(128 / original) / math.log(original))
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    for use_long, factors in ((False, short), (True, long)):
        cos, sin = rotary.cos_sin_for(positions, torch.tensor([use_long, use_long]))
        angles = positions[:, None].float() * (inv_freq / torch.tensor(factors))[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        torch.testing.assert_close(cos, angles.cos() * scale)
        torch.testing.assert_close(sin, angles.sin() * scale)
