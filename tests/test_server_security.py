"""The basics a server on a shared network needs: the API key guards everything that reaches the model,
limits hold whatever form a prompt takes, and no error body shows a path or a traceback."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest
from test_server_lifecycle import SERVED_NAME, running_server

import shrike
from shrike.server.middleware import OPEN_PATHS

API_KEY = "security-test-key"
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 4
MAX_QUEUE_LEN = 2
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--api-key", API_KEY, "--max-num-seqs", str(MAX_NUM_SEQS),
                        "--max-queue-len", str(MAX_QUEUE_LEN)) as server:
        yield server


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=60) as client:
        yield client


def _routes(server) -> dict[str, list[str]]:
    """Every route the application declares (from its OpenAPI schema), with its methods."""
    schema = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()
    return {path: [method.upper() for method in operations] for path, operations in schema["paths"].items()}


def test_every_route_but_the_open_ones_needs_the_key(server):
    routes = _routes(server)
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize"} <= set(routes)
    guarded = {path: methods for path, methods in routes.items() if path not in OPEN_PATHS}
    for path, methods in guarded.items():
        for method in methods:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
                response = httpx.request(method, f"{server.base_url}{path}", headers=headers, json={}, timeout=10)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"]["code"] == "invalid_api_key"
                assert response.headers["WWW-Authenticate"] == "Bearer"
            with_key = httpx.request(method, f"{server.base_url}{path}", headers=AUTH, json={}, timeout=60)
            assert with_key.status_code != 401, (method, path)
    # A path the application does not have is refused the same way, so probing reveals nothing.
    assert httpx.get(f"{server.base_url}/v2/secret", timeout=10).status_code == 401


def test_probes_and_monitoring_stay_open(server):
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{server.base_url}{path}", timeout=10).status_code == 200, path
    assert "shrike:kv_cache_blocks" in httpx.get(f"{server.base_url}/metrics", timeout=10).text


def test_tokenizer_routes_need_the_key(server):
    assert httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hi"}, timeout=10).status_code == 401
    assert httpx.post(f"{server.base_url}/detokenize", json={"tokens": [1]}, timeout=10).status_code == 401
    assert httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hi"}, headers=AUTH, timeout=10).status_code == 200


@pytest.mark.parametrize("path, body, param, words", [
    # A token-id prompt is held to the context length like a text prompt, before anything decodes it.
    ("/v1/completions", {"prompt": [1] * MAX_MODEL_LEN}, "prompt", "maximum context length is 2048"),
    ("/v1/completions", {"prompt": [[1, 2], [1] * (MAX_MODEL_LEN + 1)]}, "prompt", "maximum context length"),
    ("/v1/completions", {"prompt": "hi " * (MAX_MODEL_LEN + 10)}, "prompt", "maximum context length"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * (MAX_MODEL_LEN + 10)}]},
     "messages", "maximum context length"),
    # max_tokens must fit the context next to the prompt, whatever n is.
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": MAX_MODEL_LEN - 2}, "max_tokens", "does not fit"),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": MAX_MODEL_LEN, "n": 2}, "max_tokens", "does not fit"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 9},
     "max_tokens", "does not fit"),
    # n, alone or times the number of prompts, cannot exceed what the server holds.
    ("/v1/completions", {"prompt": "hi", "n": MAX_NUM_SEQS + 1}, "n", "at most 4"),
    ("/v1/completions", {"prompt": [[1]] * (MAX_NUM_SEQS + MAX_QUEUE_LEN + 1)}, None, "split it"),
    ("/v1/completions", {"prompt": [[1]] * 2, "n": MAX_NUM_SEQS}, None, "split it"),
    ("/v1/completions", {"prompt": [1, 2], "logprobs": 10 ** 6}, "logprobs", "less than or equal"),
])
def test_limits_hold_for_every_form_of_prompt(http, path, body, param, words):
    response = http.post(path, json={"model": SERVED_NAME, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_megabyte_token_id_prompt_is_refused_quickly(http):
    ids = [7] * 1_000_000  # about 2 MB of JSON: under the body limit, far over the context
    response = http.post("/v1/completions", json={"model": SERVED_NAME, "prompt": ids, "echo": True}, timeout=30)
    assert response.status_code == 400
    assert "maximum context length" in response.json()["error"]["message"]
    assert response.elapsed.total_seconds() < 10


def test_body_limit_applies_to_token_ids_too(http):
    response = http.post("/v1/completions", json={"model": SERVED_NAME, "prompt": [7] * 5_000_000})
    assert response.status_code == 413


def _error_responses(server, http) -> list[httpx.Response]:
    base = server.base_url
    return [
        httpx.get(f"{base}/v1/models", timeout=10),  # 401
        http.get("/no/such/route"),  # 404
        http.get("/v1/chat/completions"),  # 405
        http.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}),
        http.post("/v1/completions", content=b"\xff\xfe", headers={"Content-Type": "application/json"}),
        http.post("/v1/completions", json={"model": "../../etc/passwd", "prompt": "x"}),
        http.post("/v1/completions", json={"prompt": [10 ** 9]}),
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": -1}),
        http.post("/v1/completions", json={"prompt": "x", "suffix": "y"}),
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                "chat_template_kwargs": {"tools": 5}}),
        http.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                  headers={"Content-Type": "application/json"}),
        http.post("/tokenize", json={}),
        http.post("/detokenize", json={"tokens": [-1]}),
        http.post("/v1/completions", json={"prompt": "x" * (9 << 20)}),  # 413
    ]


def test_no_error_body_shows_a_path_or_a_traceback(server, http):
    revealing = [str(Path(shrike.__file__).parents[2]), sys.prefix, "site-packages", "Traceback", 'File "',
                 ".py", str(Path.home()), "/tmp/", "/usr/"]
    for response in _error_responses(server, http):
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        text = response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        for word in revealing:
            assert word not in text, (response.request.url, word, text)
        assert not re.search(r"(?<![\w.])/(?:home|root|work|opt|var|etc)/", text.replace("../../etc/passwd", "")), text
