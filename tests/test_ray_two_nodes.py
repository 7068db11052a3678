"""`shrike serve --ray` on a two-node Ray cluster on this machine (two raylets on 127.0.0.1, one CPU each,
so one replica per node): losing the second node fails only what it was computing, the first keeps serving,
/health says degraded, and the node restarted rejoins and takes traffic again."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from shrike.server.child import ServerProcess, free_port
from test_ray_serve import _health
from test_server_lifecycle import SERVED_NAME

pytest.importorskip("ray")

STARTUP_TIMEOUT_SECONDS = 300
RAY = str(Path(sys.executable).with_name("ray"))


def _pids(pattern: str) -> set[int]:
    """Processes whose command line contains pattern (our temp dir: only this test's Ray processes)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if pattern in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class TwoNodes:
    def __init__(self, temp_dir: Path):
        self.temp_dir = temp_dir
        self.port = free_port()
        self.env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.second_node_raylets: set[int] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _ray_start(self, *flags: str, env: dict | None = None) -> None:
        subprocess.run([RAY, "start", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats",
                        "--object-store-memory", str(100 << 20), *flags], env=env or self.env, check=True,
                       capture_output=True, timeout=120)

    def start_head(self) -> None:
        self._ray_start("--head", "--port", str(self.port), "--include-dashboard", "false", "--temp-dir",
                        str(self.temp_dir), "--resources", '{"first_node": 1}')

    def start_second(self) -> None:
        before = self._raylets()
        # Serve starts an HTTP proxy on every node: the second one on this machine needs a port of its own.
        env = {**self.env, "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(free_port())}
        self._ray_start("--address", self.address, "--resources", '{"second_node": 1}', env=env)
        self.second_node_raylets = self._raylets() - before

    def kill_second(self) -> None:
        for pid in self.second_node_raylets:
            os.kill(pid, signal.SIGKILL)

    def _raylets(self) -> set[int]:
        return {pid for pid in _pids(str(self.temp_dir)) if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet"}

    def stop(self) -> None:
        for pid in _pids(str(self.temp_dir)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    # Ray's socket paths must stay short: a temp dir of our own under /tmp, not pytest's deep one.
    temp_dir = Path(f"/tmp/shrike-ray-{os.getpid()}")
    nodes = TwoNodes(temp_dir)
    try:
        nodes.start_head()
        nodes.start_second()
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def server(nodes, default_model_dir, tmp_path_factory):
    server = ServerProcess([str(default_model_dir), "--ray", "--ray-address", nodes.address, "--num-replicas", "2",
                            "--cpus-per-replica", "1", "--request-router", "power-of-two", "--served-model-name",
                            SERVED_NAME, "--max-model-len", "1024", "--kv-cache-space", "0.25",
                            "--disable-log-stats"], tmp_path_factory.mktemp("ray-two-nodes") / "serve.log",
                           env=nodes.env)
    try:
        server.wait_ready(STARTUP_TIMEOUT_SECONDS, lambda: _health(server.base_url).get("status") == "ok")
        yield server
    finally:
        server.stop(timeout=60)


def _replicas_answering(client: openai.OpenAI, count: int) -> list[str]:
    def ask(i: int) -> str:
        raw = client.completions.with_raw_response.create(model=SERVED_NAME, prompt=f"Story {i}: once upon a",
                                                          max_tokens=4, temperature=0)
        return raw.headers["x-shrike-replica"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(ask, range(count)))


def test_losing_a_node_fails_only_its_requests_and_a_restarted_node_rejoins(nodes, server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=60, max_retries=0)
    before = set(_replicas_answering(client, 8))
    assert len(before) == 2, before  # one replica per node, both serving

    # Streams in flight on both nodes; then the second node's raylet dies (its workers with it).
    streams = []
    for i in range(4):
        raw = client.completions.with_raw_response.create(
            model=SERVED_NAME, prompt=f"Tale {i}: long ago", max_tokens=300, stream=True,
            extra_body={"ignore_eos": True})
        chunks = iter(raw.parse())
        next(chunks)
        streams.append((raw.headers["x-shrike-replica"], chunks))
    assert {replica for replica, _ in streams} == before
    nodes.kill_second()
    outcomes: dict[str, set[str]] = {}
    for replica, chunks in streams:
        try:
            finish = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1]
            outcomes.setdefault(replica, set()).add(f"finished:{finish}")
        except openai.APIError as error:
            outcomes.setdefault(replica, set()).add(f"error:{(error.body or {}).get('code', type(error).__name__)}")
    lost = [replica for replica, results in outcomes.items() if results == {"error:replica_lost"}]
    assert len(lost) == 1, outcomes  # the second node's replica: only its streams failed, with the SSE error
    survivor = (before - set(lost)).pop()
    assert outcomes[survivor] == {"finished:length"}, outcomes

    deadline = time.monotonic() + 60
    while _health(server.base_url).get("status") != "degraded":
        assert time.monotonic() < deadline, _health(server.base_url)
        time.sleep(1)
    assert set(_replicas_answering(client, 4)) == {survivor}

    nodes.start_second()
    server.wait_ready(STARTUP_TIMEOUT_SECONDS, lambda: _health(server.base_url).get("status") == "ok")
    after = set(_replicas_answering(client, 8))
    assert survivor in after and len(after - before) == 1, (before, after)  # a new replica, on the rejoined node


def test_the_http_port_listens_on_loopback_only(server):
    port = server.port
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines()}
    assert addresses == {"127.0.0.1"}, listening
