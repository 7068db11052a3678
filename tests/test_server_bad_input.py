"""Every kind of bad input gets a 4xx with an OpenAI-style error body, and the server keeps serving."""
from __future__ import annotations

import json
import socket

import httpx
import pytest
from test_server_lifecycle import SERVED_NAME, running_server

MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 8
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", str(MAX_NUM_SEQS)) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def chat(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": HELLO, "max_tokens": 2, **fields}


def completion(**fields) -> dict:
    return {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 2, **fields}


LONG_PROMPT = "hello " * 3000

# (case id, path, JSON body or raw bytes, status, param, words the message must contain)
CASES = [
    ("malformed JSON", CHAT, b'{"messages": [', 400, None, "not valid JSON"),
    ("JSON that is not an object", CHAT, b'[1, 2]', 400, None, "valid dictionary"),
    ("invalid UTF-8", COMPLETIONS, b'{"prompt": "\xff\xfe"}', 400, None, "not valid UTF-8"),
    ("lone surrogate", COMPLETIONS, completion(prompt="a\ud800b"), 400, "prompt", "not valid Unicode"),
    ("messages not a list", CHAT, chat(messages="hi"), 400, "messages", "valid list"),
    ("max_tokens a string", CHAT, chat(max_tokens="many"), 400, "max_tokens", "valid integer"),
    ("temperature a string", COMPLETIONS, completion(temperature="hot"), 400, "temperature", "valid number"),
    ("stream an object", CHAT, chat(stream={"yes": 1}), 400, "stream", "valid boolean"),
    ("prompt missing", COMPLETIONS, {"model": SERVED_NAME}, 400, "prompt", "Field required"),
    ("prompt of mixed types", COMPLETIONS, completion(prompt=[1, "a"]), 400, "prompt", "valid integer, got 'a'"),
    ("empty prompt list", COMPLETIONS, completion(prompt=[]), 400, "prompt", "empty"),
    ("empty prompt", COMPLETIONS, completion(prompt=""), 400, "prompt", "empty"),
    ("token id out of vocabulary", COMPLETIONS, completion(prompt=[1, 10**9]), 400, "prompt", "token ids"),
    ("unknown model", CHAT, chat(model="gpt-4o"), 404, "model", "does not exist"),
    ("prompt longer than max-model-len", COMPLETIONS, completion(prompt=LONG_PROMPT), 400, "prompt",
     f"maximum context length is {MAX_MODEL_LEN}"),
    ("chat longer than max-model-len", CHAT, chat(messages=[{"role": "user", "content": LONG_PROMPT}]), 400,
     "messages", f"maximum context length is {MAX_MODEL_LEN}"),
    ("max_tokens that cannot fit", COMPLETIONS, completion(max_tokens=MAX_MODEL_LEN), 400, "max_tokens",
     "ask for at most"),
    ("max_completion_tokens that cannot fit", CHAT, chat(max_completion_tokens=10**12), 400, "max_tokens",
     "does not fit"),
    ("max_tokens zero", COMPLETIONS, completion(max_tokens=0), 400, "max_tokens", "at least 1"),
    ("temperature below 0", CHAT, chat(temperature=-0.5), 400, "temperature", ">= 0"),
    ("top_p zero", CHAT, chat(top_p=0), 400, "top_p", "(0, 1]"),
    ("top_p above 1", COMPLETIONS, completion(top_p=1.5), 400, "top_p", "(0, 1]"),
    ("top_k below -1", CHAT, chat(top_k=-2), 400, "top_k", "top_k"),
    ("n zero", CHAT, chat(n=0), 400, "n", "at least 1"),
    ("n too large", CHAT, chat(n=MAX_NUM_SEQS + 1), 400, "n", f"at most {MAX_NUM_SEQS}"),
    ("completion logprobs too many", COMPLETIONS, completion(logprobs=21), 400, "logprobs", "less than or equal"),
    ("completion logprobs negative", COMPLETIONS, completion(logprobs=-1), 400, "logprobs", "greater than"),
    ("top_logprobs too many", CHAT, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs", "less than"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), 400, "top_logprobs", "logprobs=true"),
    ("empty messages", CHAT, chat(messages=[]), 400, "messages", "at least 1"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role",
     "'wizard'"),
    ("image content", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages.0.content", "only text"),
    ("suffix", COMPLETIONS, completion(suffix="end"), 400, "suffix", "not supported"),
    ("response_format json_schema without a schema", CHAT, chat(response_format={"type": "json_schema"}), 400,
     "response_format", "json_schema.schema"),
    ("response_format invalid schema", CHAT, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objekt"}}}), 400, "response_format", "objekt"),
    ("logit_bias", CHAT, chat(logit_bias={"50256": -100}), 400, "logit_bias", "token ids in [0, 49152)"),
    ("min_tokens above max_tokens", COMPLETIONS, completion(min_tokens=5), 400, "min_tokens", "must not exceed"),
    ("presence_penalty out of range", CHAT, chat(presence_penalty=3), 400, "presence_penalty", "[-2, 2]"),
    ("seed beyond 64 bits", CHAT, chat(seed=2**70), 400, "seed", "less than or equal"),
    ("stop of empty string", COMPLETIONS, completion(stop=[""]), 400, "stop", "non-empty"),
    ("stop_token_ids out of vocabulary", COMPLETIONS, completion(stop_token_ids=[-1]), 400, "stop_token_ids",
     "token ids"),
    ("template kwargs clashing with the renderer", CHAT, chat(chat_template_kwargs={"messages": []}), 400,
     "chat_template_kwargs", "may not set 'messages'"),
    ("template kwargs setting tools to null", CHAT, chat(chat_template_kwargs={"tools": None}), 400,
     "chat_template_kwargs", "may not set 'tools'"),
    ("tokenize with neither prompt nor messages", "/tokenize", {}, 400, "prompt", "exactly one"),
    ("detokenize out of vocabulary", "/detokenize", {"tokens": [-5]}, 400, "tokens", "token ids"),
    ("unknown path", "/v1/edits", {}, 404, None, "Not Found"),
]


@pytest.mark.parametrize("path, body, status, param, words", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_input_gets_a_clear_4xx(http, path, body, status, param, words):
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        # ensure_ascii keeps lone surrogates as \\ud800 escapes, which is how a client would send them.
        response = http.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert words in error["message"]
    assert "Traceback" not in error["message"]


def test_wrong_method_is_405(http):
    response = http.get(CHAT)
    assert response.status_code == 405
    assert response.json()["error"]["message"]


def test_oversized_body_is_413_before_it_is_read(server):
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"POST {COMPLETIONS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {1 << 30}\r\n\r\n{{\"prompt\": ".encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413")
    assert '"code":"request_too_large"' in reply


def test_oversized_chunked_body_is_413(http):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(9):
            yield b"a" * (1 << 20)
        yield b'"}'
    response = http.post(COMPLETIONS, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_server_still_serves_after_all_of_it(http):
    assert http.get("/health").status_code == 200
    response = http.post(CHAT, json=chat(temperature=0))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] >= 1
