"""Synthetic checkpoints: real shapes, a usable padded tokenizer, finite activations, generation."""
import json

import pytest
import torch

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.eval_ppl import sequence_logits
from shrike.model.config import ModelConfig
from shrike.sampling.params import SamplingParams
from shrike.synth import _padded_tokenizer, synth_config, synthesize
from shrike.quantization.schemes import SCHEMES
from shrike.tokenizer import Tokenizer


def test_minicpm5_2b_shapes():
    config = ModelConfig.from_dict(synth_config("minicpm5-2b", None, SCHEMES["w4a8-g128"], "pack-quantized", 1, 2))
    assert (config.hidden_size, config.intermediate_size, config.num_layers) == (2048, 6144, 42)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (16, 2, 128, 130560)
    assert not config.tie_word_embeddings and config.rope_theta == 5e6 and config.rms_norm_eps == 1e-6
    qc = config.quantization_config
    assert qc["ignore"] == ["lm_head"] and qc["config_groups"]["group_0"]["weights"]["group_size"] == 128


def test_padded_tokenizer_keeps_the_real_tokens(default_model_dir, tmp_path):
    for file in ("tokenizer_config.json", "config.json"):
        (tmp_path / file).write_bytes((default_model_dir / file).read_bytes())
    _padded_tokenizer(default_model_dir, tmp_path, 130560)
    padded, original = Tokenizer(tmp_path), Tokenizer(default_model_dir)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert max(vocab.values()) == 130559 and len(set(vocab.values())) == len(vocab)
    text = "We hold these truths to be self-evident, that all men are created equal."
    assert padded.encode(text) == original.encode(text)
    assert padded.decode([130559]) == "<|unused_130559|>"


@pytest.mark.parametrize("scheme, fmt", [("w4a8-g128", "pack-quantized"), ("w8a8", "int-quantized")])
def test_synthetic_checkpoint_loads_and_generates(tmp_path, monkeypatch, scheme, fmt):
    path = tmp_path / "model"
    synthesize(path, "tiny", scheme, fmt, layers=3, progress=False)
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))  # after synthesize found the real tokenizer
    engine = LLMEngine(EngineConfig(model=str(path), kv_cache_space=0.02, max_model_len=256, progress=False))
    assert engine.model_config.num_layers == 3
    prompt = engine.tokenizer.encode("Four score and seven years ago")
    out = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0][0]
    assert len(out.token_ids) == 6 and all(0 <= t < 49152 for t in out.token_ids)
    logits = sequence_logits(engine.runner.model, prompt)
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_deep_synthetic_model_stays_finite(tmp_path, monkeypatch):
    """42 layers, as MiniCPM5-2B: the residual stream must not overflow."""
    synthesize(tmp_path / "deep", "tiny", "w4a8-g128", layers=42, progress=False)
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    from shrike.model.loader import load_model
    model = load_model(str(tmp_path / "deep"), progress=False).model
    assert torch.isfinite(sequence_logits(model, list(range(300, 340)))).all()


def test_group_128_on_a_576_wide_model_has_a_shorter_last_group(tmp_path, monkeypatch):
    synthesize(tmp_path / "x", "smollm2-135m", "w4a8-g128", layers=1, progress=False)
    from shrike.model.loader import load_model
    from shrike.quantization.safetensors_io import CheckpointFiles
    assert CheckpointFiles(tmp_path / "x").entry("model.layers.0.self_attn.q_proj.weight_scale")["shape"] == [576, 5]
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    model = load_model(str(tmp_path / "x"), progress=False).model
    assert torch.isfinite(sequence_logits(model, list(range(300, 320)))).all()
