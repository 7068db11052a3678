"""A `shrike serve` in a child process on 127.0.0.1: what the benchmarks and the server tests drive.

Started on a free port with its output in a log file, ready when a caller-chosen condition holds
(by default /health answering 200), stopped with SIGTERM and killed only if it does not exit in time.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HOST = "127.0.0.1"


class ServerStartError(RuntimeError):
    """The server exited, or never became ready, during start-up; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def serve_command(*flags: str) -> list[str]:
    return [sys.executable, "-m", "shrike.cli", "serve", *flags]


def health_ok(base_url: str) -> bool:
    import httpx
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


class ServerProcess:
    def __init__(self, flags: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None):
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.log_path = Path(log_path)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(serve_command(*flags, "--host", HOST, "--port", str(self.port)),
                                            stdout=log, stderr=subprocess.STDOUT, env=env,
                                            preexec_fn=preexec_fn)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float, ready: Callable[[], bool] | None = None) -> "ServerProcess":
        ready = ready or (lambda: health_ok(self.base_url))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"shrike serve exited with {self.process.returncode} during start-up; "
                                       f"log {self.log_path}:\n{self.log[-5000:]}")
            if ready():
                return self
            time.sleep(0.3)
        self.stop()
        raise ServerStartError(f"shrike serve was not ready within {timeout:.0f} s; log {self.log_path}:\n"
                               f"{self.log[-5000:]}")

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (the server drains), then SIGKILL after `timeout` s; the exit code, None if it was killed."""
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None
