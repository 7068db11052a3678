"""Per-input-channel scaling (SmoothQuant, AWQ: shrike.quantization.smoothing) folds into the checkpoint
without changing the function: tiny random Llama and Gemma 3 models saved by transformers, scaled by random
factors at every fold site, give the same logits in float32. Gemma 3's norms multiply by (1 + weight), so
its scaled norms are stored in float32 (a bf16 (1 + w) / s - 1 would lose most of (1 + w) / s for large s)."""
from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from safetensors.torch import save_file

from shrike.errors import ConfigError
from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors
from shrike.plugins import build_registry
from shrike.quantization.quantize_checkpoint import quantize_checkpoint
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.quantization.schemes import SCHEMES
from shrike.quantization.smoothing import apply_transform, fold_sites, norm_offsets, transforms

SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False)
MODELS = {"llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)),
          "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**SMALL, sliding_window=8))}


def _logits(directory, ids: torch.Tensor) -> torch.Tensor:
    config = ModelConfig.from_dir(directory)
    model = build_registry().architecture(config.architecture).target(config, CheckpointTensors(directory),
                                                                       torch.float32)
    caches = [KVCache(4, 8, config.num_kv_heads, config.head_dim, torch.float32) for _ in range(config.num_layers)]
    with torch.inference_mode():
        return model.forward(EagerStep.prefill(model.ops, ids, 8, torch.arange(len(ids))), caches)


@pytest.fixture(scope="module", params=list(MODELS))
def saved(request, tmp_path_factory):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return directory


def test_scaling_every_fold_site_keeps_the_logits(saved, tmp_path):
    config = ModelConfig.from_dir(saved)
    generator = torch.Generator().manual_seed(2)
    # Factors spanning 1/20 .. 20, as searched factors do on real activations.
    factors = {}
    for site in fold_sites(config):
        channels = CheckpointFiles(saved).entry(site.producer)["shape"][0]
        factors[site] = torch.exp(torch.empty(channels).uniform_(-3, 3, generator=generator))
    scaled_tensors = transforms(factors)
    offsets = norm_offsets(config)
    files = CheckpointFiles(saved)
    out = {}
    for name in files.names():
        tensor = files.read(name)
        out[name] = apply_transform(tensor, scaled_tensors[name], offsets.get(name, 0.0)) \
            if name in scaled_tensors else tensor
    save_file(out, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(saved / "config.json", tmp_path / "config.json")
    if config.architecture == "Gemma3ForCausalLM":
        assert out["model.layers.0.input_layernorm.weight"].dtype == torch.float32
    ids = torch.randint(0, 300, (20,), generator=generator)
    torch.testing.assert_close(_logits(tmp_path, ids), _logits(saved, ids), rtol=1e-4, atol=1e-4)


def test_awq_needs_calibration(saved, tmp_path):
    with pytest.raises(ConfigError, match="--method awq needs --calibration"):
        quantize_checkpoint(saved, tmp_path / "out", SCHEMES["w4a8-g32"], method="awq", progress=False)
    assert not (tmp_path / "out").exists()
