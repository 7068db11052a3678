"""Gemma 3 options the 270M model leaves off, on a tiny random Gemma3ForCausalLM saved by transformers:
a 4-token window over 24 tokens, final-logit soft-capping, linear RoPE scaling on the global layers,
query_pre_attn_scalar != head_dim, untied lm_head; and transformers 5's config form."""
from __future__ import annotations

import pytest
import torch
import transformers

from shrike.executor.step import EagerStep
from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.gemma3 import Gemma3ForCausalLM
from shrike.model.weights import CheckpointTensors
from shrike.plugins import build_registry

TOKENS = 24


def tiny_config(**overrides) -> transformers.Gemma3TextConfig:
    settings = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
                    final_logit_softcapping=5.0, tie_word_embeddings=False, max_position_embeddings=64,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 50000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}})
    settings.update(overrides)
    return transformers.Gemma3TextConfig(**settings)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(tiny_config()).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    directory = tmp_path_factory.mktemp("gemma3-tiny")
    model.save_pretrained(directory)
    return model, directory


def shrike_logits(directory, token_ids: torch.Tensor, block_size: int = 8, ops=None) -> torch.Tensor:
    config = ModelConfig.from_dir(directory)
    model = Gemma3ForCausalLM(config, CheckpointTensors(directory), torch.float32, ops=ops)
    n = token_ids.shape[0]
    blocks = -(-n // block_size)
    caches = [KVCache(blocks, block_size, config.num_kv_heads, config.head_dim, torch.float32)
              for _ in range(config.num_layers)]
    with torch.inference_mode():
        return model.forward(EagerStep.prefill(model.ops, token_ids, block_size, torch.arange(n)), caches)


@pytest.mark.parametrize("backend", ["auto", "reference"])  # built-in kernels, or every op's torch reference
def test_every_position_matches_transformers(saved, backend):
    model, directory = saved
    token_ids = torch.randint(0, 300, (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(token_ids[None]).logits[0]  # (TOKENS, vocab)
    ours = shrike_logits(directory, token_ids, ops=build_registry().op_table(backend))
    assert ours.abs().max() <= 5.0  # soft-capped
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_transformers_5_config_form_is_read(saved):
    _, directory = saved
    config = ModelConfig.from_dir(directory)
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert (config.sliding_window, config.rope_theta, config.rope_local_theta) == (4, 50000.0, 1000.0)
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert config.query_scale == pytest.approx(24 ** -0.5)
    assert config.final_logit_softcapping == 5.0 and not config.tie_word_embeddings


def test_legacy_config_form_is_read():
    raw = {"architectures": ["Gemma3ForCausalLM"], "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 12, "num_attention_heads": 4, "head_dim": 16, "sliding_window": 512,
           "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4}
    config = ModelConfig.from_dict(raw)
    assert config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 2
    assert (config.rope_theta, config.rope_local_theta, config.query_scale) == (1e6, 1e4, 0.25)
    assert config.tie_word_embeddings


def test_attention_soft_capping_is_refused_in_one_line():
    raw = tiny_config(attn_logit_softcapping=50.0).to_dict() | {"architectures": ["Gemma3ForCausalLM"]}
    with pytest.raises(ConfigError, match=r"^attention logit soft-capping \(attn_logit_softcapping\) is not supported"):
        ModelConfig.from_dict(raw)
