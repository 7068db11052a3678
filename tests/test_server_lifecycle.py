"""`shrike serve` as a process: start-up line, bad flags, taken ports, SIGTERM/SIGINT exit 0.

Also home of `running_server`, which the other test_server_* modules use to start their server.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shrike.server.child import ServerProcess, serve_command

STARTUP_TIMEOUT_SECONDS = 180  # a cold start converts the default model first
SERVED_NAME = "shrike-test"


@contextlib.contextmanager
def running_server(model_dir: Path, log_path: Path, *flags: str) -> Iterator[ServerProcess]:
    """A real `shrike serve` on a free port, small enough to share the machine; stopped at the end."""
    server = ServerProcess([str(model_dir), "--served-model-name", SERVED_NAME, "--max-model-len", "2048",
                            "--kv-cache-space", "0.5", "--disable-log-stats", *flags], log_path)
    try:
        server.wait_ready(STARTUP_TIMEOUT_SECONDS)
        yield server
    finally:
        server.stop()
    assert "Traceback" not in server.log, server.log


def test_startup_line_and_sigterm_during_a_stream_exits_zero(default_model_dir, tmp_path):
    with running_server(default_model_dir, tmp_path / "server.log") as server:
        startup = [line for line in server.log.splitlines() if "serving" in line]
        assert len(startup) == 1
        for part in (f"'{SERVED_NAME}'", server.base_url, "dtype bfloat16", "kernels ", "KV cache ",
                     "--kv-cache-space 0.5 GiB", "parameters 0.13 B;"):
            assert part in startup[0]
        body = {"model": SERVED_NAME, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            server.process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        # The request in flight is finished, not cut off, before the server exits.
        assert '"finish_reason": "length"' in rest[-2]
        assert rest[-1] == "data: [DONE]"
        assert first
        assert server.process.wait(timeout=30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.base_url}/health", timeout=2)


def test_sigint_when_idle_exits_zero(default_model_dir, tmp_path):
    with running_server(default_model_dir, tmp_path / "server.log") as server:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0
        assert "Traceback" not in server.log


@pytest.mark.parametrize("flags, expected", [
    (["--port", "http"], "argument --port: 'http' is not a whole number"),
    (["--port", "70000"], "argument --port: 70000 is not a TCP port"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0 is below the minimum of 1"),
    (["--kv-cache-space", "-1"], "--kv-cache-space -1: give a size in GiB above 0, or leave it out"),
    (["--generation-config", "hf"], "argument --generation-config: invalid choice: 'hf'"),
    (["--dtype", "float8"], "--dtype 'float8' is not supported; use auto, float32, bfloat16"),
    (["--chat-template", "no/such/template.jinja"], "is neither a file nor a Jinja template"),
])
def test_bad_flag_value_is_one_line(flags, expected):
    result = subprocess.run(serve_command(*flags), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shrike serve: error: ")
    assert expected in lines[0]


def test_taken_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(serve_command("--port", str(port)), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"shrike serve: error: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "choose another --host or --port"]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_an_idle_server_uses_almost_no_cpu(default_model_dir, tmp_path):
    """After serving a request, the kernel workers and the engine loop go to sleep; the idle keep-alive
    connection stays open past the 5 s after which httpx clients drop theirs (serve.KEEP_ALIVE_SECONDS)."""
    limits = httpx.Limits(keepalive_expiry=60)
    with running_server(default_model_dir, tmp_path / "serve.log") as server, \
            httpx.Client(base_url=server.base_url, timeout=120, limits=limits) as client:
        response = client.post("/v1/completions", json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4})
        assert response.status_code == 200
        connection = response.extensions["network_stream"]
        time.sleep(3.0)
        window = 3.0
        before = _cpu_seconds(server.process.pid)
        time.sleep(window)
        used_ms_per_s = (_cpu_seconds(server.process.pid) - before) * 1000 / window
        # Had the server closed the connection after 5 idle seconds, httpx would open a new one.
        response = client.get("/health")
        assert response.status_code == 200 and response.extensions["network_stream"] is connection
    assert used_ms_per_s < 20, f"idle server used {used_ms_per_s:.1f} ms of CPU per second"
