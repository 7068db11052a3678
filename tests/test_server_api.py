"""The OpenAI-compatible API of a real `shrike serve`, through the official openai client."""
from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest
from test_server_lifecycle import SERVED_NAME, running_server

API_KEY = "test-key"
MAX_NUM_SEQS = 4
MAX_QUEUE_LEN = 2
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    # float32: bfloat16 matmuls round differently with the batch's shape (greedy logprobs drift by up to 0.06
    # between a lone and a batched request here), which flips near-tied tokens; float32 drifts by ~3e-6.
    with running_server(default_model_dir, log, "--api-key", API_KEY, "--max-num-seqs", str(MAX_NUM_SEQS),
                        "--max-queue-len", str(MAX_QUEUE_LEN), "--dtype", "float32") as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c


def metrics(http: httpx.Client) -> dict[str, float]:
    values = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            # prometheus_client writes labels in alphabetical order
            values[re.sub(r'model_name="[^"]*",?|,model_name="[^"]*"', "", name).replace("{}", "")] = float(value)
    return values


def wait_until_idle(http: httpx.Client, timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(http)
        if m["shrike:num_requests_running"] == 0 and m["shrike:num_requests_waiting"] == 0 \
                and m["shrike:kv_cache_usage_perc"] == 0:
            return m
        assert time.monotonic() < deadline, f"the engine did not become idle: {m}"
        time.sleep(0.1)


def chat(client, **kwargs):
    return client.chat.completions.create(model=SERVED_NAME, **{"messages": QUESTION, **kwargs})


def test_models_lists_the_served_name(client):
    models = client.models.list().data
    assert [m.id for m in models] == [SERVED_NAME]


def test_chat_answers_with_exact_usage(client, http):
    response = chat(client, max_tokens=16, temperature=0)
    choice = response.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    prompt_tokens = http.post("/tokenize", json={"messages": QUESTION}).json()["count"]
    assert response.usage.prompt_tokens == prompt_tokens
    assert response.usage.total_tokens == prompt_tokens + response.usage.completion_tokens
    if choice.finish_reason == "length":
        assert response.usage.completion_tokens == 16
    else:
        assert choice.finish_reason == "stop"
        assert response.usage.completion_tokens < 16


def test_max_completion_tokens_ends_with_length(client):
    response = chat(client, max_completion_tokens=3, temperature=0)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 3


def test_streamed_chat_matches_the_plain_answer(client):
    plain = chat(client, max_tokens=10, temperature=0)
    chunks = list(chat(client, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [plain.choices[0].finish_reason]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage


def test_chat_logprobs_list_the_top_alternatives(client):
    response = chat(client, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    assert "".join(entry.token for entry in content).startswith(response.choices[0].message.content)
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token


def test_chat_n2_with_a_seed_is_reproducible(client):
    first = chat(client, max_tokens=8, temperature=1.0, n=2, seed=1234, logprobs=True)
    again = chat(client, max_tokens=8, temperature=1.0, n=2, seed=1234, logprobs=True)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    # Each choice has its own stream of randomness.
    assert first.choices[0].message.content != first.choices[1].message.content
    assert first.usage.completion_tokens == sum(len(c.logprobs.content) for c in first.choices)


def test_stop_string_cuts_the_text_before_it(client):
    prompt = "The days of the week are Monday, Tuesday, Wednesday,"
    full = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert "Friday" in text, text
    stopped = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                        stop=["Friday", "never appears"])
    assert stopped.choices[0].text == text[:text.index("Friday")]
    assert stopped.choices[0].finish_reason == "stop"


def test_completion_echo_with_logprobs(client, http):
    prompt = "The capital of France is"
    response = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                         logprobs=2)
    choice = response.choices[0]
    prompt_ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 3 == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[token] == pytest.approx(logprob) and 1 <= len(top) <= 3
    assert response.usage.prompt_tokens == len(prompt_ids)


def test_token_id_prompt_equals_text_prompt(client, http):
    prompt = "Water boils at"
    ids = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    by_text = client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=6, temperature=0)
    by_ids = client.completions.create(model=SERVED_NAME, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage == by_text.usage


def test_prompt_list_with_n2_numbers_choices_per_prompt(client):
    prompts = ["One, two,", "Red, green,"]
    response = client.completions.create(model=SERVED_NAME, prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    lone = [client.completions.create(model=SERVED_NAME, prompt=p, max_tokens=4, temperature=0) for p in prompts]
    assert [c.text for c in response.choices] == [lone[0].choices[0].text] * 2 + [lone[1].choices[0].text] * 2
    assert response.usage.prompt_tokens == sum(r.usage.prompt_tokens for r in lone)
    assert response.usage.completion_tokens == 2 * sum(r.usage.completion_tokens for r in lone)


def test_streamed_completion_with_usage(client):
    plain = client.completions.create(model=SERVED_NAME, prompt="Roses are red,", max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model=SERVED_NAME, prompt="Roses are red,", max_tokens=8,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage == plain.usage


def _requests() -> list[tuple[str, dict]]:
    """Different endpoints and parameters, all greedy so the answer is fixed."""
    return [
        ("chat", {"messages": QUESTION, "max_tokens": 12, "temperature": 0}),
        ("chat", {"messages": [{"role": "system", "content": "Answer in one word."},
                               {"role": "user", "content": "Name a colour."}], "max_tokens": 6, "temperature": 0,
                  "logprobs": True, "top_logprobs": 2}),
        ("completion", {"prompt": "The days of the week are Monday,", "max_tokens": 10, "temperature": 0,
                        "stop": ["Thursday"]}),
        ("completion", {"prompt": "1, 2, 3,", "max_tokens": 7, "temperature": 0, "echo": True}),
    ]


async def _ask(client: openai.AsyncOpenAI, kind: str, params: dict, stream: bool):
    if kind == "chat":
        create = client.chat.completions.create
    else:
        create = client.completions.create
    if not stream:
        response = await create(model=SERVED_NAME, **params)
        choice = response.choices[0]
        return (choice.message.content if kind == "chat" else choice.text), choice.finish_reason
    parts, finish = [], None
    async for chunk in await create(model=SERVED_NAME, stream=True, **params):
        for choice in chunk.choices:
            parts.append((choice.delta.content if kind == "chat" else choice.text) or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


def test_concurrent_clients_get_what_a_lone_request_gets(server):
    async def run():
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0,
                                      timeout=120) as client:
            lone = [await _ask(client, kind, params, stream=False) for kind, params in _requests()]
            together = await asyncio.gather(*[_ask(client, kind, params, stream=i % 2 == 0)
                                              for i, (kind, params) in enumerate(_requests())])
            return lone, together
    lone, together = asyncio.run(run())
    assert together == lone


def test_client_disconnect_mid_stream_aborts_and_frees_the_request(http):
    before = wait_until_idle(http)
    body = {"model": SERVED_NAME, "prompt": "Tell a long story.", "max_tokens": 1500, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        for _ in range(3):
            next(events)
        running = metrics(http)
        assert running["shrike:num_requests_running"] == 1 and running["shrike:kv_cache_usage_perc"] > 0
    after = wait_until_idle(http, timeout=10)
    aborted = 'shrike:request_success_total{finished_reason="abort"}'
    assert after[aborted] == before[aborted] + 1


def test_non_streamed_client_that_leaves_is_aborted_too(server, http):
    before = wait_until_idle(http)
    body = {"model": SERVED_NAME, "prompt": "Tell a long story.", "max_tokens": 1500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=httpx.Timeout(10, read=1.0))
    after = wait_until_idle(http, timeout=10)
    aborted = 'shrike:request_success_total{finished_reason="abort"}'
    assert after[aborted] == before[aborted] + 1


def test_a_full_queue_answers_503_with_retry_after(http):
    wait_until_idle(http)
    long = {"model": SERVED_NAME, "prompt": "Count:", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    per_stream = (MAX_NUM_SEQS + MAX_QUEUE_LEN) // 2
    with OpenStreams(http, [{**long, "n": per_stream}] * 2):
        response = http.post("/v1/completions", json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 1})
        assert response.status_code == 503
        assert response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["code"] == "queue_full"
    wait_until_idle(http, timeout=10)
    assert http.post("/v1/completions", json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 1}).status_code == 200


class OpenStreams:
    """Holds several streamed requests open (each past its first event) for the duration of a with block."""

    def __init__(self, http: httpx.Client, bodies: list[dict]):
        self.http, self.bodies, self.streams, self.lines = http, bodies, [], []

    def __enter__(self):
        for body in self.bodies:
            stream = self.http.stream("POST", "/v1/completions", json=body)
            response = stream.__enter__()
            self.streams.append(stream)
            assert response.status_code == 200
            # Held on to: a line iterator that is garbage-collected closes the response.
            lines = response.iter_lines()
            self.lines.append(lines)
            next(line for line in lines if line.startswith("data: "))
        return self

    def __exit__(self, *exc):
        for stream in self.streams:
            stream.__exit__(None, None, None)


def test_metrics_count_tokens_requests_and_latency(client, http):
    before = wait_until_idle(http)
    response = chat(client, max_tokens=4, temperature=0)
    after = metrics(http)
    assert after["shrike:prompt_tokens_total"] - before["shrike:prompt_tokens_total"] == response.usage.prompt_tokens
    assert after["shrike:generation_tokens_total"] - before["shrike:generation_tokens_total"] == \
        response.usage.completion_tokens
    reason = f'shrike:request_success_total{{finished_reason="{response.choices[0].finish_reason}"}}'
    assert after[reason] == before[reason] + 1
    assert after["shrike:time_to_first_token_seconds_count"] == before["shrike:time_to_first_token_seconds_count"] + 1
    assert after["shrike:inter_token_latency_seconds_count"] == \
        before["shrike:inter_token_latency_seconds_count"] + response.usage.completion_tokens - 1
    assert after["shrike:e2e_request_latency_seconds_count"] == before["shrike:e2e_request_latency_seconds_count"] + 1
    text = http.get("/metrics").text
    assert "# TYPE shrike:time_to_first_token_seconds histogram" in text
    assert 'shrike:time_to_first_token_seconds_bucket{le="+Inf",model_name="shrike-test"}' in text


def test_repeated_prompt_is_served_from_the_prefix_cache(client, http):
    messages = [{"role": "system", "content": "You are a terse assistant. Answer with one word only, please."},
                {"role": "user", "content": "Name a colour of the sky on a clear day."}]
    client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=2, temperature=0)
    before = metrics(http)
    response = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=2, temperature=0)
    after = metrics(http)
    hits = after["shrike:prefix_cache_hits_total"] - before["shrike:prefix_cache_hits_total"]
    assert hits >= response.usage.prompt_tokens - 2 * 16  # all but the last partial block or two
    assert after["shrike:prefix_cache_queries_total"] > before["shrike:prefix_cache_queries_total"]


def test_api_key_guards_v1_but_not_health(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.get(f"{server.base_url}/v1/models", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_tokenize_detokenize_round_trip_and_version(http):
    tokens = http.post("/tokenize", json={"prompt": "Hello, world!"}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 2048
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "Hello, world!"}
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", http.get("/version").json()["version"])
