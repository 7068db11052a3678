"""The reference path on the real default model (SmolLM2-135M-Instruct) against transformers."""
from __future__ import annotations

import pytest
import torch

from shrike.executor.step import EagerStep
import transformers

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 5, 8, 13,",
]
# Our kernels and torch's matmul sum in different orders; fp32 logits agree to about 1e-4 here.
FP32_LOGIT_ATOL = 5e-4


@pytest.fixture(scope="module")
def hf_model(default_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(default_model_dir):
    return LLMEngine(EngineConfig(model=str(default_model_dir), dtype="float32", max_model_len=512, progress=False))


def test_greedy_continuations_equal_transformers(engine, hf_model):
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    prompts.append(engine.tokenizer.encode(chat, add_special_tokens=False))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0))
    for prompt, (out,) in zip(prompts, outputs):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt):]
        assert out.token_ids == ref.tolist()
    assert "Paris" in outputs[-1][0].text


def test_last_position_logits_match(engine, hf_model):
    prompt = engine.tokenizer.encode(PROMPTS[2])
    n = len(prompt)
    runner = engine.runner
    step = EagerStep.prefill(runner.model.ops, torch.tensor(prompt), engine.config.block_size, torch.tensor([n - 1]))
    with torch.inference_mode():
        ours = runner.model.forward(step, runner.kv_caches)[0]
        ref = hf_model(torch.tensor([prompt])).logits[0, -1]
    assert (ours - ref).abs().max().item() < FP32_LOGIT_ATOL


def test_bf16_greedy_answer_is_sensible(default_model_dir):
    engine = LLMEngine(EngineConfig(model=str(default_model_dir), dtype="bfloat16", max_model_len=512, progress=False))
    chat = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    (out,) = engine.generate([engine.tokenizer.encode(chat, add_special_tokens=False)],
                             SamplingParams(max_tokens=24, temperature=0))[0]
    assert "Paris" in out.text
