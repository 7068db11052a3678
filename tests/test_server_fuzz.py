"""Generated requests, valid and not, never get a 5xx, an error inside a stream, or a server that stops serving."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_server_lifecycle import SERVED_NAME, running_server

# Leaves include NaN and infinities: Python's json module (and so FastAPI) accepts them.
json_leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12))
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
# Wrong types for a count; neither integers nor null, so no valid but huge (or, for chat, absent) max_tokens
# slips in and keeps the model busy for minutes.
not_integers = st.booleans() | st.floats() | st.text(max_size=8) | st.lists(json_leaves, max_size=2)


def field(valid, anything=None):
    """A valid value, or (in noisy bodies) sometimes anything at all."""
    anything = json_values if anything is None else anything
    return lambda noisy: st.one_of(valid, valid, valid, anything) if noisy else valid


def count(low: int, high: int):
    return field(st.integers(low, high), not_integers)


text = st.text(max_size=30)
valid_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": text})
noisy_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "robot"]),
     "content": text | json_values | st.lists(st.fixed_dictionaries(
         {"type": st.sampled_from(["text", "image_url"]), "text": text}), max_size=2)},
    optional={"name": text, "tool_call_id": json_values})

sampling_fields = {
    "model": field(st.just(SERVED_NAME), st.sampled_from(["other-model", ""]) | json_values),
    "n": count(1, 3),
    "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "temperature": field(st.floats(0, 2), st.floats()),
    "top_p": field(st.floats(0.05, 1), st.floats()),
    "top_k": field(st.integers(-1, 60000), st.integers()),
    "min_p": field(st.floats(0, 0.5), st.floats()),
    "seed": field(st.integers(0, 2**32), st.integers()),
    "stop": field(st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=3)),
    "stop_token_ids": field(st.lists(st.integers(0, 49151), max_size=3), st.lists(st.integers(), max_size=3)),
    "presence_penalty": field(st.floats(-2, 2), st.floats()),
    "frequency_penalty": field(st.floats(-2, 2), st.floats()),
    "repetition_penalty": field(st.floats(0.5, 2), st.floats()),
    "min_tokens": count(0, 2),
    "ignore_eos": field(st.booleans()),
    "skip_special_tokens": field(st.booleans()),
    "logit_bias": field(st.just({}), st.dictionaries(text, st.floats(-100, 100), max_size=2)),
}

completion_fields = {
    **sampling_fields, "echo": field(st.booleans()), "logprobs": count(0, 5), "suffix": field(st.just(""), text),
    "best_of": count(1, 1)}
chat_fields = {
    **sampling_fields, "max_completion_tokens": count(1, 4), "logprobs": field(st.booleans()),
    "top_logprobs": count(0, 5),
    "response_format": field(st.just({"type": "text"}), st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "xml"])})),
    "tools": field(st.just([]), json_values), "tool_choice": field(st.sampled_from(["none", "auto"]), json_values),
    "chat_template_kwargs": field(st.fixed_dictionaries({"enable_thinking": st.booleans()}),
                                  st.dictionaries(st.sampled_from(["enable_thinking", "x", "messages"]), json_values,
                                                  max_size=2)),
    "add_generation_prompt": field(st.booleans())}


def body(required: dict, optional: dict, noisy: bool):
    return st.fixed_dictionaries({k: make(noisy) for k, make in required.items()},
                                 optional={k: make(noisy) for k, make in optional.items()})


def bodies(noisy: bool):
    prompt = field(text | st.lists(text, min_size=1, max_size=3) | st.lists(st.integers(0, 49151), min_size=1,
                                                                           max_size=8),
                   st.lists(st.integers(), max_size=8) | st.lists(st.lists(st.integers(-3, 60000), max_size=5),
                                                                   max_size=2))
    messages = field(st.lists(valid_message, min_size=1, max_size=3), st.lists(noisy_message, max_size=3))
    return st.one_of(
        st.tuples(st.just("/v1/completions"),
                  body({"prompt": prompt, "max_tokens": count(1, 4)}, completion_fields, noisy)),
        st.tuples(st.just("/v1/chat/completions"),
                  body({"messages": messages, "max_tokens": count(1, 4)}, chat_fields, noisy)),
        st.tuples(st.just("/tokenize"), body({}, {"prompt": field(text), "messages": messages,
                                                  "add_special_tokens": field(st.booleans())}, noisy)),
        st.tuples(st.just("/detokenize"), body({"tokens": field(st.lists(st.integers(0, 49151), max_size=6),
                                                                st.lists(st.integers(), max_size=6))}, {}, noisy)),
    )


requests = st.one_of(
    bodies(noisy=False),
    bodies(noisy=True),
    st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), st.binary(max_size=40)),
)


@pytest.fixture(scope="module")
def http(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "4") as server:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            yield client


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(requests)
def test_generated_requests_never_get_a_server_error(http, generated):
    path, body = generated
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with http.stream("POST", path, content=content, headers={"Content-Type": "application/json"}) as response:
        raw = response.read().decode()
    event(f"{path} {response.status_code}")  # shown by --hypothesis-show-statistics
    assert response.status_code < 500, raw
    if response.status_code >= 400:
        error = json.loads(raw)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for data in events[:-1]:
            assert "error" not in json.loads(data), data
    else:
        json.loads(raw)


def test_server_is_healthy_and_idle_afterwards(http):
    assert http.get("/health").status_code == 200
    deadline = time.monotonic() + 10
    while "shrike:num_requests_running{model_name=\"shrike-test\"} 0.0" not in http.get("/metrics").text:
        assert time.monotonic() < deadline
        time.sleep(0.1)
