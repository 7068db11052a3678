"""vLLM's offline SamplingParams fields and LLM.chat options, on the real default model."""
from __future__ import annotations

import json

import jsonschema
import pytest

from shrike import LLM, SamplingParams
from shrike.sampling.params import GuidedDecodingParams, StructuredOutputsParams

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", kv_cache_space=0.25, max_model_len=512)


@pytest.fixture(scope="module")
def greedy(llm):
    """The unconstrained greedy continuation of PROMPT: ' Paris.\\n\\nThe answer is:'."""
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


def test_structured_outputs_validate_at_temperature_one(llm):
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=60,
                             structured_outputs=StructuredOutputsParams(json=SCHEMA)) for seed in range(6)]
    outputs = llm.chat([[{"role": "user", "content": "Describe a person."}]] * 6, params, use_tqdm=False)
    for output in outputs:
        # No key beyond the declared ones, although the schema leaves additionalProperties out.
        jsonschema.validate(json.loads(output.outputs[0].text), {**SCHEMA, "additionalProperties": False})
    assert params[0].grammar is None  # the caller's params are left as given


@pytest.mark.parametrize("field, constraint, check", [
    ("guided_decoding", GuidedDecodingParams(choice=["yes", "no"]), lambda text: text in ("yes", "no")),
    ("structured_outputs", StructuredOutputsParams(regex=r"[0-9]{3}"), lambda text: len(text) == 3 and text.isdigit()),
    ("structured_outputs", StructuredOutputsParams(json_object=True), lambda text: isinstance(json.loads(text), dict)),
    ("structured_outputs", StructuredOutputsParams(grammar='start: "a" | "b"'), lambda text: text in ("a", "b")),
], ids=["guided choice", "regex", "json_object", "lark grammar"])
def test_each_constraint_kind(llm, field, constraint, check):
    params = SamplingParams(temperature=0, max_tokens=40, **{field: constraint})
    assert check(llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text)


def test_malformed_constraints_are_refused_where_made():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="not both"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                       guided_decoding=StructuredOutputsParams(regex="b"))


def test_stop_reason_and_include_stop_str_in_output(llm, greedy):
    stopped = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, stop=["Paris"]),
                           use_tqdm=False)[0].outputs[0]
    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, stop=["Paris"],
                                               include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert (stopped.text, stopped.stop_reason) == (" ", "Paris")
    assert (kept.text, kept.stop_reason) == (" Paris", "Paris")
    period = greedy.token_ids[1]
    by_token = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[period]),
                            use_tqdm=False)[0].outputs[0]
    assert (by_token.text, by_token.stop_reason, by_token.finish_reason) == (" Paris", period, "stop")
    assert greedy.stop_reason is None and greedy.finish_reason == "length"


def test_logit_bias_allowed_token_ids_and_bad_words(llm, greedy):
    paris = greedy.token_ids[0]
    biased = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, logit_bias={paris: -100.0}),
                          use_tqdm=False)[0].outputs[0]
    assert paris not in biased.token_ids
    banned = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, bad_words=["Paris"]),
                          use_tqdm=False)[0].outputs[0]
    assert "Paris" not in banned.text
    allowed = set(greedy.token_ids[:3])
    sampled = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=0, max_tokens=12, ignore_eos=True,
                                                  allowed_token_ids=sorted(allowed)), use_tqdm=False)[0].outputs[0]
    assert set(sampled.token_ids) <= allowed


def test_truncate_prompt_tokens_and_clone(llm):
    params = SamplingParams(temperature=0, max_tokens=2, truncate_prompt_tokens=2, stop=["x"])
    output = llm.generate("one two three four five six", params, use_tqdm=False)[0]
    assert output.prompt_token_ids == llm.get_tokenizer().encode("one two three four five six")[-2:]
    copy = params.clone()
    copy.stop.append("y")
    assert params.stop == ["x"] and copy.truncate_prompt_tokens == 2


def test_chat_continue_final_message(llm):
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "The fruit I pick is"}]
    output = llm.chat(messages, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False,
                      continue_final_message=True)[0]
    prompt = llm.get_tokenizer().decode(output.prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith("<|im_start|>assistant\nThe fruit I pick is") and output.outputs[0].text
    with pytest.raises(ValueError, match="exclude each other"):
        llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, continue_final_message=True)
