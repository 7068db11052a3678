"""Every common GGUF tensor type converts to exactly what the `gguf` package's dequantizer gives,
and what cannot be read is refused in one line naming what can.

A tiny Llama GGUF (written here with gguf.GGUFWriter) carries one linear layer per tensor type.
Types gguf.quants can quantize are quantized from random weights (and checked to stay near them);
for the K- and i-quants, which it only dequantizes, the blocks are random bytes with every fp16
scale kept finite, which exercises the same block layouts.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from safetensors import safe_open

from shrike.convert import convert_gguf

HIDDEN = FFN = 256  # K-quant blocks hold 256 values along a row
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4, 2, 64, 3
TYPES = [Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
         Q.IQ4_NL, Q.IQ4_XS, Q.F32]
# Per layer, the linears whose rows llama.cpp leaves in Hugging Face order (q/k are permuted).
SLOTS = [(layer, gguf_name, hf_name) for layer in range(LAYERS) for gguf_name, hf_name in (
    ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj"))]
SHAPES = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
          "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
# Worst error of quantize -> dequantize relative to max|w| per type (a sanity bound, not a spec)
QUANTIZE_ERROR = {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q4_0: 0.15, Q.Q4_1: 0.1, Q.Q5_0: 0.07, Q.Q5_1: 0.05, Q.Q8_0: 0.01,
                  Q.F32: 0.0}
VOCAB = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581", "a", "b", "\u2581a", "ab"]


def stored_block_bytes(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of qtype, (rows, bytes per row) uint8, with every fp16 finite.

    Clearing bit 6 of every byte caps an fp16's exponent below the all-ones (inf/NaN) pattern,
    whichever bytes of the block hold one."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block_values * block_bytes), dtype=np.uint8)
    return raw & np.uint8(0b1011_1111)


def encode(qtype: Q, weight: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """weight (rows, cols) float32 as GGUF stores it in qtype."""
    if qtype == Q.F32:
        return weight
    if qtype in QUANTIZE_ERROR:
        return gguf.quants.quantize(weight, qtype)
    return stored_block_bytes(qtype, *weight.shape, rng)


def write_typed_gguf(path: Path, types: list[Q], architecture: str = "llama",
                     slots: list[tuple[int, str, str]] = SLOTS, embedding: Q = Q.F32,
                     output: Q | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny SentencePiece Llama whose linears in `slots` (by default v/o/gate/up/down) use `types` in turn,
    the others float32, with token_embd of type `embedding` and an output.weight of type `output` (none: the
    head is tied), its weights drawn from `seed`; returns the stored form of each typed tensor, keyed by its
    Hugging Face name."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 5)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    stored: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, weight: np.ndarray, qtype: Q) -> None:
        data = encode(qtype, weight, rng)
        writer.add_tensor(gguf_name, data, raw_dtype=None if qtype == Q.F32 else qtype)
        stored[hf_name] = (data, qtype)

    add("token_embd.weight", "model.embed_tokens.weight", rng.standard_normal((len(VOCAB), HIDDEN), np.float32),
        embedding)
    if output is not None:
        add("output.weight", "lm_head.weight", rng.standard_normal((len(VOCAB), HIDDEN), np.float32) * 0.1, output)
    add("output_norm.weight", "model.norm.weight", np.ones(HIDDEN, np.float32), Q.F32)
    typed = {(layer, name): (types[i % len(types)], hf) for i, (layer, name, hf) in enumerate(slots)}
    for layer in range(LAYERS):
        for name in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.ones(HIDDEN, np.float32))
        for name, shape in SHAPES.items():
            weight = rng.standard_normal(shape, np.float32) * 0.05
            if (layer, name) in typed:
                qtype, hf = typed[layer, name]
                add(f"blk.{layer}.{name}.weight", f"model.layers.{layer}.{hf}.weight", weight, qtype)
            else:  # float32 (q and k by default), rows as llama.cpp orders them (irrelevant to random weights)
                writer.add_tensor(f"blk.{layer}.{name}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("typed")
    stored = write_typed_gguf(directory / "typed.gguf", TYPES)
    convert_gguf(directory / "typed.gguf", directory / "out", progress=False)
    with safe_open(directory / "out" / "model.safetensors", framework="pt") as weights:
        tensors = {name: weights.get_tensor(name) for name in weights.keys()}
    return stored, tensors


@pytest.mark.parametrize("slot", range(len(TYPES)), ids=[t.name for t in TYPES])
def test_tensor_type_converts_to_the_gguf_dequantization(converted, slot):
    stored, tensors = converted
    layer, _, hf = SLOTS[slot]
    name = f"model.layers.{layer}.{hf}.weight"
    data, qtype = stored[name]
    assert qtype == TYPES[slot]
    expected = gguf.quants.dequantize(data, qtype).reshape(tensors[name].shape)  # (out, in) float32
    assert np.isfinite(expected).all() and np.abs(expected).max() > 0
    assert torch.equal(tensors[name], torch.from_numpy(np.ascontiguousarray(expected)).to(torch.bfloat16))


@pytest.mark.parametrize("qtype", list(QUANTIZE_ERROR), ids=[t.name for t in QUANTIZE_ERROR])
def test_quantizable_types_stay_near_the_original(qtype):
    weight = np.random.default_rng(1).standard_normal((8, 256), np.float32)
    back = gguf.quants.dequantize(gguf.quants.quantize(weight, qtype), qtype).reshape(weight.shape)
    assert np.abs(back - weight).max() <= QUANTIZE_ERROR[qtype] * np.abs(weight).max() + 1e-7


def test_unreadable_type_is_a_one_line_error_naming_the_readable_ones(tmp_path):
    write_typed_gguf(tmp_path / "q8k.gguf", [Q.Q8_K])
    with pytest.raises(ValueError) as error:
        convert_gguf(tmp_path / "q8k.gguf", tmp_path / "out", progress=False)
    message = str(error.value)
    assert "\n" not in message
    assert "type Q8_K, which Shrike cannot read" in message
    for readable in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                     "IQ4_XS", "F16", "BF16"):
        assert readable in message.split("supported types: ")[1].split(", ")


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    write_typed_gguf(tmp_path / "phi.gguf", [Q.F32], architecture="phi3")
    with pytest.raises(ValueError, match=r"^GGUF architecture 'phi3' is not supported; .*'llama'.*'gemma3'"):
        convert_gguf(tmp_path / "phi.gguf", tmp_path / "out", progress=False)


@pytest.mark.parametrize("scheme,fmt,bits", [("w4a8-g128", "w4a8", 4), ("w8a8", "w8a8", 8)])
def test_convert_can_requantize_in_the_same_command(tmp_path, scheme, fmt, bits):
    from shrike.cli import main
    from shrike.llm import LLM
    from shrike.sampling.params import SamplingParams

    write_typed_gguf(tmp_path / "k.gguf", [Q.Q4_K, Q.Q6_K, Q.Q8_0])
    assert main(["convert", str(tmp_path / "k.gguf"), str(tmp_path / scheme), "--quantize", scheme]) == 0
    config = json.loads((tmp_path / scheme / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.gguf", scheme]  # the bf16 staging copy is gone
    llm = LLM(str(tmp_path / scheme), max_model_len=64, progress=False)
    layer = llm.llm_engine.runner.model.layers[0].qkv_proj
    assert layer.format == fmt
    (out,) = llm.generate(["ab"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out.outputs[0].token_ids) == 4


def test_convert_refuses_an_unknown_scheme_in_one_line(tmp_path, capsys):
    from shrike.cli import main
    write_typed_gguf(tmp_path / "k.gguf", [Q.F32])
    with pytest.raises(SystemExit):
        main(["convert", str(tmp_path / "k.gguf"), str(tmp_path / "out"), "--quantize", "w3a8"])
    assert "invalid choice: 'w3a8'" in capsys.readouterr().err
