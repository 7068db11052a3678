"""/openapi.json tells the truth: schemathesis, all checks, against a real server; and /metrics is Prometheus."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_server_lifecycle import running_server

from shrike.server.middleware import OPEN_PATHS

API_KEY = "openapi-key"
MAX_MODEL_LEN = 64  # keeps every generated request short
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("openapi") / "server.log"
    with running_server(default_model_dir, log, "--api-key", API_KEY, "--max-num-seqs", "4") as server:
        yield server


@pytest.fixture(scope="module")
def short_server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("openapi-short") / "server.log"
    # running_server passes --max-model-len 2048 first; the later flag wins.
    with running_server(default_model_dir, log, "--api-key", API_KEY, "--max-num-seqs", "4",
                        "--max-model-len", str(MAX_MODEL_LEN), "--no-web-ui") as server:
        yield server


@pytest.fixture(scope="module")
def document(server) -> dict:
    return httpx.get(f"{server.base_url}/openapi.json").json()


def test_schemathesis_finds_nothing(short_server, tmp_path):
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{short_server.base_url}/openapi.json",
               "--checks", "all", "--seed", "20261201", "--max-examples", "3", "--workers", "1",
               "--header", f"Authorization: Bearer {API_KEY}", "--generation-database", "none",
               "--request-timeout", "120", "--max-response-time", "120", "--no-color",
               "--report", "junit", "--report-dir", str(tmp_path)]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "11 selected" in run.stdout and "passed" in run.stdout


def test_every_error_is_documented_with_the_openai_schema(document):
    assert "HTTPValidationError" not in document["components"]["schemas"]
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
            for code, response in operation["responses"].items():
                if code != "200":
                    assert response["content"]["application/json"]["schema"] == error_ref, (method, path, code)
    completions = document["paths"]["/v1/completions"]["post"]
    assert set(completions["responses"]) == {"200", "400", "401", "404", "408", "413", "503"}
    assert set(completions["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert completions["security"] == [{"bearer": []}]
    # Every route the key guards says so, and the open ones say nothing.
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            guarded = path not in OPEN_PATHS
            assert (operation.get("security") == [{"bearer": []}]) == guarded, (method, path)
            assert ("401" in operation["responses"]) == guarded, (method, path)
    assert "/tokenize" in document["paths"] and "/tokenizer_info" in document["paths"]
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "content" not in document["paths"]["/health"]["get"]["responses"]["200"]
    assert "/" not in document["paths"] and "/tokenizer_info" in document["paths"]


def test_documented_bounds_are_the_servers(server, document):
    chat = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "integer", "minimum": 1, "maximum": 2047} in chat["max_completion_tokens"]["anyOf"]
    assert chat["n"]["maximum"] == 4
    http = httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    messages = [{"role": "user", "content": "Hi"}]
    assert http.post("/v1/chat/completions", json={"messages": messages, "n": 5, "max_tokens": 1}).status_code == 400
    assert http.post("/v1/chat/completions", json={"messages": messages, "n": 4, "max_tokens": 1}).status_code == 200
    # Integers as JSON writes them either way; strings are not integers.
    assert http.post("/v1/completions", json={"prompt": [1.0, 2.0], "max_tokens": 1.0}).status_code == 200
    refused = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": "1"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_metrics_are_prometheus_text_with_process_metrics(server):
    response = httpx.get(f"{server.base_url}/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    for name, kind in [("shrike:num_requests_running", "gauge"), ("shrike:prompt_tokens", "counter"),
                       ("shrike:time_to_first_token_seconds", "histogram"), ("process_cpu_seconds", "counter"),
                       ("process_resident_memory_bytes", "gauge"), ("python_info", "gauge")]:
        assert families[name].type == kind, name
    buckets = [s.labels["le"] for s in families["shrike:time_to_first_token_seconds"].samples
               if s.name.endswith("_bucket")]
    assert buckets[:3] == ["0.001", "0.005", "0.01"] and buckets[-1] == "+Inf" and len(buckets) == 23
    assert "_created" not in response.text


def test_chat_page_can_be_turned_off(server, short_server):
    page = httpx.get(f"{server.base_url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{server.base_url}/web/app.js").headers["content-type"].startswith("text/javascript")
    off = httpx.get(f"{short_server.base_url}/")
    assert off.status_code == 404 and off.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("constraints", [
    {"guided_regex": "a+", "guided_choice": ["a"]},
    {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
    {"structured_outputs": {}},
    {"response_format": {"type": "json_object"}, "guided_regex": "a+"},
    {"structured_outputs": {"regex": "a+"}, "guided_choice": ["a"]},
    {"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "guided_choice": ["a"]},
], ids=["two guided", "two structured keys", "no structured key", "format and guided", "structured and guided",
        "forced call and guided"])
def test_what_the_server_refuses_together_the_document_forbids(server, document, constraints):
    from jsonschema import Draft202012Validator
    validator = Draft202012Validator({"$ref": "#/components/schemas/ChatCompletionRequest",
                                      "components": document["components"]})
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    assert validator.is_valid({**body, "guided_regex": "a+"})
    assert not validator.is_valid({**body, **constraints})
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, **constraints}, timeout=120,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 400, response.text


def test_docs_and_redoc_load_nothing_from_the_internet(server):
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{server.base_url}{page}").text
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert assets and "cdn" not in html, html
        for asset in assets:
            assert asset.startswith("/"), asset  # served by this server, not fetched from elsewhere
            response = httpx.get(f"{server.base_url}{asset}")
            assert response.status_code == 200 and len(response.content) > 1000, asset
