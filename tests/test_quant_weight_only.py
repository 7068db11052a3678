"""Weight-only (W4A16 / W8A16) and FP8 compressed-tensors checkpoints written by the real library.

SmolLM2-135M's linear layers are quantized and compressed by `compressed-tensors` itself
(its compressors and qparams); the reference model is the bf16 checkpoint of the library's own
decompression of the same tensors, run by Shrike's dense path. Act order: compressed-tensors
0.20 no longer writes `weight_g_idx` (GROUP actorder was removed), so that checkpoint is built as
the older versions stored it: the library quantizes the column-permuted weight with contiguous
groups, and the integers go back to the original column order with `weight_g_idx` naming each
column's group.

Tolerances (measured on this machine, then a margin): the weight-only kernels multiply by the exact
dequantized weight where the library rounds it to bf16, so per-position cosine similarity with the
library's logits stays above 0.999; FP8 is converted to int8 per channel at load and its activations
are quantized per token, so it is looser.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.compressors.model_compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import save_file

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.eval_ppl import sequence_logits
from shrike.executor.step import EagerStep
from shrike.model.config import ModelConfig
from shrike.model.loader import load_model
from shrike.quantization.quantize_checkpoint import linear_prefixes
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.sampling.params import SamplingParams

from greedy_ties import greedy_gaps

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "The largest planet in the solar system is", "Once upon a time", "The Declaration of Independence was signed in",
           "import numpy as np\n", "Photosynthesis is the process"]
TEXT = Path(__file__).parent / "data" / "public_domain_english.txt"
# Logits by which W8A16 and bf16 may prefer each other's greedy tokens (measured largest gap: 0.40).
W8A16_TIE_MARGIN = 0.75


def _copy_non_weights(src: Path, dst: Path) -> None:
    for file in src.iterdir():
        if file.suffix != ".safetensors" and file.is_file():
            (dst / file.name).write_bytes(file.read_bytes())


def truncated(src: Path, dst: Path, layers: int) -> Path:
    """src's first `layers` decoder layers (and its embedding, norm and lm_head) as a bf16 checkpoint."""
    source = CheckpointFiles(src)
    keep = [n for n in source.names() if not n.startswith("model.layers.") or int(n.split(".")[2]) < layers]
    dst.mkdir(parents=True)
    save_file({n: source.read(n) for n in keep}, str(dst / "model.safetensors"))
    _copy_non_weights(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def write_library_checkpoint(src: Path, dst: Path, preset: str, fmt: str, group_size: int | None,
                             act_order: bool = False) -> Path:
    """Quantize src's linears with compressed-tensors; also write dst/reference, the library's decompression.

    group_size None: one scale per output channel (the library's W8A16 preset is per group of 128)."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    per_tensor = scheme.weights.strategy == "tensor"  # FP8 (static): one weight scale per tensor
    scheme.weights.group_size = group_size
    scheme.weights.strategy = "group" if group_size else "tensor" if per_tensor else "channel"
    compressor = BaseCompressor.load_from_registry(fmt)
    source = CheckpointFiles(src)
    prefixes = set(linear_prefixes(ModelConfig.from_dir(src)))
    tensors, reference = {}, {}
    gen = torch.Generator().manual_seed(0)
    perms: dict[int, torch.Tensor] = {}  # one activation order per input width: fused layers share it
    for name in source.names():
        prefix = name.removesuffix(".weight")
        tensor = source.read(name)
        reference[name] = tensor
        if prefix not in prefixes:
            tensors[name] = tensor
            continue
        n, k = tensor.shape
        perm = perms.setdefault(k, torch.randperm(k, generator=gen)) if act_order else torch.arange(k)
        weight = tensor[:, perm]  # (N, K), act order: the columns in the order they are quantized
        grouped = weight.float().reshape(1, 1, -1) if per_tensor else weight.float().reshape(n, -1, group_size or k)
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
        if per_tensor:
            scale, zero = scale.reshape(1), zero.reshape(1)
        compressed = compressor.compress({"weight": weight, "weight_scale": scale.bfloat16(),
                                          "weight_zero_point": zero}, scheme)
        decompressed = compressor.decompress(compressed, scheme)["weight"]  # (N, K) bf16
        reference[name] = torch.empty_like(decompressed)
        reference[name][:, perm] = decompressed
        if act_order:  # back to the checkpoint's column order, with the group of each column
            bits = scheme.weights.num_bits
            values = unpack_from_int32(compressed["weight_packed"], bits, torch.Size([n, k]))
            original = torch.empty_like(values)
            original[:, perm] = values
            compressed["weight_packed"] = pack_to_int32(original, bits)
            g_idx = torch.empty(k, dtype=torch.int32)
            g_idx[perm] = torch.arange(k, dtype=torch.int32) // group_size
            compressed["weight_g_idx"] = g_idx
        tensors.update({f"{prefix}.{key}": value for key, value in compressed.items()})
    dst.mkdir(parents=True)
    save_file(tensors, str(dst / "model.safetensors"))
    _copy_non_weights(src, dst)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format=fmt)
    ModelCompressor(quantization_config=qc).update_config(str(dst))
    if act_order:
        config = json.loads((dst / "config.json").read_text())
        config["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "group"
        (dst / "config.json").write_text(json.dumps(config))
    (dst / "reference").mkdir()
    save_file(reference, str(dst / "reference" / "model.safetensors"))
    _copy_non_weights(src, dst / "reference")
    return dst


CHECKPOINTS = {  # name: (preset, format, group size, act order)
    "w4a16-g64": ("W4A16", "pack-quantized", 64, False),
    "w4a16-g32-asym": ("W4A16_ASYM", "pack-quantized", 32, False),
    "w4a16-g64-actorder": ("W4A16", "pack-quantized", 64, True),
    "w8a16-g64": ("W8A16", "pack-quantized", 64, False),
    "w8a16-int": ("W8A16", "int-quantized", None, False),
    "fp8-dynamic": ("FP8_DYNAMIC", "float-quantized", None, False),
    "fp8-static": ("FP8", "float-quantized", None, False),
}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("repack-cache")
        mp.setenv("SHRIKE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def one_thread():
    """The library's quantizer runs its many small tensors faster on one thread than contending for two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(default_model_dir, tmp_path_factory, cache_dir, one_thread):
    """Every format on SmolLM2's first 6 layers (quantizing all 30 in the library takes minutes)."""
    root = tmp_path_factory.mktemp("library-checkpoints")
    src = truncated(default_model_dir, root / "bf16-6-layers", 6)
    return {name: write_library_checkpoint(src, root / name, *spec) for name, spec in CHECKPOINTS.items()}


@pytest.fixture(scope="module")
def full_w8a16(default_model_dir, tmp_path_factory, cache_dir, one_thread):
    return write_library_checkpoint(default_model_dir, tmp_path_factory.mktemp("w8a16") / "w8a16", "W8A16",
                                    "int-quantized", None)


@pytest.fixture(scope="module")
def prompt_ids(default_model_dir):
    return load_model(str(default_model_dir), progress=False).tokenizer.encode(TEXT.read_text()[:600])


# name: (minimum per-position cosine similarity, minimum top-1 agreement) against the library's decompression.
# Near-ties decide the agreement: with the AMX attention walk (amx level) w4a16-g32-asym agrees on 96.2% and
# w8a16-g64 on 98.5% of the positions, cosine 1.0000 (>= 97% / 99% with the fp32 walk).
TOLERANCE = {"w4a16-g64": (0.999, 0.97), "w4a16-g32-asym": (0.999, 0.95), "w4a16-g64-actorder": (0.999, 0.97),
             "w8a16-g64": (0.9999, 0.98), "w8a16-int": (0.9999, 0.99), "fp8-dynamic": (0.99, 0.9),
             "fp8-static": (0.99, 0.9)}


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_logits_match_the_library_decompression(checkpoints, prompt_ids, name):
    path = checkpoints[name]
    ours = sequence_logits(load_model(str(path), progress=False).model, prompt_ids)
    library = sequence_logits(load_model(str(path / "reference"), progress=False).model, prompt_ids)
    cosine = torch.nn.functional.cosine_similarity(ours, library, dim=-1)
    agreement = (ours.argmax(-1) == library.argmax(-1)).float().mean()
    min_cosine, min_agreement = TOLERANCE[name]
    assert cosine.min() > min_cosine and agreement >= min_agreement, (name, cosine.min(), agreement)


@pytest.mark.parametrize("name", ["w4a16-g32-asym", "w4a16-g64-actorder", "w8a16-g64"])
def test_reference_backend_builds_the_kernels_weights(checkpoints, name):
    """--kernel-backend reference holds the same weights: every linear gives the kernel's bits on the same input."""
    kernel = load_model(str(checkpoints[name]), progress=False).model
    reference = load_model(str(checkpoints[name]), progress=False, kernel_backend="reference").model
    x = torch.randn(5, kernel.config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    steps = [EagerStep.prefill(m.ops, torch.zeros(5, dtype=torch.int64), 16, torch.arange(5)) for m in (kernel, reference)]
    for a, b in zip(kernel.layers, reference.layers):
        assert a.qkv_proj.format == b.qkv_proj.format == "weight_only"
        for name in ("qkv_proj", "gate_up_proj"):
            ours, theirs = (getattr(layer, name)(step, x, 5) for layer, step in zip((a, b), steps))
            assert torch.equal(ours, theirs), name


def _greedy(model: str, prompts: list[str], **engine) -> list[list[int]]:
    e = LLMEngine(EngineConfig(model=model, kv_cache_space=0.05, max_model_len=256, progress=False, **engine))
    assert (e.runner.compiled is not None) == engine.get("compiled_forward", True), e.runner.plan_blocker
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    return [out[0].token_ids for out in e.generate([e.tokenizer.encode(p) for p in prompts], params)]


def test_w8a16_greedy_text_follows_bf16(default_model_dir, full_w8a16):
    """All of SmolLM2-135M in W8A16 (int8 per channel, min-max round to nearest, 16-bit activations) decodes as
    its bf16 checkpoint up to near-ties: each one's greedy tokens are the other's choices, or lose to them by at
    most W8A16_TIE_MARGIN logits.

    Texts alone would part after 4 to 8 tokens on five of the eight prompts: the int8 rounding of a 135M model's
    near-ties, not the kernel (the library's own decompression run in bf16 parts from bf16 as early on four).
    """
    paths = {"w8a16": str(full_w8a16), "bf16": str(default_model_dir)}
    loaded = {name: load_model(path, progress=False) for name, path in paths.items()}
    models, tokenizer = {name: m.model for name, m in loaded.items()}, loaded["bf16"].tokenizer
    texts = {name: _greedy(path, PROMPTS) for name, path in paths.items()}
    gaps = [greedy_gaps(models[other], tokenizer.encode(prompt), texts[name][i])
            for name, other in (("w8a16", "bf16"), ("bf16", "w8a16")) for i, prompt in enumerate(PROMPTS)]
    assert max(g.max() for g in gaps) <= W8A16_TIE_MARGIN, gaps


def test_activation_quant_int8_runs_weight_only_checkpoints_on_int8_kernels(checkpoints, prompt_ids):
    """Opt-in int8 activations: symmetric W4A16 goes to the W4A8 kernel as stored, asymmetric is re-quantized to
    int8 per channel (W8A8), act order too."""
    sym = load_model(str(checkpoints["w4a16-g64"]), progress=False, activation_quant="int8").model
    assert {layer.qkv_proj.format for layer in sym.layers} == {"w4a8"}
    ordered = load_model(str(checkpoints["w4a16-g64-actorder"]), progress=False, activation_quant="int8").model
    assert {layer.qkv_proj.format for layer in ordered.layers} == {"w8a8"}
    asym = load_model(str(checkpoints["w4a16-g32-asym"]), progress=False, activation_quant="int8").model
    assert {layer.qkv_proj.format for layer in asym.layers} == {"w8a8"}
    ours = sequence_logits(asym, prompt_ids)
    library = sequence_logits(load_model(str(checkpoints["w4a16-g32-asym"] / "reference"), progress=False).model,
                              prompt_ids)
    # int8 activations plus the int8 re-quantization of the weights.
    assert torch.nn.functional.cosine_similarity(ours, library, dim=-1).median() > 0.98
    assert len(_greedy(str(checkpoints["w4a16-g64"]), PROMPTS[:1], activation_quant="int8")[0]) == 16


def test_compiled_forward_runs_act_order_weights(checkpoints):
    """The compiled forward permutes the inputs of act-ordered layers as the eager model does: same tokens."""
    path = str(checkpoints["w4a16-g64-actorder"])
    assert _greedy(path, PROMPTS[:3]) == _greedy(path, PROMPTS[:3], compiled_forward=False)
