"""`shrike serve --ray` on a real local Ray cluster (HTTP on 127.0.0.1): two SmolLM2 replicas of one CPU each.

One cluster serves the whole module, and the tests run in order: the API through the official
openai client, prefix affinity, load spreading, a replica killed mid-stream, then SIGTERM, which
must drain the stream in flight and leave no Ray process behind.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from shrike.server.child import ServerProcess
from test_server_lifecycle import SERVED_NAME

STARTUP_TIMEOUT_SECONDS = 240
API_KEY = "ray-test-key"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# ~1,900 characters (~400 tokens) shared by every request of the prefix test.
SHARED_SYSTEM_PROMPT = ("You answer questions about European geography for a travel agency. Keep every answer to "
                        "one short sentence, name the country first, and never invent facts. ") * 12


@dataclass
class Cluster:
    server: ServerProcess
    gcs_address: str
    ray_processes: set[tuple[int, str]]  # (pid, start time) of every process under `shrike serve --ray`

    @property
    def process(self) -> subprocess.Popen:
        return self.server.process

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def log(self) -> str:
        return self.server.log


def _ray_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a cluster of its own
    # A throwaway test cluster needs no token; the test joins it to kill a replica.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


@pytest.fixture(scope="module")
def cluster(default_model_dir, tmp_path_factory) -> Iterator[Cluster]:
    server = ServerProcess([str(default_model_dir), "--ray", "--num-replicas", "2", "--cpus-per-replica", "1",
                            "--served-model-name", SERVED_NAME, "--api-key", API_KEY, "--max-model-len", "1024",
                            "--kv-cache-space", "0.25", "--disable-log-stats"],
                           tmp_path_factory.mktemp("ray") / "serve.log", env=_ray_env())
    started = re.compile(r"serving .* on Ray \(local cluster (\S+)\)")
    try:
        server.wait_ready(STARTUP_TIMEOUT_SECONDS,
                          lambda: bool(started.search(server.log)) and _health(server.base_url).get("status") == "ok")
        yield Cluster(server, started.search(server.log).group(1), _descendants(server.pid))
    finally:
        server.stop(timeout=60)


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=API_KEY, timeout=60, max_retries=0)


def _health(base_url: str) -> dict:
    try:
        return httpx.get(f"{base_url}/health", timeout=5).json()
    except (httpx.TransportError, ValueError):
        return {}


def _descendants(root: int) -> set[tuple[int, str]]:
    parents: dict[int, int] = {}
    start_times: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)], start_times[int(entry.name)] = int(fields[1]), fields[19]
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found |= {(pid, start_times[pid]) for pid in frontier}
    return found


def _still_running(processes: set[tuple[int, str]]) -> list[str]:
    alive = []
    for pid, start_time in processes:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[19] == start_time and fields[0] != "Z":
            alive.append(f"{pid} {cmdline[:120]}")
    return alive


def _replica_metric(base_url: str, name: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf'^{re.escape(name)}{{replica="([^"]+)"[^}}]*}} (\S+)$', text, re.MULTILINE)}


def test_chat_and_its_stream_give_the_same_answer_with_the_replica_named(client):
    raw = client.chat.completions.with_raw_response.create(model=SERVED_NAME, messages=QUESTION, max_tokens=16,
                                                           temperature=0)
    answer = raw.parse().choices[0].message.content
    assert "Paris" in answer
    assert raw.headers["x-shrike-replica"]
    stream = client.chat.completions.create(model=SERVED_NAME, messages=QUESTION, max_tokens=16, temperature=0,
                                            stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == answer


def test_completions_models_errors_and_auth_behave_as_on_one_machine(cluster, client):
    completion = client.completions.create(model=SERVED_NAME, prompt="The capital of France is", max_tokens=3,
                                           temperature=0)
    assert "Paris" in completion.choices[0].text
    assert [m.id for m in client.models.list().data] == [SERVED_NAME]
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=SERVED_NAME, prompt="Hello", max_tokens=-1)
    assert bad.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="Hello", max_tokens=2)
    auth = {"Authorization": f"Bearer {API_KEY}"}  # the tokenizer routes need the key too
    tokens = httpx.post(f"{cluster.base_url}/tokenize", json={"prompt": "The capital of France is"}, headers=auth,
                        timeout=30)
    detokenized = httpx.post(f"{cluster.base_url}/detokenize", json={"tokens": tokens.json()["tokens"]},
                             headers=auth, timeout=30)
    assert detokenized.json()["prompt"] == "The capital of France is"
    wrong_key = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()


def test_a_shared_prefix_stays_on_one_replica_and_hits_its_prefix_cache(cluster, client):
    hits_before = _replica_metric(cluster.base_url, "shrike:prefix_cache_hits_total")
    replicas = []
    for question in ["Where is Lisbon?", "Where is Oslo?", "Where is Vienna?", "Where is Dublin?"]:
        raw = client.chat.completions.with_raw_response.create(
            model=SERVED_NAME, max_tokens=2, messages=[{"role": "system", "content": SHARED_SYSTEM_PROMPT},
                                                       {"role": "user", "content": question}])
        replicas.append(raw.headers["x-shrike-replica"])
    assert len(set(replicas)) == 1, replicas
    hits = _replica_metric(cluster.base_url, "shrike:prefix_cache_hits_total")
    # The three requests after the first reuse the ~400-token system prompt.
    assert hits[replicas[0]] - hits_before.get(replicas[0], 0) >= 3 * 300


def test_a_burst_of_unrelated_prompts_spreads_over_both_replicas(client):
    def ask(i: int) -> str:
        raw = client.completions.with_raw_response.create(model=SERVED_NAME, prompt=f"Story {i}: once upon a",
                                                          max_tokens=8, temperature=0)
        return raw.headers["x-shrike-replica"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replicas = list(pool.map(ask, range(8)))
    assert len(set(replicas)) == 2, replicas


def test_a_killed_replica_fails_only_its_stream_and_ray_replaces_it(cluster, client, monkeypatch):
    import ray

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    raw = client.chat.completions.with_raw_response.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=400,
        stream=True, extra_body={"ignore_eos": True})
    victim = raw.headers["x-shrike-replica"]
    chunks = iter(raw.parse())
    next(chunks)
    ray.init(address=cluster.gcs_address, logging_level="ERROR", log_to_driver=False)
    try:
        ray.kill(ray.get_actor(f"SERVE_REPLICA::shrike#ShrikeReplica#{victim}", namespace="serve"))
    finally:
        ray.shutdown()
    killed_at = time.monotonic()
    with pytest.raises(openai.APIError) as lost:
        for _ in chunks:
            pass
    assert lost.value.body["code"] == "replica_lost"
    assert time.monotonic() - killed_at < 20

    # New requests go to the survivor while Ray brings up a replacement.
    survivors = set()
    for i in range(3):
        raw = client.completions.with_raw_response.create(model=SERVED_NAME, prompt=f"Count {i}", max_tokens=2)
        survivors.add(raw.headers["x-shrike-replica"])
    assert victim not in survivors
    assert _health(cluster.base_url)["status"] == "degraded"
    cluster.server.wait_ready(120, lambda: _health(cluster.base_url).get("status") == "ok")  # replica replaced
    replicas = set(_replica_metric(cluster.base_url, "shrike:generation_tokens_total"))
    assert len(replicas) == 2 and victim not in replicas


def test_sigterm_drains_the_stream_in_flight_and_leaves_no_ray_process(cluster, client):
    stream = client.completions.create(model=SERVED_NAME, prompt="Once upon a time", max_tokens=24, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    texts = [next(chunks).choices[0].text]
    cluster.process.send_signal(signal.SIGTERM)
    finish_reasons = []
    for chunk in chunks:
        texts.append(chunk.choices[0].text)
        finish_reasons.append(chunk.choices[0].finish_reason)
    assert finish_reasons[-1] == "length" and len(texts) > 1
    assert cluster.process.wait(timeout=60) == 0
    deadline = time.monotonic() + 15
    while _still_running(cluster.ray_processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _still_running(cluster.ray_processes), cluster.log[-3000:]
