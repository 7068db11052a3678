"""benchmarks/export_gguf.py on a tiny random Llama: the GGUF it writes reads back as llama.cpp expects.

llama.cpp itself is not needed: gguf.GGUFReader checks names, shapes, metadata and the Q/K layout.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGMLQuantizationType, TokenType
from safetensors.torch import save_file

EXPORT_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "export_gguf.py"

HIDDEN, HEADS, KV_HEADS, LAYERS, FFN, VOCAB_ROWS = 64, 4, 2, 2, 96, 8
HEAD_DIM = HIDDEN // HEADS


@pytest.fixture(scope="module")
def export_gguf():
    spec = importlib.util.spec_from_file_location("export_gguf", EXPORT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # by path, as `shrike bench` loads benchmarks
    return module


def _tiny_weights(tied: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": random(VOCAB_ROWS, HIDDEN), "model.norm.weight": random(HIDDEN)}
    if not tied:
        weights["lm_head.weight"] = random(VOCAB_ROWS, HIDDEN)
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        weights |= {
            prefix + "input_layernorm.weight": random(HIDDEN),
            prefix + "post_attention_layernorm.weight": random(HIDDEN),
            prefix + "self_attn.q_proj.weight": random(HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": random(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": random(HIDDEN, HEADS * HEAD_DIM),
            prefix + "mlp.gate_proj.weight": random(FFN, HIDDEN),
            prefix + "mlp.up_proj.weight": random(FFN, HIDDEN),
            prefix + "mlp.down_proj.weight": random(HIDDEN, FFN),
        }
    return weights


def _tiny_tokenizer() -> dict:
    """Five ids of a byte-level BPE: fewer than the embedding's rows, so the export must pad."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": True, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": [["a", "b"]]},
    }


def _write_model(directory: Path, model_type: str, tied: bool) -> dict[str, torch.Tensor]:
    config = {"model_type": model_type, "hidden_size": HIDDEN, "intermediate_size": FFN,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "vocab_size": VOCAB_ROWS, "max_position_embeddings": 256, "rope_theta": 50000.0,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "bos_token_id": 4, "eos_token_id": 4}
    if model_type == "minicpm":
        config |= {"scale_emb": 12.0, "scale_depth": 1.4, "dim_model_base": 16}
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text(json.dumps(_tiny_tokenizer()))
    (directory / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False,
                                                                  "chat_template": "{{ messages }}"}))
    weights = _tiny_weights(tied)
    save_file(weights, directory / "model.safetensors")
    return weights


def _field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def _bf16_tensor(reader: GGUFReader, name: str) -> torch.Tensor:
    tensor = next(t for t in reader.tensors if t.name == name)
    assert tensor.tensor_type == GGMLQuantizationType.BF16
    bits = np.asarray(tensor.data).view(np.int16).reshape(tuple(reversed(tensor.shape.tolist())))
    return torch.from_numpy(bits.copy()).view(torch.bfloat16)


def test_llama_export_names_shapes_and_metadata(export_gguf, tmp_path):
    weights = _write_model(tmp_path / "tiny", "llama", tied=True)
    out = tmp_path / "tiny.gguf"
    assert export_gguf.main([str(tmp_path / "tiny"), str(out)]) == 0

    reader = GGUFReader(out)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.block_count") == LAYERS
    assert _field(reader, "llama.embedding_length") == HIDDEN
    assert _field(reader, "llama.attention.head_count_kv") == KV_HEADS
    assert _field(reader, "llama.rope.freq_base") == pytest.approx(50000.0)
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    assert _field(reader, "tokenizer.ggml.tokens") == ["a", "b", "ab", "Ġ", "<|endoftext|>",
                                                        "[PAD5]", "[PAD6]", "[PAD7]"]
    assert _field(reader, "tokenizer.ggml.token_type")[3:6] == [TokenType.NORMAL, TokenType.CONTROL,
                                                                 TokenType.UNUSED]
    assert _field(reader, "tokenizer.ggml.merges") == ["a b"]
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 4
    assert _field(reader, "tokenizer.chat_template") == "{{ messages }}"

    shapes = {t.name: tuple(reversed(t.shape.tolist())) for t in reader.tensors}
    assert "output.weight" not in shapes  # tied: llama.cpp reuses token_embd
    assert shapes["token_embd.weight"] == (VOCAB_ROWS, HIDDEN)
    assert shapes["blk.1.attn_k.weight"] == (KV_HEADS * HEAD_DIM, HIDDEN)
    assert shapes["blk.1.ffn_down.weight"] == (HIDDEN, FFN)
    assert len(shapes) == 2 + 9 * LAYERS
    norm = next(t for t in reader.tensors if t.name == "blk.0.attn_norm.weight")
    assert norm.tensor_type == GGMLQuantizationType.F32

    # Values survive bit for bit; Q and K rows move into llama.cpp's interleaved rotary order
    assert torch.equal(_bf16_tensor(reader, "blk.0.attn_v.weight"), weights["model.layers.0.self_attn.v_proj.weight"])
    exported_k = _bf16_tensor(reader, "blk.0.attn_k.weight")
    source_k = weights["model.layers.0.self_attn.k_proj.weight"]
    half = HEAD_DIM // 2
    assert torch.equal(exported_k[0], source_k[0]) and torch.equal(exported_k[1], source_k[half])
    assert torch.equal(exported_k[HEAD_DIM + 3], source_k[HEAD_DIM + half + 1])


def test_minicpm_export_keeps_scalings_and_untied_head(export_gguf, tmp_path):
    _write_model(tmp_path / "tiny", "minicpm", tied=False)
    out = tmp_path / "tiny.gguf"
    assert export_gguf.main([str(tmp_path / "tiny"), str(out), "--dtype", "f16"]) == 0

    reader = GGUFReader(out)
    assert _field(reader, "general.architecture") == "minicpm"
    assert _field(reader, "minicpm.embedding_scale") == pytest.approx(12.0)
    assert _field(reader, "minicpm.residual_scale") == pytest.approx(1.4 / LAYERS ** 0.5)
    assert _field(reader, "minicpm.logit_scale") == pytest.approx(HIDDEN / 16)
    output = next(t for t in reader.tensors if t.name == "output.weight")
    assert output.tensor_type == GGMLQuantizationType.F16


def test_quantized_checkpoint_is_refused(export_gguf, tmp_path, capsys):
    directory = tmp_path / "tiny"
    _write_model(directory, "llama", tied=True)
    save_file({"model.embed_tokens.weight": torch.zeros(VOCAB_ROWS, HIDDEN, dtype=torch.int8)},
              directory / "model.safetensors")
    assert export_gguf.main([str(directory), str(tmp_path / "out.gguf")]) == 2
    assert "only unquantized checkpoints export" in capsys.readouterr().err


def test_qwen3moe_int4_export_is_the_same_weights_as_q4_0(export_gguf, tmp_path):
    """A W4A8-G128 Qwen3-MoE checkpoint written by `shrike synth` exports to Q4_0 blocks that dequantize
    (by the gguf package, as llama.cpp does) to exactly the checkpoint's int4 values times its scales; the
    experts of a layer are merged into one (experts, N, K) tensor and the router stays BF16."""
    from gguf import dequantize
    from safetensors import safe_open

    from shrike.quantization.compressed_tensors_format import unpack_int
    from shrike.synth import synthesize

    synthesize(tmp_path / "moe", "tiny-moe", "w4a8-g128", progress=False)
    config = json.loads((tmp_path / "moe" / "config.json").read_text())
    out = tmp_path / "moe.gguf"
    assert export_gguf.main([str(tmp_path / "moe"), str(out), "--dtype", "q4_0", "--output-type", "q8_0"]) == 0

    reader = GGUFReader(out)
    assert _field(reader, "general.architecture") == "qwen3moe"
    assert _field(reader, "qwen3moe.expert_count") == config["num_experts"]
    assert _field(reader, "qwen3moe.expert_used_count") == config["num_experts_per_tok"]
    assert _field(reader, "qwen3moe.expert_feed_forward_length") == config["moe_intermediate_size"]
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["output.weight"].tensor_type == GGMLQuantizationType.Q8_0
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == GGMLQuantizationType.BF16
    assert tensors["blk.0.attn_q_norm.weight"].tensor_type == GGMLQuantizationType.F32
    down = tensors["blk.1.ffn_down_exps.weight"]
    assert down.tensor_type == GGMLQuantizationType.Q4_0
    experts, hidden, inter = config["num_experts"], config["hidden_size"], config["moe_intermediate_size"]
    assert tuple(reversed(down.shape.tolist())) == (experts, hidden, inter)

    merged = dequantize(np.asarray(down.data), down.tensor_type).reshape(experts, hidden, inter)
    q = dequantize(np.asarray(tensors["blk.0.attn_q.weight"].data), GGMLQuantizationType.Q4_0)
    with safe_open(tmp_path / "moe" / "model.safetensors", framework="pt") as handle:
        def weight(prefix: str, k: int) -> np.ndarray:
            values = unpack_int(handle.get_tensor(f"{prefix}.weight_packed"), 4, k).float()
            scales = handle.get_tensor(f"{prefix}.weight_scale").float()
            return (values * scales.repeat_interleave(k // scales.shape[1], dim=1)).numpy()

        for e in (0, experts - 1):
            assert np.array_equal(merged[e], weight(f"model.layers.1.mlp.experts.{e}.down_proj", inter))
        assert np.array_equal(q.reshape(-1, hidden), weight("model.layers.0.self_attn.q_proj", hidden))
