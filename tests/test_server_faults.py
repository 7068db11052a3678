"""Things going wrong on purpose: processes killed mid-write, a full cache disk, damaged checkpoints,
clients resetting their connection, SIGTERM under load. Each leaves the server (or the next start) whole."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from test_server_lifecycle import SERVED_NAME, running_server

from shrike.default_model import converted_gguf_dir
from shrike.errors import ConfigError
from shrike.eval_ppl import sequence_logits
from shrike.model.loader import load_model
from shrike.model.weights import CheckpointTensors
from shrike.quantization.repack_cache import MANIFEST
from shrike.server.child import ServerProcess, serve_command
from shrike.synth import synthesize

IDS = list(range(200, 232))
EXPORT_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "export_gguf.py"


@pytest.fixture(scope="module")
def w4a8_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("w4a8") / "tiny"
    synthesize(path, "tiny", "w4a8-g128", progress=False)
    return path


@pytest.fixture(scope="module")
def bf16_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16") / "tiny"
    synthesize(path, "tiny", "bf16", progress=False)
    return path


def _run_until_killed(script: str, cache: Path) -> None:
    """Run a Python script that SIGKILLs itself at the point it chooses; check that it died that way."""
    env = {**os.environ, "SHRIKE_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr


# The point of death is chosen inside the process (not by racing a timer from outside): half of one
# file's bytes are written and flushed, then the process SIGKILLs itself, as a power cut or the OOM
# killer would stop it.
KILL_DURING_REPACK_WRITE = """
    import os, signal
    import torch
    from shrike.model.loader import load_model
    from shrike.quantization import safetensors_io

    real_write = safetensors_io.StreamingSafetensorsWriter.write
    writers = []

    def write_then_die(self, name, tensor):
        if self not in writers:
            writers.append(self)
        if len(writers) == 3:  # the third layer's file, after two complete ones
            data = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            self._file.write(data[: len(data) // 2])
            self._file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(self, name, tensor)

    safetensors_io.StreamingSafetensorsWriter.write = write_then_die
    load_model(MODEL, progress=False)
"""


def test_sigkill_during_a_repack_cache_write_is_rebuilt_on_the_next_start(w4a8_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(tmp_path / "reference-cache"))
    expected = sequence_logits(load_model(str(w4a8_tiny), progress=False).model, IDS)
    cache = tmp_path / "cache"
    _run_until_killed(KILL_DURING_REPACK_WRITE.replace("MODEL", repr(str(w4a8_tiny))), cache)
    (entry,) = (cache / "repacked").iterdir()
    assert list(entry.glob(".*.tmp")), "the killed process should have left its part-written file behind"
    manifest = json.loads((entry / MANIFEST).read_text())["files"]
    assert len(manifest) == 2  # the layers written before the kill, not the one it was writing

    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(cache))
    restarted = load_model(str(w4a8_tiny), progress=False)
    assert torch.equal(sequence_logits(restarted.model, IDS), expected)
    assert len(json.loads((entry / MANIFEST).read_text())["files"]) == 8
    assert not list(entry.glob(".*.tmp")), "the dead writer's part-written file should be swept"


KILL_DURING_CONVERSION = """
    import os, signal
    import safetensors.torch
    from pathlib import Path
    from shrike.convert import gguf
    from shrike.default_model import converted_gguf_dir

    def save_half_then_die(tensors, path, metadata=None):
        data = safetensors.torch.save(tensors, metadata=metadata)
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    gguf.save_file = save_half_then_die
    converted_gguf_dir(Path(GGUF), progress=False)
"""


@pytest.fixture(scope="module")
def tiny_gguf(bf16_tiny, tmp_path_factory):
    """A GGUF of the tiny model: it converts in seconds where SmolLM2's GGUF takes about half a minute,
    through the same converted_gguf_dir that `shrike serve` with no model runs on the default GGUF."""
    spec = importlib.util.spec_from_file_location("export_gguf", EXPORT_SCRIPT)
    export_gguf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_gguf)
    return export_gguf.export(bf16_tiny, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_sigkill_during_a_gguf_conversion_is_redone_on_the_next_start(tiny_gguf, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _run_until_killed(KILL_DURING_CONVERSION.replace("GGUF", repr(str(tiny_gguf))), cache)
    models = cache / "models"
    (staging,) = models.iterdir()
    assert staging.name.startswith(".converting-"), "only the hidden staging directory may exist after the kill"
    assert (staging / "model.safetensors").stat().st_size > 0  # the half-written file

    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(cache))
    converted = converted_gguf_dir(tiny_gguf, progress=False)
    assert [p.name for p in models.iterdir()] == [converted.name], "the dead process's staging dir is removed"
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (converted / name).is_file(), name
    tensors = CheckpointTensors(converted)  # checks every file's header against its size
    assert all(tensors.raw(name).numel() for name in tensors.names())


def test_an_unusable_cache_converts_into_a_temporary_directory_with_a_warning(tiny_gguf, tmp_path, monkeypatch,
                                                                               capsys):
    """The cache directory cannot be created (its parent is a file: ENOTDIR); a full disk (ENOSPC) takes the
    same path. The model is still served, from a conversion that lives as long as the process."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SHRIKE_CACHE_DIR", str(blocker / "cache"))
    converted = converted_gguf_dir(tiny_gguf, progress=False)
    try:
        assert blocker not in converted.parents
        warning = capsys.readouterr().err
        assert "warning: cannot write the converted model into the cache" in warning and "Not a directory" in warning
        CheckpointTensors(converted)  # complete: every header checked against its file's size
    finally:
        shutil.rmtree(converted)


def _mount_tiny_tmpfs(path: Path) -> bool:
    """A 64 KiB tmpfs at `path`: writes there fail with ENOSPC, as on a full disk. Needs root (mount)."""
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _limit_file_size():
    """The fallback without mount rights: RLIMIT_FSIZE makes writes past 32 KiB fail with EFBIG."""
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))


def _serve_and_ask(model: Path, log_path: Path, env: dict[str, str], preexec=None) -> str:
    """Serve `model`, get one completion, stop; the server's log."""
    server = ServerProcess([str(model), "--max-model-len", "256", "--kv-cache-space", "0.05",
                            "--served-model-name", SERVED_NAME], log_path, env=env, preexec_fn=preexec)
    try:
        server.wait_ready(120)
        response = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                              json={"model": SERVED_NAME, "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4, response.text
    finally:
        assert server.stop() == 0
    return log_path.read_text()


def test_a_full_cache_disk_serves_from_the_checkpoint_with_a_warning(w4a8_tiny, tmp_path):
    cache = tmp_path / "cache"
    mounted = _mount_tiny_tmpfs(cache)
    try:
        log = _serve_and_ask(w4a8_tiny, tmp_path / "server.log", {**os.environ, "SHRIKE_CACHE_DIR": str(cache)},
                             None if mounted else _limit_file_size)
        assert not list(cache.rglob(".*.tmp")), "part-written files are removed, not left to fill the disk"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(cache)], check=True)
    warnings = [line for line in log.splitlines() if "cannot write the repack cache" in line]
    assert len(warnings) == 1, log
    assert ("No space left on device" if mounted else "File too large") in warnings[0]
    assert "Traceback" not in log


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "header_length":
        path.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    elif how == "header_json":
        path.write_bytes(data[:8] + b"#" * 16 + data[24:])


@pytest.mark.parametrize("how, reason", [
    ("truncated", "it is truncated"), ("empty", "shorter than a header"),
    ("header_length", "its header claims"), ("header_json", "its header is not valid JSON")])
def test_a_damaged_safetensors_file_is_named_with_what_is_wrong(bf16_tiny, tmp_path, how, reason):
    model = tmp_path / "model"
    shutil.copytree(bf16_tiny, model)
    _damage(model / "model.safetensors", how)
    with pytest.raises(ConfigError) as error:
        load_model(str(model), progress=False)
    message = str(error.value)
    assert message.startswith(f"{model / 'model.safetensors'} is not a valid safetensors file (") and reason in message
    assert "\n" not in str(error.value)


def test_serving_a_truncated_checkpoint_fails_in_one_line(bf16_tiny, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(bf16_tiny, model)
    _damage(model / "model.safetensors", "truncated")
    result = subprocess.run(serve_command(str(model), "--port", "0"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [result.stderr.strip().splitlines()[-1]], result.stderr
    assert errors[0].startswith(f"shrike serve: error: {model / 'model.safetensors'} is not a valid safetensors file")
    assert "Traceback" not in result.stderr


SHUTDOWN_TIMEOUT_SECONDS = 15  # the short streams need a few seconds on a crowded machine


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    """Shared by the TCP-reset test and, last in this module, the SIGTERM test, which stops it."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "4",
                        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_SECONDS)) as server:
        yield server


def _canonical(sample: str) -> str:
    """A sample's name with the model_name label dropped and the other labels in sorted order
    (prometheus_client writes them alphabetically; the tests should not depend on that)."""
    name, brace, labels = sample.partition("{")
    if not brace:
        return name
    pairs = sorted(p for p in labels.rstrip("}").split(",") if p and not p.startswith("model_name="))
    return f"{name}{{{','.join(pairs)}}}" if pairs else name


def _metrics(base_url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[_canonical(name)] = float(value)
    return values


def _wait_idle(base_url: str, timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        metrics = _metrics(base_url)
        if metrics["shrike:num_requests_running"] == metrics["shrike:num_requests_waiting"] == 0 or \
                time.monotonic() > deadline:
            return metrics
        time.sleep(0.2)


def test_a_tcp_reset_mid_stream_frees_everything_and_the_server_keeps_serving(server):
    aborted = 'shrike:request_success_total{finished_reason="abort"}'
    before = _wait_idle(server.base_url)
    port = int(server.base_url.rsplit(":", 1)[1])
    body = json.dumps({"model": SERVED_NAME, "prompt": "Count:", "max_tokens": 1500, "ignore_eos": True,
                       "stream": True, "n": 2}).encode()
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    received = b""
    while received.count(b"data: ") < 3:
        chunk = conn.recv(4096)
        assert chunk, received
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert _metrics(server.base_url)["shrike:num_requests_running"] == 1
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()  # with linger 0: an RST, not an orderly FIN

    after = _wait_idle(server.base_url)
    assert after["shrike:num_requests_running"] == 0
    assert after["shrike:kv_cache_free_blocks"] == after["shrike:kv_cache_blocks"], "KV blocks leaked"
    assert after[aborted] == before[aborted] + 2  # both choices
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                          json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 3})
    assert response.status_code == 200
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
    assert "Traceback" not in server.log


def test_resets_before_the_first_byte_strand_no_admission(server):
    """A client gone before its stream starts: the response is cancelled before its event generator
    ever ran, and the request must still be aborted and its admission released."""
    port = int(server.base_url.rsplit(":", 1)[1])
    body = json.dumps({"model": SERVED_NAME, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True,
                       "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    for attempt in range(20):
        conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        conn.sendall(request)
        time.sleep(0.002 * attempt)  # from before admission to just after it
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    after = _wait_idle(server.base_url)
    deadline = time.monotonic() + 20
    while after["shrike:num_sequences_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.2)
        after = _metrics(server.base_url)
    assert after["shrike:num_sequences_in_flight"] == 0, "admissions stranded by clients that left early"
    assert after["shrike:kv_cache_free_blocks"] == after["shrike:kv_cache_blocks"]
    assert after["shrike:num_requests_running"] == 0


def _stream(base_url: str, body: dict, first_event: threading.Event, result: dict) -> None:
    lines = []
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=120) as response:
            result["status"] = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    first_event.set()
    except httpx.HTTPError as e:
        result["error"] = repr(e)
    finally:
        first_event.set()
        result["lines"] = lines


def test_sigterm_under_load_drains_refuses_new_work_and_exits_zero(server):
    short = {"model": SERVED_NAME, "prompt": "Once upon a time", "max_tokens": 16, "ignore_eos": True,
             "stream": True}
    endless = {**short, "max_tokens": 1900}  # cannot finish within the shutdown timeout
    streams = []
    for body in [short] * 3 + [endless]:
        started, result = threading.Event(), {}
        thread = threading.Thread(target=_stream, args=(server.base_url, body, started, result))
        thread.start()
        streams.append((thread, started, result))
    for _, started, _ in streams:
        assert started.wait(60)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert "draining 4 request(s) in flight" in server.log, server.log
    # Still listening, but refusing: the late client learns why, and a load balancer stops routing here.
    refused = httpx.post(f"{server.base_url}/v1/completions", timeout=10,
                         json={"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert refused.headers["Retry-After"].isdigit()
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 503
    assert httpx.get(f"{server.base_url}/metrics", timeout=10).status_code == 200  # the drain stays observable
    for thread, _, _ in streams:
        thread.join(120)
    assert server.process.wait(timeout=60) == 0
    for _, _, result in streams[:3]:  # finished, not cut off
        assert result.get("status") == 200 and "error" not in result, result
        assert '"finish_reason": "length"' in result["lines"][-2] and result["lines"][-1] == "data: [DONE]"
    endless_result = streams[3][2]  # ended by the timeout with a clear error, then [DONE]
    assert "error" not in endless_result, endless_result
    assert '"code": "shutting_down"' in endless_result["lines"][-2], endless_result["lines"][-3:]
    assert endless_result["lines"][-1] == "data: [DONE]"
    assert "drain timeout" in server.log
