"""compressed-tensors format: config parsing, int4 packing, and compatibility both ways with the real library."""
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

from shrike import _C
from shrike.errors import ConfigError
from shrike.eval_ppl import sequence_logits
from shrike.model.config import ModelConfig
from shrike.model.loader import load_model
from shrike.quantization.compressed_tensors_format import QuantizationPlan, pack_int4, unpack_int
from shrike.quantization.quantize_checkpoint import linear_prefixes, quantize_checkpoint
from shrike.quantization.quantizer import dequantize
from shrike.quantization.safetensors_io import CheckpointFiles
from shrike.quantization.schemes import SCHEMES
from shrike.synth import synthesize


@pytest.mark.parametrize("k", [64, 72, 76])
def test_int4_packing_is_the_library_layout(k):
    values = torch.randint(-8, 8, (5, k), dtype=torch.int8)
    assert torch.equal(pack_int4(values), pack_to_int32(values, 4))
    assert torch.equal(unpack_int(pack_to_int32(values, 4), 4, k), values)


def _config(weights: dict, acts: dict | None = None, **top) -> dict:
    acts = acts or {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}},
            **top}


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}


def test_plan_matches_targets_and_ignore():
    plan = QuantizationPlan(_config(W4, ignore=["lm_head", "re:.*layers\\.1\\..*"]))
    assert plan.layer("model.layers.0.self_attn.q_proj").scheme == SCHEMES["w4a8-g128"]
    assert plan.layer("model.layers.1.mlp.down_proj") is None
    assert plan.layer("lm_head") is None


@pytest.mark.parametrize("config, named", [
    (_config({**W4, "group_size": 16}), "group_size 16"),
    (_config({**W4, "num_bits": 3}), "3-bit weights"),
    (_config({**W4, "dynamic": True}), "dynamic weight quantization"),
    (_config({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}), "float weights in format"),
    (_config({"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}, format="float-quantized"),
     "4-bit float weights"),
    (_config(W4, {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}), "input activations"),
    (_config(W4, {"num_bits": 4, "type": "int", "strategy": "token", "dynamic": True}), "input activations"),
    (_config(W4, quant_method="awq"), "quant_method 'awq'"),
    (_config(W4, format="marlin-24"), "format 'marlin-24'"),
    (_config(W4, kv_cache_scheme={"num_bits": 8, "type": "float"}), "quantized KV cache"),
])
def test_unsupported_schemes_name_what_is_supported(config, named):
    with pytest.raises(ConfigError, match=named) as err:
        QuantizationPlan(config)
    message = str(err.value)
    assert "\n" not in message
    assert "pack-quantized or int-quantized" in message and "W4A16" in message and "FP8" in message


@pytest.mark.parametrize("weights, acts, fmt, name", [
    ({**W4, "group_size": 64}, None, "pack-quantized", "w4a16-g64"),
    ({**W4, "symmetric": False}, None, "pack-quantized", "w4a16-g128-asym"),
    ({**W4, "group_size": 256, "actorder": "group"}, None, "int-quantized", "w4a16-g256"),
    ({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}, None, "pack-quantized", "w8a16"),
    ({"num_bits": 8, "type": "int", "strategy": "tensor", "symmetric": True}, None, "int-quantized", "w8a16"),
    ({**W4, "symmetric": False}, {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
     "pack-quantized", "w4a8-g128-asym"),
    ({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
     {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}, "float-quantized", "fp8"),
])
def test_supported_schemes_parse(weights, acts, fmt, name):
    config = _config(weights, format=fmt)
    config["config_groups"]["group_0"]["input_activations"] = acts
    layer = QuantizationPlan(config).layer("model.layers.0.mlp.down_proj")
    assert layer.name == name and layer.weight_only == (acts is None)


@pytest.fixture(scope="module")
def dense_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "tiny"
    synthesize(path, "tiny", "bf16", progress=False)
    return path


@pytest.mark.parametrize("name, fmt", [("w4a8-g128", "pack-quantized"), ("w8a8", "int-quantized"),
                                       ("w4a16-g32", "int-quantized"), ("w8a16", "pack-quantized")])
def test_library_decompresses_what_we_write(dense_tiny, tmp_path, name, fmt):
    dst = tmp_path / name
    quantize_checkpoint(dense_tiny, dst, SCHEMES[name], fmt, progress=False)
    qc = QuantizationConfig.model_validate(json.loads((dst / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    compressor = BaseCompressor.load_from_registry(qc.format)
    ours, source = CheckpointFiles(dst), CheckpointFiles(dense_tiny)
    for prefix in linear_prefixes(ModelConfig.from_dir(dst)):
        stored = {n.rsplit(".", 1)[1]: ours.read(n) for n in ours.names() if n.startswith(prefix + ".")}
        weight = compressor.decompress(stored, scheme)["weight"]  # (N, K) bf16
        values = stored["weight"] if fmt == "int-quantized" else \
            unpack_int(stored["weight_packed"], SCHEMES[name].weight_bits, weight.shape[1])
        assert torch.equal(weight, dequantize(values, stored["weight_scale"]).to(weight.dtype))
        dense = source.read(f"{prefix}.weight").float()
        # The default scale search may clip a group's largest weights: by at most (L + 0.5) / 0.55 - L steps.
        level = SCHEMES[name].max_level
        assert (weight.float() - dense).abs().max() <= ((level + 0.5) / 0.55 - level) * stored["weight_scale"].float().max()


@pytest.mark.parametrize("preset, fmt, group_size", [("W4A8", "int-quantized", 128), ("W4A8", "pack-quantized", 32),
                                                     ("W8A8", "int-quantized", None)])
def test_we_load_what_the_library_writes(dense_tiny, tmp_path, monkeypatch, preset, fmt, group_size):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group_size:
        scheme.weights.group_size = group_size
    compressor = BaseCompressor.load_from_registry(fmt)
    source = CheckpointFiles(dense_tiny)
    dst = tmp_path / "ct"
    dst.mkdir()
    tensors, expected = {}, {}
    for name in source.names():
        prefix = name.removesuffix(".weight")
        if prefix not in linear_prefixes(ModelConfig.from_dir(dense_tiny)):
            tensors[name] = source.read(name)
            continue
        weight = source.read(name)  # (N, K) bf16
        grouped = weight.float().reshape(weight.shape[0], -1, group_size or weight.shape[1])
        scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
        compressed = compressor.compress({"weight": weight, "weight_scale": scale.bfloat16(),
                                          "weight_zero_point": zero}, scheme)
        tensors.update({f"{prefix}.{k}": v for k, v in compressed.items()})
        expected[prefix] = compressor.decompress(compressed, scheme)["weight"]
    save_file(tensors, str(dst / "model.safetensors"))
    for file in dense_tiny.iterdir():
        if file.suffix != ".safetensors":
            (dst / file.name).write_bytes(file.read_bytes())
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format=fmt)
    ModelCompressor(quantization_config=qc).update_config(str(dst))

    reference = load_model(str(dst), progress=False, kernel_backend="reference")
    for i, layer in enumerate(reference.model.layers):
        p = f"model.layers.{i}"
        fused = {layer.qkv_proj: ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
                 layer.o_proj: ["self_attn.o_proj"], layer.gate_up_proj: ["mlp.gate_proj", "mlp.up_proj"],
                 layer.down_proj: ["mlp.down_proj"]}
        for linear, names in fused.items():
            weight = linear.weight
            ours = dequantize(weight.values, weight.scale.reshape(weight.values.shape[0], -1))  # (N, K) fp32
            library = torch.cat([expected[f"{p}.{name}"] for name in names])
            assert torch.equal(ours.to(library.dtype), library)
    assert torch.equal(reference.model.lm_head.weight, source.read("lm_head.weight"))  # ignored: stays bf16
    ids = list(range(100, 140))
    # Bit for bit with the fp32 attention walk, whose bf16 outputs equal SDPA's on this model; the AMX walk's
    # differ from them by one bf16 step on ~0.3% of the elements (tests/test_attention_amx.py), so the
    # comparison runs below the amx level, the kernel model loaded there too (at amx its bf16 lm_head would be
    # packed as tiles, in the tile order; the AMX linears are compared with their references in test_kernels.py).
    level = _C.active_isa()
    _C.set_isa("avx512bf16" if level == "amx" else level)
    try:
        kernel = load_model(str(dst), progress=False)
        logits = sequence_logits(kernel.model, ids)
        assert torch.isfinite(logits).all()
        assert torch.equal(logits, sequence_logits(reference.model, ids))
    finally:
        _C.set_isa(level)


@pytest.mark.parametrize("scheme", ["w4a8-g32", "w8a8", "w4a16-g64", "w8a16"])
@pytest.mark.parametrize("fmt", [None, "pack-quantized", "int-quantized"])
def test_quantize_command_every_scheme_and_format(dense_tiny, tmp_path, monkeypatch, capsys, scheme, fmt):
    """`shrike quantize` picks the format from the scheme (int4 packed, int8 one per byte); both formats work for all."""
    from shrike.cli import main
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "out"
    assert main(["quantize", str(dense_tiny), str(dst), "--scheme", scheme, *(["--format", fmt] if fmt else [])]) == 0
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    expected = fmt or ("pack-quantized" if scheme.startswith("w4") else "int-quantized")
    assert qc["format"] == expected
    assert (qc["config_groups"]["group_0"]["input_activations"] is None) == ("a16" in scheme)
    layer = load_model(str(dst), progress=False).model.layers[0]
    assert layer.qkv_proj.format == ("weight_only" if "a16" in scheme else scheme.split("-")[0])


def test_quantize_weight_only_with_calibration(dense_tiny, tmp_path):
    """Weight-only schemes use the calibration text for the clipping search only (no smoothing: activations
    are not quantized), so the weights stay a rounding of the originals."""
    dst = tmp_path / "w4a16"
    text = Path(__file__).parent / "data" / "calibration_bill_of_rights.txt"
    quantize_checkpoint(dense_tiny, dst, SCHEMES["w4a16-g32"], calibration_text=text.read_text(),
                        progress=False)
    ours, source = CheckpointFiles(dst), CheckpointFiles(dense_tiny)
    prefix = "model.layers.0.mlp.down_proj"
    weight = dequantize(unpack_int(ours.read(f"{prefix}.weight_packed"), 4, 768), ours.read(f"{prefix}.weight_scale"))
    step = ours.read(f"{prefix}.weight_scale").float().repeat_interleave(32, dim=1)
    assert ((weight - source.read(f"{prefix}.weight").float()).abs() <= 9 * step).all()  # no smoothing factors


def test_quantize_errors_are_one_line(dense_tiny, tmp_path, capsys):
    from shrike.cli import main
    assert main(["quantize", str(dense_tiny), str(tmp_path / "a"), "--scheme", "w4a16-g64", "--ignore"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "quantizing lm_head is not supported; keep lm_head in --ignore" in err


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_zero_points_are_the_library_layout(bits):
    """pack-quantized stores asymmetric zero points packed along the output dimension (N = 20: a partial word)."""
    scheme = preset_name_to_scheme("W4A16_ASYM", ["Linear"])
    scheme.weights.num_bits, scheme.weights.group_size = bits, 32
    weight = torch.randn(20, 64, generator=torch.Generator().manual_seed(bits)).bfloat16()
    grouped = weight.float().reshape(20, -1, 32)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), scheme.weights)
    compressed = BaseCompressor.load_from_registry("pack-quantized").compress(
        {"weight": weight, "weight_scale": scale.bfloat16(), "weight_zero_point": zero}, scheme)
    assert torch.equal(unpack_int(compressed["weight_zero_point"].t(), bits, 20).t(), zero.to(torch.int8))
    assert torch.equal(unpack_int(compressed["weight_packed"], bits, 64),
                       unpack_from_int32(compressed["weight_packed"], bits, torch.Size([20, 64])))
