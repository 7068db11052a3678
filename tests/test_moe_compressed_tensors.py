"""A mixture-of-experts checkpoint written by the compressed-tensors library (every expert and attention linear
quantized, routers and lm_head ignored, as llm-compressor writes MoE checkpoints) loads into Shrike's expert
weights as the library decompresses them, and its logits follow transformers running the decompressed weights."""
from __future__ import annotations

import pytest
import torch
import transformers
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.compressors.model_compressors import ModelCompressor
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import save_file

from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.loader import load_model
from shrike.model.moe import quantizable_linears, router_ignore
from shrike.ops import _reference_weight
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.synth import synthesize


def _library_checkpoint(source, dst, preset: str, fmt: str):
    """dst: source's linears compressed by compressed-tensors; returns prefix -> the library's decompressed weight,
    and writes the decompressed model (unquantized) next to it for transformers."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    group = scheme.weights.group_size
    compressor = BaseCompressor.load_from_registry(fmt)
    files = CheckpointFiles(source)
    config = ModelConfig.from_dir(source)
    targets = set(quantizable_linears(config))
    tensors, decompressed = {}, {}
    for name in files.names():
        prefix = name.removesuffix(".weight")
        if prefix not in targets:
            tensors[name] = decompressed[name] = files.read(name)
            continue
        weight = files.read(name)  # (N, K) bf16
        grouped = weight.float().reshape(weight.shape[0], -1, group or weight.shape[1])
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
        compressed = compressor.compress({"weight": weight, "weight_scale": scale.bfloat16(),
                                          "weight_zero_point": zero}, scheme)
        tensors.update({f"{prefix}.{k}": v for k, v in compressed.items()})
        # in float32 (scales widened): bf16 output would round q * scale, which no kernel does
        decompressed[name] = compressor.decompress({**compressed, "weight_scale": compressed["weight_scale"].float()},
                                                   scheme)["weight"]
    for directory, content in ((dst, tensors), (dst.with_name(dst.name + "-decompressed"), decompressed)):
        directory.mkdir()
        save_file(content, str(directory / "model.safetensors"))
        for file in source.iterdir():
            if file.suffix != ".safetensors":
                (directory / file.name).write_bytes(file.read_bytes())
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", router_ignore(config)], format=fmt)
    ModelCompressor(quantization_config=qc).update_config(str(dst))
    return decompressed


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "tiny-moe"
    synthesize(path, "tiny-moe", "bf16", progress=False)
    return path


@pytest.mark.parametrize("preset, fmt", [("W4A16", "pack-quantized"), ("W8A8", "int-quantized")])
def test_experts_load_as_the_library_decompresses_them(source, tmp_path, monkeypatch, preset, fmt):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    decompressed = _library_checkpoint(source, tmp_path / "ct", preset, fmt)
    model = load_model(str(tmp_path / "ct"), progress=False, kernel_backend="reference").model

    for i, layer in enumerate(model.layers):
        block = layer.mlp
        assert torch.equal(block.router.weight, decompressed[f"model.layers.{i}.mlp.gate.weight"])  # dense, as stored
        for e, (gate_up, down) in enumerate(zip(block.experts.gate_up, block.experts.down)):
            p = f"model.layers.{i}.mlp.experts.{e}"
            library = {"gate_up": torch.cat([decompressed[f"{p}.gate_proj.weight"], decompressed[f"{p}.up_proj.weight"]]),
                       "down": decompressed[f"{p}.down_proj.weight"]}
            for part, weight in (("gate_up", gate_up), ("down", down)):
                ours = _reference_weight(weight)
                dense = ours.weight if hasattr(ours, "perm") else (ours.values.float() * ours.scale.reshape(-1, 1))
                assert torch.equal(dense.to(library[part].dtype), library[part]), f"{p} {part}"


def test_weight_only_logits_follow_transformers_on_the_decompressed_weights(source, tmp_path, monkeypatch):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    _library_checkpoint(source, tmp_path / "ct", "W4A16", "pack-quantized")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ct-decompressed", dtype=torch.float32).eval()
    model = load_model(str(tmp_path / "ct"), dtype="float32", progress=False).model
    c = model.config
    ids = torch.tensor([(13 * i + 7) % 4000 + 5 for i in range(19)])
    caches = [KVCache(2, 16, c.num_kv_heads, c.head_dim, torch.float32) for _ in range(c.num_layers)]
    got = model.forward(EagerStep.prefill(model.ops, ids, 16, torch.arange(19)), caches)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
