"""Every sampling parameter on the real default model, each test failing if its parameter were ignored."""
from __future__ import annotations

import pytest
import torch

from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, sample


@pytest.fixture(scope="module")
def engine(default_model_dir):
    return LLMEngine(EngineConfig(model=str(default_model_dir), dtype="float32", max_model_len=1024, progress=False))


@pytest.fixture(scope="module")
def chat_prompt(engine):
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Write one sentence about the sea."}])
    return tok.encode(text, add_special_tokens=False)


def run(engine, prompt, **kwargs):
    kwargs.setdefault("max_tokens", 24)
    (out,) = engine.generate([prompt], SamplingParams(**kwargs))[0]
    return out


def test_greedy_is_deterministic_and_random_sampling_differs(engine, chat_prompt):
    greedy = run(engine, chat_prompt, temperature=0)
    assert run(engine, chat_prompt, temperature=0).token_ids == greedy.token_ids
    sampled = run(engine, chat_prompt, temperature=1.5, seed=3)
    assert sampled.token_ids != greedy.token_ids


def test_seed_reproduces_and_differs_across_seeds(engine, chat_prompt):
    a = run(engine, chat_prompt, temperature=1.0, seed=11)
    assert run(engine, chat_prompt, temperature=1.0, seed=11).token_ids == a.token_ids
    assert run(engine, chat_prompt, temperature=1.0, seed=12).token_ids != a.token_ids


@pytest.mark.parametrize("truncation", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_truncation_to_the_best_token_is_greedy(engine, chat_prompt, truncation):
    greedy = run(engine, chat_prompt, temperature=0).token_ids
    assert run(engine, chat_prompt, temperature=1.5, seed=3).token_ids != greedy
    assert run(engine, chat_prompt, temperature=1.5, seed=3, **truncation).token_ids == greedy


def test_top_k_keeps_sampling_within_the_k_best(engine, chat_prompt):
    out = run(engine, chat_prompt, temperature=5.0, seed=5, top_k=3, logprobs=3, max_tokens=16)
    for lp in out.logprobs:  # logprobs are the model's raw distribution: its top 3 are the only candidates
        assert lp.token_id in lp.top_ids


def test_max_tokens_min_tokens_and_ignore_eos(engine, chat_prompt):
    natural = run(engine, chat_prompt, temperature=0, max_tokens=200)
    assert natural.finish_reason == "stop" and len(natural.token_ids) < 200
    n = len(natural.token_ids)  # includes the EOS token
    longer = run(engine, chat_prompt, temperature=0, max_tokens=200, min_tokens=n + 5)
    assert len(longer.token_ids) >= n + 5
    capped = run(engine, chat_prompt, temperature=0, max_tokens=n - 3)
    assert len(capped.token_ids) == n - 3 and capped.finish_reason == "length"
    forced = run(engine, chat_prompt, temperature=0, max_tokens=n + 10, ignore_eos=True)
    assert len(forced.token_ids) == n + 10 and forced.finish_reason == "length"


def test_stop_string_ends_text_before_it(engine, chat_prompt):
    greedy = run(engine, chat_prompt, temperature=0, max_tokens=40)
    words = greedy.text.split()
    stop = words[3]
    out = run(engine, chat_prompt, temperature=0, max_tokens=40, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == greedy.text[:greedy.text.index(stop)]
    assert stop not in out.text


def test_stop_token_ids(engine, chat_prompt):
    greedy = run(engine, chat_prompt, temperature=0, max_tokens=30)
    stop_id = greedy.token_ids[6]
    out = run(engine, chat_prompt, temperature=0, max_tokens=30, stop_token_ids=[stop_id])
    assert out.finish_reason == "stop"
    assert out.token_ids == greedy.token_ids[:greedy.token_ids.index(stop_id) + 1]


def test_repetition_penalty_changes_a_repetitive_continuation(engine):
    prompt = engine.tokenizer.encode("one two one two one two one two one two")
    plain = run(engine, prompt, temperature=0, max_tokens=12)
    penalised = run(engine, prompt, temperature=0, max_tokens=12, repetition_penalty=2.0)
    assert penalised.token_ids != plain.token_ids
    assert len(set(penalised.token_ids)) > len(set(plain.token_ids))


def test_logprobs_are_the_models_log_softmax(engine, default_model_dir, chat_prompt):
    out = run(engine, chat_prompt, temperature=0, max_tokens=6, logprobs=5)
    assert len(out.logprobs) == 6
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32)
    ids = torch.tensor([chat_prompt + out.token_ids])
    with torch.no_grad():
        expected = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    for step, lp in enumerate(out.logprobs):
        row = expected[len(chat_prompt) - 1 + step]
        assert lp.top_ids[0] == lp.token_id  # greedy picks the most likely token
        assert lp.logprob == pytest.approx(row[lp.token_id].item(), abs=2e-3)
        assert lp.top_ids == row.topk(5).indices.tolist()
        assert lp.top_logprobs == sorted(lp.top_logprobs, reverse=True)


def test_prompt_logprobs_score_each_prompt_token(engine):
    prompt = engine.tokenizer.encode("The capital of France is Paris.")
    out = run(engine, prompt, temperature=0, max_tokens=1, prompt_logprobs=2)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    assert [lp.token_id for lp in out.prompt_logprobs[1:]] == prompt[1:]


# Penalties on the sampler directly, where the exact arithmetic is visible ---------------------

def _row(**kwargs) -> SamplingRow:
    return SamplingRow(SamplingParams(**kwargs), prompt_ids=[0], output_ids=[1, 1, 2], eos_ids=frozenset({4}),
                       generator=None)


def test_presence_and_frequency_penalties_subtract_from_generated_tokens():
    logits = torch.tensor([[3.0, 3.4, 3.2, 0.0, 0.0]])
    # Token 1 (seen twice) leads without penalties; presence 0.5 + frequency 0.1 x count pushes it below 2 and 0.
    assert sample(logits, [_row(temperature=0)])[0].item() == 1
    assert sample(logits, [_row(temperature=0, presence_penalty=0.5, frequency_penalty=0.1)])[0].item() == 0


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([[2.0, 2.1, -1.0, -1.5, -9.0]])
    assert sample(logits, [_row(temperature=0)])[0].item() == 1
    # Token 0 (prompt) 2.0/1.5 = 1.33, token 1 2.1/1.5 = 1.4: both penalised, 1 still wins over 0.
    # Token 2 (-1.0 x 1.5 = -1.5) falls below unseen token 3 only with the penalty.
    out = sample(torch.tensor([[-2.0, -2.0, -1.0, -1.4, -9.0]]), [_row(temperature=0, repetition_penalty=1.5)])
    assert out[0].item() == 3


def test_min_tokens_bans_eos_until_reached():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0, 5.0]])  # EOS (4) is the favourite
    assert sample(logits, [_row(temperature=0)])[0].item() == 4
    assert sample(logits, [_row(temperature=0, min_tokens=5)])[0].item() != 4
