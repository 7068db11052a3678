"""GGUF files written by the `gguf` package from tiny random Qwen3MoeForCausalLM (architecture qwen3moe) and
MixtralForCausalLM (architecture llama with experts, q/k rows permuted as llama.cpp stores them), with merged
ffn_*_exps expert tensors, convert to the same logits as the models' own safetensors."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGUFReader
from safetensors.torch import load_file

from shrike.convert import convert_gguf
from shrike.convert.gguf import read_gguf_model
from shrike.executor.step import EagerStep
from shrike.layers.attention import KVCache
from shrike.model.config import ModelConfig
from shrike.model.moe import MoeCausalLM
from shrike.model.weights import CheckpointTensors, GGUFTensors

from test_gguf_tensor_types import VOCAB

EXPERTS, USED, HIDDEN, INTER, LAYERS = 4, 2, 64, 32, 2


def _tiny_hf(kind: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    common = dict(vocab_size=len(VOCAB), hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_experts_per_tok=USED, max_position_embeddings=64,
                  rms_norm_eps=1e-6)
    config = transformers.Qwen3MoeConfig(**common, intermediate_size=96, num_experts=EXPERTS,
                                         moe_intermediate_size=INTER, norm_topk_prob=True) if kind == "qwen3moe" \
        else transformers.MixtralConfig(**common, intermediate_size=INTER, num_local_experts=EXPERTS)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # weights bf16 holds exactly, as the converted checkpoint stores them
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
            p.copy_(p.bfloat16().float())
    return model


def _llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows as llama.cpp's converter permutes them for a llama file (pairs interleaved per head)."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _write_gguf(path, model_dir, kind: str, linear_type: gguf.GGMLQuantizationType | None = None) -> None:
    """linear_type: store the attention and expert matrices quantized to this type (else float32)."""
    c = transformers.AutoConfig.from_pretrained(model_dir)
    qwen = kind == "qwen3moe"
    writer = gguf.GGUFWriter(str(path), "qwen3moe" if qwen else "llama")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(c.intermediate_size)  # Mixtral: the experts' width
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_rope_freq_base(c.rope_parameters["rope_theta"])
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(USED)
    if qwen:
        writer.add_expert_feed_forward_length(INTER)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(VOCAB)
    writer.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    writer.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                           + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 5)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    def add(name: str, weight: np.ndarray, quantize: bool = False) -> None:
        if quantize and linear_type is not None:
            writer.add_tensor(name, gguf.quants.quantize(weight, linear_type), raw_dtype=linear_type)
        else:
            writer.add_tensor(name, weight)

    # the checkpoint as saved: per-expert tensors (transformers fuses them in memory)
    state = {k: v.float().numpy() for k, v in load_file(model_dir / "model.safetensors").items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    block = "mlp" if qwen else "block_sparse_moe"
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             f"{block}.gate": "ffn_gate_inp",
             **({"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"} if qwen else {})}
    experts = (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")) if qwen \
        else (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps"))
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for hf, name in names.items():
            weight = state[f"{p}.{hf}.weight"]
            if not qwen and name in ("attn_q", "attn_k"):
                weight = _llama_cpp_order(weight, c.num_attention_heads if name == "attn_q" else c.num_key_value_heads)
            add(f"blk.{i}.{name}.weight", weight, quantize=name.startswith("attn_") and not name.endswith("norm"))
        for hf, name in experts:
            merged = np.stack([state[f"{p}.{block}.experts.{e}.{hf}.weight"] for e in range(EXPERTS)])  # (E, rows, cols)
            add(f"blk.{i}.{name}.weight", merged, quantize=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    config = ModelConfig.from_dir(model_dir)
    model = MoeCausalLM(config, CheckpointTensors(model_dir), torch.float32)
    caches = [KVCache(4, 16, config.num_kv_heads, config.head_dim, torch.float32) for _ in range(config.num_layers)]
    return model.forward(EagerStep.prefill(model.ops, ids, 16, torch.arange(len(ids))), caches)


@pytest.mark.parametrize("kind, architecture", [("qwen3moe", "Qwen3MoeForCausalLM"), ("mixtral", "MixtralForCausalLM")])
def test_moe_gguf_converts_to_the_same_logits(tmp_path, kind, architecture):
    hf = _tiny_hf(kind)
    hf.save_pretrained(tmp_path / "hf")
    _write_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", kind)
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted", progress=False)
    config = ModelConfig.from_dir(tmp_path / "converted")
    assert (config.architecture, config.raw["num_experts_per_tok"]) == (architecture, USED)
    ids = torch.randint(0, len(VOCAB), (21,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(_logits(tmp_path / "converted", ids), _logits(tmp_path / "hf", ids))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    torch.testing.assert_close(_logits(tmp_path / "converted", ids), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["qwen3moe", "mixtral"])
def test_tensors_read_from_the_file_equal_its_conversion_and_share_a_merged_tensor_among_experts(tmp_path, kind):
    _write_gguf(tmp_path / "tiny.gguf", _saved(_tiny_hf(kind), tmp_path / "hf"), kind, gguf.GGMLQuantizationType.Q8_0)
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted", progress=False)
    converted, from_file = CheckpointTensors(tmp_path / "converted"), GGUFTensors(read_gguf_model(tmp_path / "tiny.gguf"))
    assert sorted(from_file.names()) == sorted(converted.names())
    for name in converted.names():
        assert torch.equal(from_file.raw(name), converted.raw(name)), name
        assert from_file.raw(name).dtype == torch.bfloat16
    sizes = from_file.stored_bytes()
    merged = next(t for t in GGUFReader(tmp_path / "tiny.gguf").tensors if t.name == "blk.0.ffn_up_exps.weight")
    experts = [n for n in sizes if n.startswith("model.layers.0.") and ".experts." in n and
               n.endswith(("up_proj.weight", "w3.weight"))]
    assert len(experts) == EXPERTS and sum(sizes[n] for n in experts) == merged.n_bytes


def _saved(hf, directory):
    hf.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("kind", ["qwen3moe", "mixtral"])
def test_quantized_experts_run_natively_from_their_merged_tensors(tmp_path, kind, capfd):
    from shrike import LLM
    hf = _tiny_hf(kind)
    hf.save_pretrained(tmp_path / "hf")
    _write_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", kind, gguf.GGMLQuantizationType.Q8_0)
    native = LLM(str(tmp_path / "tiny.gguf"), dtype="float32", progress=False, max_model_len=64).llm_engine
    # 4 attention + 3 merged expert tensors per layer
    assert f"{7 * LAYERS} linear tensors run natively from the GGUF blocks ({7 * LAYERS} Q8_0)" in capfd.readouterr().err
    assert native.runner.model.layers[0].mlp.experts.op == "grouped_linear"
    converted = LLM(str(tmp_path / "tiny.gguf"), dtype="float32", progress=False, max_model_len=64,
                    gguf_weights="bf16").llm_engine
    ids = torch.randint(3, len(VOCAB), (21,), generator=torch.Generator().manual_seed(2))

    def logits(engine):
        runner = engine.runner
        step = EagerStep.prefill(runner.model.ops, ids, engine.config.block_size, torch.arange(len(ids)))
        with torch.inference_mode():
            return runner.model.forward(step, runner.kv_caches)[0].float()

    # each expert's packed weights are its slice of the merged tensors, exactly as the file dequantizes them
    reader = gguf.GGUFReader(str(tmp_path / "tiny.gguf"))
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    for layer_index, layer in enumerate(native.runner.model.layers):
        experts = layer.mlp.experts
        for e in range(EXPERTS):
            gate_up = np.concatenate([stored[f"blk.{layer_index}.ffn_gate_exps.weight"][e],
                                      stored[f"blk.{layer_index}.ffn_up_exps.weight"][e]])
            assert np.array_equal(experts.gate_up[e].dequantize().numpy(), gate_up)
            assert np.array_equal(experts.down[e].dequantize().numpy(), stored[f"blk.{layer_index}.ffn_down_exps.weight"][e])
    got, want = logits(native), logits(converted)
    # against the bf16 conversion: int8 activation blocks against float32 ones, and bf16-rounded weights
    assert 0 < (got - want).abs().max() < 0.05 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
