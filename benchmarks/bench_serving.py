"""Side-by-side serving benchmark: Shrike against llama.cpp (and vLLM's CPU build) over the OpenAI API.

Each engine's own OpenAI-compatible server is started on 127.0.0.1 with the same thread count, and one
httpx client sends all of them the same prompts with the same output lengths. Engines take turns,
one server at a time, because the machine's memory bandwidth drifts within the hour: every round
restarts each engine in rotated order and measures read bandwidth right before and after it (the best
method of benchmarks/read_probe.py's sweep, run once at the start).

Per engine: start-to-ready time, prefill tokens/s (512-token prompt, max_tokens=1), time to first
token (short prompt, streamed), batch-1 decode tokens/s (streamed), aggregate generated tokens/s
with 1, 4, 8 and 16 concurrent streams, and the bandwidth decode reads weights at (weight bytes read per
token x decode tokens/s) with its share of the measured read bandwidth. Results: JSON plus a PNG chart.

    python benchmarks/bench_serving.py --quick                       # SmolLM2-135M, bf16 pair
    python benchmarks/bench_serving.py --formats bf16,q8,q4 --quick  # plus the quantized pairs

Peers live outside the repository (see benchmarks/README.md); their paths are options.
"""

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
HOST = "127.0.0.1"
SERVED_NAME = "bench"
MAX_MODEL_LEN = 1024
MAX_CONCURRENCY = 16
READY_TIMEOUT_S = 600
# Stands for the free port chosen when a server starts
PORT = "{port}"
REQUEST_TIMEOUT_S = 600

# Which Shrike scheme and which llama.cpp type stand for each format of the comparison.
FORMATS = {
    "bf16": {"shrike": "bf16", "gguf": None},  # the GGUF type is --gguf-16bit
    "q8": {"shrike": "w8a8", "gguf": "Q8_0"},
    "q4": {"shrike": "w4a8-g64", "gguf": "Q4_0"},
}
ENGINES = ("shrike", "llama-server", "llama-cpp-python", "vllm")


@dataclass(frozen=True)
class Workload:
    rounds: int  # server starts per engine
    prefill_prompt_tokens: int = 512
    prefill_samples: int = 3
    ttft_prompt_tokens: int = 16
    ttft_samples: int = 5
    decode_tokens: int = 128
    decode_samples: int = 2
    stream_counts: tuple[int, ...] = (1, 4, 8, 16)
    stream_prompt_tokens: int = 32
    stream_tokens: int = 64
    stream_samples: int = 1


QUICK = Workload(rounds=3)
FULL = Workload(rounds=5, prefill_samples=5, ttft_samples=10, decode_samples=3, stream_tokens=128, stream_samples=2)


@dataclass
class EngineSetup:
    """One engine serving one model file: how to start it and what it reads per generated token."""
    engine: str
    label: str
    model_path: Path
    command: list[str]  # PORT stands for the port
    env: dict[str, str]
    weight_bytes_per_token: int
    # Extra request fields that make the engine generate exactly max_tokens tokens
    fixed_length_fields: dict = field(default_factory=dict)


# ---------------------------------------------------------------- other work on the machine

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    ticks = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / CLOCK_TICKS


def process_tree_cpu_seconds(root_pid: int) -> float:
    """CPU seconds of a process and all its descendants (vLLM and others fork workers)."""
    children: dict[int, list[int]] = {}
    seconds: dict[int, float] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        pid = int(stat_file.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        seconds[pid] = sum(int(value) for value in fields[11:15]) / CLOCK_TICKS  # utime stime cutime cstime
    total, pending = 0.0, [root_pid]
    while pending:
        pid = pending.pop()
        total += seconds.get(pid, 0.0)
        pending += children.get(pid, [])
    return total


@dataclass(frozen=True)
class CpuUsage:
    wall: float
    machine_busy: float
    this_process: float

    @staticmethod
    def now() -> "CpuUsage":
        return CpuUsage(time.perf_counter(), machine_busy_seconds(), time.process_time())

    def other_cores_since(self, server_pid: int | None = None) -> float:
        """Cores kept busy since this reading by processes other than this one and the server's tree."""
        later = CpuUsage.now()
        ours = later.this_process - self.this_process
        ours += process_tree_cpu_seconds(server_pid) if server_pid else 0.0
        return max(0.0, later.machine_busy - self.machine_busy - ours) / (later.wall - self.wall)


@dataclass(frozen=True)
class QuietMachine:
    """Waits, up to a limit, until other processes use at most max_cores before a session starts."""
    max_cores: float
    timeout_s: float

    def wait(self) -> float:
        deadline = time.perf_counter() + self.timeout_s
        while True:
            start = CpuUsage.now()
            time.sleep(1.0)
            busy = start.other_cores_since()
            if busy <= self.max_cores or time.perf_counter() > deadline:
                return busy
            print(f"  waiting: other processes keep {busy:.2f} cores busy", flush=True)
            time.sleep(9.0)


# ---------------------------------------------------------------- prompts

class PromptMaker:
    """Prompts of an exact token count: random words that are each a single token of the model's tokenizer.

    Random word sequences share no prefix, so no engine's prefix cache can skip the prefill.
    """

    def __init__(self, tokenizer_json: Path, seed: int = 0):
        from tokenizers import Tokenizer
        self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
        self._words = self._single_token_words()
        self._random = random.Random(seed)

    def _single_token_words(self) -> list[str]:
        candidates = sorted(token[1:] for token in self._tokenizer.get_vocab()
                            if token.startswith("Ġ") and token[1:].isascii() and token[1:].isalpha()
                            and 3 <= len(token) - 1 <= 10 and token[1:].islower())
        words = [word for word in candidates if len(self._tokenizer.encode(" " + word).ids) == 1]
        if len(words) < 100:
            raise RuntimeError("the tokenizer has too few single-token words to build prompts from")
        return words

    def make(self, tokens: int) -> str:
        text = "".join(" " + self._random.choice(self._words) for _ in range(tokens))
        counted = len(self._tokenizer.encode(text).ids)
        if counted != tokens:
            raise RuntimeError(f"prompt of {tokens} words tokenized to {counted} tokens")
        return text

    def end_of_generation_ids(self) -> list[int]:
        """Special tokens: llama.cpp treats several of them as end of generation, not just eos."""
        return sorted(token_id for token_id, added in self._tokenizer.get_added_tokens_decoder().items()
                      if added.special)


# ---------------------------------------------------------------- weight bytes

def gguf_bytes_per_token(path: Path) -> int:
    """Bytes of every matrix a decode step reads: all tensors but the input embedding, unless it is the head too;
    of a MoE layer's merged experts (`*_exps`) only the share a token uses (expert_used_count / expert_count)."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    tensors = {tensor.name: int(tensor.n_bytes) for tensor in reader.tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    counts = {key.rsplit(".", 1)[1]: reader.fields[key].contents() for key in reader.fields
              if key.endswith((".expert_count", ".expert_used_count"))}
    active = counts["expert_used_count"] / counts["expert_count"] if counts else 1.0
    return round(sum(size * (active if name.endswith("_exps.weight") else 1) for name, size in tensors.items()))


def safetensors_bytes_per_token(model_dir: Path) -> int:
    """As gguf_bytes_per_token for a Hugging Face checkpoint: experts (`.experts.{e}.`) count by the share of
    them a token uses (num_experts_per_tok / num_experts in config.json)."""
    from safetensors import safe_open
    config = json.loads((model_dir / "config.json").read_text())
    experts = config.get("num_experts") or config.get("num_local_experts")
    active = config["num_experts_per_tok"] / experts if experts else 1.0
    sizes = {}
    for file in model_dir.glob("*.safetensors"):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():
                tensor_slice = handle.get_slice(name)
                shape = tensor_slice.get_shape()
                share = active if ".experts." in name else 1
                sizes[name] = _dtype_bytes(tensor_slice.get_dtype()) * _product(shape) * share
    if any(name.startswith("lm_head.") for name in sizes):
        sizes = {name: size for name, size in sizes.items() if not name.startswith("model.embed_tokens.")}
    return round(sum(sizes.values()))


def _dtype_bytes(dtype: str) -> float:
    return {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2,
            "I8": 1, "U8": 1, "F8_E4M3": 1, "F8_E5M2": 1}[dtype]


def _product(shape) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result


# ---------------------------------------------------------------- server lifecycle

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


class RunningServer:
    """An engine's server process in its own session, so stopping it reaches its workers too."""

    live: "set[RunningServer]" = set()  # stopped on the way out, even when the benchmark is interrupted

    def __init__(self, setup: EngineSetup, port: int, log_path: Path):
        self.setup = setup
        self.base_url = f"http://{HOST}:{port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.started = time.perf_counter()
        command = [part.replace(PORT, str(port)) for part in setup.command]
        from shrike.platform.openmp import peer_environment  # here: --plot runs this file in the peer's venv
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=peer_environment() | setup.env, start_new_session=True)
        RunningServer.live.add(self)

    async def wait_ready(self, client) -> float:
        """Seconds from spawn until the models endpoint answers 200 (servers answer 503 while loading)."""
        import httpx
        deadline = self.started + READY_TIMEOUT_S
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.setup.label} exited with {self.process.returncode} while starting; "
                                   f"log: {self.log_path}\n{self.log_tail()}")
            try:
                response = await client.get(f"{self.base_url}/v1/models", timeout=REQUEST_TIMEOUT_S)
                if response.status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.02)
        raise RuntimeError(f"{self.setup.label} not ready after {READY_TIMEOUT_S} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
        RunningServer.live.discard(self)

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- measurements

class Client:
    """Completions requests to one server with greedy sampling and a fixed output length."""

    def __init__(self, http, server: RunningServer):
        self.http = http
        self.server = server

    def _body(self, prompt: str, max_tokens: int, stream: bool) -> dict:
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body | self.server.setup.fixed_length_fields

    async def complete(self, prompt: str, max_tokens: int) -> tuple[float, dict]:
        """Seconds for a whole non-streamed completion, and its usage."""
        start = time.perf_counter()
        response = await self.http.post(f"{self.server.base_url}/v1/completions",
                                        json=self._body(prompt, max_tokens, stream=False))
        elapsed = time.perf_counter() - start
        response.raise_for_status()
        return elapsed, response.json()["usage"]

    async def stream(self, prompt: str, max_tokens: int) -> tuple[float, list[float], dict | None]:
        """Start time, arrival time of each event carrying text, and the usage if the server reports it."""
        start = time.perf_counter()
        arrivals, usage = [], None
        async with self.http.stream("POST", f"{self.server.base_url}/v1/completions",
                                    json=self._body(prompt, max_tokens, stream=True)) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                # Only text counts: some servers open or close a stream with empty events
                if any(choice.get("text") for choice in event.get("choices") or []):
                    arrivals.append(time.perf_counter())
                usage = event.get("usage") or usage
        return start, arrivals, usage


@dataclass
class SessionResult:
    """Everything measured during one start of one engine."""
    label: str
    round: int
    bandwidth_before_gbs: float
    bandwidth_after_gbs: float = 0.0
    # Other work on the machine skews every number: cores it kept busy just before and during the session
    other_cores_before: float = 0.0
    other_cores_during: float = 0.0
    start_to_ready_s: float = 0.0
    prefill_tok_s: list[float] = field(default_factory=list)
    prefill_prompt_tokens: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    decode_tok_s: list[float] = field(default_factory=list)
    streams_tok_s: dict[int, list[float]] = field(default_factory=dict)
    length_mismatches: list[str] = field(default_factory=list)
    error: str | None = None  # why the session ended early, keeping what it had measured


async def measure_prefill(client: Client, prompts: PromptMaker, load: Workload, result: SessionResult) -> None:
    for _ in range(load.prefill_samples):
        elapsed, usage = await client.complete(prompts.make(load.prefill_prompt_tokens), 1)
        result.prefill_tok_s.append(usage["prompt_tokens"] / elapsed)
        result.prefill_prompt_tokens.append(usage["prompt_tokens"])


async def measure_ttft(client: Client, prompts: PromptMaker, load: Workload, result: SessionResult) -> None:
    for _ in range(load.ttft_samples):
        start, arrivals, _ = await client.stream(prompts.make(load.ttft_prompt_tokens), 4)
        result.ttft_s.append(arrivals[0] - start)


async def measure_decode(client: Client, prompts: PromptMaker, load: Workload, result: SessionResult) -> None:
    for _ in range(load.decode_samples):
        _, arrivals, usage = await client.stream(prompts.make(load.ttft_prompt_tokens), load.decode_tokens)
        # A server may merge tokens into one event (held-back UTF-8); usage counts them all
        generated = usage["completion_tokens"] if usage else len(arrivals)
        _check_length(result, "decode", generated, load.decode_tokens)
        result.decode_tok_s.append((generated - 1) / (arrivals[-1] - arrivals[0]))


async def measure_streams(client: Client, prompts: PromptMaker, load: Workload, result: SessionResult) -> None:
    for streams in load.stream_counts:
        for _ in range(load.stream_samples):
            batch = [prompts.make(load.stream_prompt_tokens) for _ in range(streams)]
            start = time.perf_counter()
            outcomes = await asyncio.gather(*(client.complete(prompt, load.stream_tokens) for prompt in batch))
            wall = time.perf_counter() - start
            generated = [usage["completion_tokens"] for _, usage in outcomes]
            for count in generated:
                _check_length(result, f"{streams} streams", count, load.stream_tokens)
            result.streams_tok_s.setdefault(streams, []).append(sum(generated) / wall)


def _check_length(result: SessionResult, what: str, generated: int, expected: int) -> None:
    if generated != expected:
        result.length_mismatches.append(f"{what}: {generated} tokens instead of {expected}")


async def measure_all(client: Client, prompts: PromptMaker, load: Workload, result: SessionResult) -> None:
    await client.complete(prompts.make(load.prefill_prompt_tokens), 8)  # first-request set-up, unmeasured
    await measure_prefill(client, prompts, load, result)
    await measure_ttft(client, prompts, load, result)
    await measure_decode(client, prompts, load, result)
    await measure_streams(client, prompts, load, result)


async def measure_server(server: RunningServer, http, prompts: PromptMaker, load: Workload,
                         result: SessionResult, session_timeout_s: float) -> None:
    """Fill result from one server; a failure ends the session early and is recorded, keeping what was measured."""
    import httpx
    try:
        result.start_to_ready_s = await server.wait_ready(http)
        await asyncio.wait_for(measure_all(Client(http, server), prompts, load, result), session_timeout_s)
    except asyncio.TimeoutError:
        # A starved engine can slow down a hundredfold
        result.error = f"measuring took over {session_timeout_s:.0f} s"
    except (httpx.HTTPError, RuntimeError) as error:
        # One server dying (or killed by someone else) costs one session, not the whole run
        result.error = f"{type(error).__name__}: {error}; log: {server.log_path}"


async def run_session(setup: EngineSetup, round_index: int, prompts: PromptMaker, load: Workload,
                      bandwidth: "ReadProbe", threads: int, log_dir: Path, quiet: QuietMachine,
                      session_timeout_s: float) -> SessionResult:
    import httpx
    other_cores_before = quiet.wait()
    result = SessionResult(setup.label, round_index, bandwidth.gb_per_s(), other_cores_before=other_cores_before)
    log_path = log_dir / f"{setup.label.replace(' ', '_')}-round{round_index}.log"
    # A new connection per request: llama-server (cpp-httplib) closes a kept-alive connection after a few
    # requests, and a request sent on it just then fails with "Server disconnected without sending a response"
    limits = httpx.Limits(max_connections=MAX_CONCURRENCY * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as http:
        usage_at_start = CpuUsage.now()
        server = RunningServer(setup, free_port(), log_path)
        try:
            await measure_server(server, http, prompts, load, result, session_timeout_s)
            result.other_cores_during = usage_at_start.other_cores_since(server.process.pid)
        finally:
            server.stop()
    result.bandwidth_after_gbs = bandwidth.gb_per_s()
    return result


# ---------------------------------------------------------------- engine set-ups

@dataclass(frozen=True)
class PeerPaths:
    llama_server: Path
    llama_quantize: Path
    llama_cpp_python: Path
    vllm_python: Path
    work_dir: Path


def shrike_setup(model_dir: Path, scheme: str, threads: int) -> EngineSetup:
    command = [sys.executable, "-m", "shrike.cli", "serve", str(model_dir), "--host", HOST, "--port", PORT,
               "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_CONCURRENCY),
               "--served-model-name", SERVED_NAME, "--kv-cache-space", "1", "--disable-log-stats"]
    return EngineSetup("shrike", f"shrike {scheme}", model_dir, command, _thread_env(threads),
                       safetensors_bytes_per_token(model_dir), {"ignore_eos": True})


def llama_server_setup(peers: PeerPaths, gguf_path: Path, gguf_type: str, threads: int) -> EngineSetup:
    # One slot per concurrent stream, each with the full context; continuous batching is on by default
    command = [str(peers.llama_server), "-m", str(gguf_path), "--host", HOST, "--port", PORT, "-t", str(threads),
               "-tb", str(threads), "-np", str(MAX_CONCURRENCY), "-c", str(MAX_MODEL_LEN * MAX_CONCURRENCY),
               "-a", SERVED_NAME, "--no-webui"]
    return EngineSetup("llama-server", f"llama-server {gguf_type}", gguf_path, command, _thread_env(threads),
                       gguf_bytes_per_token(gguf_path), {"ignore_eos": True})


def llama_cpp_python_setup(peers: PeerPaths, gguf_path: Path, gguf_type: str, threads: int,
                           end_of_generation_ids: list[int]) -> EngineSetup:
    # Its server runs one request at a time; interrupt_requests would cancel a stream when the next arrives
    command = [str(peers.llama_cpp_python), "-m", "llama_cpp.server", "--model", str(gguf_path),
               "--host", HOST, "--port", PORT, "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", str(MAX_MODEL_LEN), "--model_alias", SERVED_NAME, "--interrupt_requests", "False"]
    # It has no ignore_eos: a strongly negative bias keeps every end-of-generation token from being chosen
    no_end = {"logit_bias": {str(token_id): -100.0 for token_id in end_of_generation_ids}}
    return EngineSetup("llama-cpp-python", f"llama-cpp-python {gguf_type}", gguf_path, command,
                       _thread_env(threads), gguf_bytes_per_token(gguf_path), no_end)


def vllm_setup(peers: PeerPaths, model_dir: Path, threads: int) -> EngineSetup:
    command = [str(peers.vllm_python.parent / "vllm"), "serve", str(model_dir), "--host", HOST, "--port", PORT, "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN),
               "--max-num-seqs", str(MAX_CONCURRENCY), "--served-model-name", SERVED_NAME,
               "--disable-log-stats"]
    env = _thread_env(threads) | {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return EngineSetup("vllm", "vllm bf16", model_dir, command, env,
                       safetensors_bytes_per_token(model_dir), {"ignore_eos": True})


def _thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads)}


# ---------------------------------------------------------------- model files

@dataclass(frozen=True)
class ModelSource:
    name: str
    bf16_dir: Path


def model_source(name: str, work_dir: Path) -> ModelSource:
    if name == "smollm2":
        from shrike.default_model import default_model_dir
        return ModelSource("smollm2-135m", default_model_dir())
    if name == "minicpm5-2b":
        target = work_dir / "minicpm5-2b-synth-bf16"
        if not target.is_dir():
            staging = _staging_path(target)
            shutil.rmtree(staging, ignore_errors=True)
            _run_checked([sys.executable, "-m", "shrike.cli", "synth", "--like", "minicpm5-2b",
                          "--scheme", "bf16", str(staging)])
            staging.rename(target)
        return ModelSource("minicpm5-2b", target)
    raise SystemExit(f"unknown model {name!r}; choose smollm2 or minicpm5-2b")


def shrike_model_dir(source: ModelSource, scheme: str, work_dir: Path) -> Path:
    """The bf16 directory itself, or its quantization by `shrike quantize` (made once, then reused)."""
    if scheme == "bf16":
        return source.bf16_dir
    target = work_dir / f"{source.name}-{scheme}"
    if not target.is_dir():
        # int8 weights are stored one per byte; only int4 ones pack into words
        storage = "int-quantized" if scheme == "w8a8" else "pack-quantized"
        staging = _staging_path(target)
        shutil.rmtree(staging, ignore_errors=True)
        _run_checked([sys.executable, "-m", "shrike.cli", "quantize", str(source.bf16_dir), str(staging),
                      "--scheme", scheme, "--format", storage])
        staging.rename(target)
    return target


def _staging_path(target: Path) -> Path:
    """Where a model is made before it takes its name: an interrupted run never leaves a half-written one."""
    return target.with_name(".partial-" + target.name)


def gguf_file(source: ModelSource, gguf_type: str, peers: PeerPaths) -> Path:
    """The same weights as a GGUF: exported at 16 bits, then quantized by llama.cpp's own llama-quantize."""
    target = peers.work_dir / f"{source.name}-{gguf_type.lower()}.gguf"
    if target.is_file():
        return target
    staging = _staging_path(target)
    if gguf_type in ("BF16", "F16"):
        from export_gguf import export
        export(source.bf16_dir, staging, gguf_type.lower())
    else:
        exported = gguf_file(source, "BF16", peers)
        _run_checked([str(peers.llama_quantize), str(exported), str(staging), gguf_type])
    staging.rename(target)
    return target


def _run_checked(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({completed.returncode}):\n{completed.stderr[-2000:]}")


def engine_setups(args: argparse.Namespace, source: ModelSource, fmt: str, peers: PeerPaths,
                  prompts: PromptMaker) -> tuple[list[EngineSetup], list[str]]:
    """The set-ups of one format that can run here, and why the others cannot."""
    setups, skipped = [], []
    gguf_type = FORMATS[fmt]["gguf"] or args.gguf_16bit
    builders = {
        "shrike": lambda: shrike_setup(shrike_model_dir(source, FORMATS[fmt]["shrike"], peers.work_dir),
                                       FORMATS[fmt]["shrike"], args.threads),
        "llama-server": lambda: llama_server_setup(peers, gguf_file(source, gguf_type, peers), gguf_type,
                                                   args.threads),
        "llama-cpp-python": lambda: llama_cpp_python_setup(peers, gguf_file(source, gguf_type, peers), gguf_type,
                                                           args.threads, prompts.end_of_generation_ids()),
        "vllm": lambda: vllm_setup(peers, source.bf16_dir, args.threads),
    }
    for engine in args.engines:
        if engine == "vllm" and fmt != "bf16":
            continue  # its CPU build runs unquantized weights only
        try:
            setups.append(builders[engine]())
        except (RuntimeError, OSError) as error:
            skipped.append(f"{engine} {fmt}: {str(error).splitlines()[0]}")
    return setups, skipped


# ---------------------------------------------------------------- summary

def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(setup: EngineSetup, sessions: list[SessionResult]) -> dict:
    """Medians over every sample of every session of one engine set-up."""
    def pooled(name: str) -> list[float]:
        return [value for session in sessions for value in getattr(session, name)]

    bandwidth = [(s.bandwidth_before_gbs + s.bandwidth_after_gbs) / 2 for s in sessions]
    # Each session's decode speed against the bandwidth measured around that same session
    fractions = [statistics.median(s.decode_tok_s) * setup.weight_bytes_per_token / (bw * 1e9)
                 for s, bw in zip(sessions, bandwidth) if s.decode_tok_s]
    counts = sorted({count for s in sessions for count in s.streams_tok_s})
    return {
        "engine": setup.engine,
        "model_path": str(setup.model_path),
        "weight_bytes_per_token": setup.weight_bytes_per_token,
        "start_to_ready_s": median_or_none([s.start_to_ready_s for s in sessions]),
        "prefill_tok_s": median_or_none(pooled("prefill_tok_s")),
        "prefill_prompt_tokens": sorted(set(pooled("prefill_prompt_tokens"))),
        "ttft_s": median_or_none(pooled("ttft_s")),
        "decode_tok_s": median_or_none(pooled("decode_tok_s")),
        "decode_weight_gb_per_s": median_or_none([statistics.median(s.decode_tok_s) * setup.weight_bytes_per_token / 1e9
                                                  for s in sessions if s.decode_tok_s]),
        "decode_fraction_of_bandwidth_limit": median_or_none(fractions),
        "streams_tok_s": {str(count): median_or_none([v for s in sessions for v in s.streams_tok_s.get(count, [])])
                          for count in counts},
        "length_mismatches": sorted({m for s in sessions for m in s.length_mismatches}),
        "other_processes_cores_during": median_or_none([s.other_cores_during for s in sessions]),
        "session_errors": [s.error for s in sessions if s.error],
        "sessions": [asdict(s) for s in sessions],
    }


def print_table(results: dict) -> None:
    columns = ["engine", "start s", "prefill tok/s", "TTFT ms", "decode tok/s", "decode GB/s", "of probe"]
    counts = sorted({int(c) for fmt in results["formats"].values() for e in fmt.values() for c in e["streams_tok_s"]})
    columns += [f"{count} str tok/s" for count in counts] + ["others' cores"]
    print(_markdown_row(columns))
    print(_markdown_row(["---"] * len(columns)))
    for fmt, engines in results["formats"].items():
        for label, summary in engines.items():
            row = [f"{label} [{fmt}]", _fmt(summary["start_to_ready_s"], 2), _fmt(summary["prefill_tok_s"], 0),
                   _fmt(summary["ttft_s"] and summary["ttft_s"] * 1000, 0), _fmt(summary["decode_tok_s"], 1),
                   _fmt(summary["decode_weight_gb_per_s"], 1),
                   _fmt(summary["decode_fraction_of_bandwidth_limit"] and
                        summary["decode_fraction_of_bandwidth_limit"] * 100, 0) + "%"]
            row += [_fmt(summary["streams_tok_s"].get(str(count)), 1) for count in counts]
            row.append(_fmt(summary["other_processes_cores_during"], 2))
            print(_markdown_row(row))


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ---------------------------------------------------------------- chart

def plot(results: dict, png_path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    formats = results["formats"]
    figure, axes = plt.subplots(1, len(formats), figsize=(5.5 * len(formats), 4.2), squeeze=False)
    for axis, (fmt, engines) in zip(axes[0], formats.items()):
        for label, summary in engines.items():
            counts = sorted(int(c) for c in summary["streams_tok_s"])
            axis.plot(counts, [summary["streams_tok_s"][str(c)] for c in counts], marker="o", label=label)
        axis.set_title(f"{results['model']} {fmt}")
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel("generated tokens/s (all streams)")
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(c) for c in counts])
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"Throughput vs concurrency, {results['threads']} threads, medians ({results['mode']})")
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)


def write_chart(results: dict, json_path: Path, peer_python: Path) -> Path | None:
    """Plot here if matplotlib is installed, else with the peers' Python (the benchmark needs no plotting deps)."""
    png_path = json_path.with_suffix(".png")
    try:
        plot(results, png_path)
        return png_path
    except ImportError:
        pass
    if peer_python.is_file():
        completed = subprocess.run([str(peer_python), __file__, "--plot", str(json_path)], capture_output=True,
                                   text=True)
        if completed.returncode == 0:
            return png_path
        print(f"chart not written: {completed.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    else:
        print("chart not written: matplotlib is missing here and in the peers' venv", file=sys.stderr)
    return None


# ---------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "minicpm5-2b"])
    parser.add_argument("--formats", default="bf16", help="comma-separated from bf16,q8,q4 (default: bf16)")
    parser.add_argument("--engines", default="shrike,llama-server,llama-cpp-python",
                        help=f"comma-separated from {','.join(ENGINES)}")
    parser.add_argument("--quick", action="store_true", help="3 rounds, fewer samples (for reruns)")
    parser.add_argument("--rounds", type=int, default=None, help="server starts per engine (overrides the mode)")
    parser.add_argument("--threads", type=int, default=2, help="threads every engine computes with (default: 2)")
    parser.add_argument("--gguf-16bit", default="BF16", choices=["BF16", "F16"],
                        help="llama.cpp's type for the bf16 pair (default: BF16, the exact weights)")
    parser.add_argument("--quiet-cores", type=float, default=0.3,
                        help="before each session, wait until other processes use at most this many cores "
                             "(default: 0.3); two-thread engines stall when a core is taken")
    parser.add_argument("--quiet-timeout", type=float, default=120,
                        help="seconds to wait for that before measuring anyway (default: 120)")
    parser.add_argument("--session-timeout", type=float, default=600,
                        help="seconds of measuring per server start before moving on (default: 600)")
    parser.add_argument("--peers-dir", type=Path, default=default_peers_dir(),
                        help="where benchmarks/build_peers.sh built the peers (default: $SHRIKE_PEERS_DIR, "
                             "else ~/.cache/shrike-peers)")
    parser.add_argument("--llama-server", type=Path, default=None, help="default: PEERS/llama-build/bin/llama-server")
    parser.add_argument("--llama-quantize", type=Path, default=None,
                        help="default: PEERS/llama-build/bin/llama-quantize")
    parser.add_argument("--llama-cpp-python", type=Path, default=None,
                        help="Python with llama-cpp-python[server]; default: PEERS/venv/bin/python")
    parser.add_argument("--vllm-python", type=Path, default=None, help="default: PEERS/vllm-venv/bin/python")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="exported, quantized models and server logs (default: PEERS/models)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: benchmarks/results/...)")
    parser.add_argument("--plot", type=Path, default=None, metavar="JSON", help="only draw the chart of a results JSON")
    return parser


def default_peers_dir() -> Path:
    """The directory benchmarks/build_peers.sh builds into."""
    return Path(os.environ.get("SHRIKE_PEERS_DIR") or Path.home() / ".cache" / "shrike-peers")


def peer_paths(args: argparse.Namespace) -> PeerPaths:
    peers = args.peers_dir
    return PeerPaths(
        llama_server=args.llama_server or peers / "llama-build" / "bin" / "llama-server",
        llama_quantize=args.llama_quantize or peers / "llama-build" / "bin" / "llama-quantize",
        llama_cpp_python=args.llama_cpp_python or peers / "venv" / "bin" / "python",
        vllm_python=args.vllm_python or peers / "vllm-venv" / "bin" / "python",
        work_dir=args.work_dir or peers / "models",
    )


def check_peers_present(setups: list[EngineSetup]) -> list[EngineSetup]:
    present = [s for s in setups if Path(s.command[0]).is_file()]
    for missing in set(s.label for s in setups) - set(s.label for s in present):
        print(f"skipping {missing}: not installed", file=sys.stderr)
    return present


def run_format(setups: list[EngineSetup], load: Workload, prompts: PromptMaker, bandwidth: "ReadProbe",
               threads: int, log_dir: Path, quiet: QuietMachine,
               session_timeout_s: float) -> dict[str, list[SessionResult]]:
    """Every engine once per round, the starting engine rotating so none always runs first."""
    sessions: dict[str, list[SessionResult]] = {s.label: [] for s in setups}
    for round_index in range(load.rounds):
        shift = round_index % len(setups)
        for setup in setups[shift:] + setups[:shift]:
            print(f"round {round_index + 1}/{load.rounds}: {setup.label}", flush=True)
            session = asyncio.run(run_session(setup, round_index, prompts, load, bandwidth, threads, log_dir,
                                              quiet, session_timeout_s))
            sessions[setup.label].append(session)
            print(f"  ready {session.start_to_ready_s:.2f} s, decode {_fmt(median_or_none(session.decode_tok_s), 1)} "
                  f"tok/s, 16 streams {_fmt(median_or_none(session.streams_tok_s.get(16, [])), 1)} tok/s, "
                  f"{'FAILED (' + session.error.splitlines()[0] + '), ' if session.error else ''}"
                  f"bandwidth {session.bandwidth_before_gbs:.1f}->{session.bandwidth_after_gbs:.1f} GB/s, "
                  f"other processes {session.other_cores_before:.2f}->{session.other_cores_during:.2f} cores",
                  flush=True)
    return sessions


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A terminated benchmark still stops the server it started (SystemExit runs the finally blocks)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run_benchmark(args, argv)
    finally:
        for server in list(RunningServer.live):
            server.stop()


def run_benchmark(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        return 0
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [e for e in args.engines if e not in ENGINES] + [f for f in formats if f not in FORMATS]
    if unknown:
        raise SystemExit(f"unknown engine or format: {', '.join(unknown)}")
    load = QUICK if args.quick else FULL
    if args.rounds:
        load = Workload(**(asdict(load) | {"rounds": args.rounds}))
    peers = peer_paths(args)
    peers.work_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # export_gguf and read_probe beside this file
    from read_probe import ReadProbe

    source = model_source(args.model, peers.work_dir)
    prompts = PromptMaker(source.bf16_dir / "tokenizer.json")
    bandwidth = ReadProbe(max_threads=args.threads)
    sweep = bandwidth.sweep()
    print(f"read probe: best {sweep[0]['gb_per_s']:.1f} GB/s ({bandwidth.describe()})", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-", dir=peers.work_dir))
    started = datetime.now(timezone.utc)
    results = {"model": source.name, "mode": "quick" if args.quick else "full", "threads": args.threads,
               "command": [sys.argv[0], *(argv if argv is not None else sys.argv[1:])],
               "started_utc": started.isoformat(timespec="seconds"), "machine": machine_facts(),
               "workload": asdict(load), "read_probe_sweep": sweep,
               "skipped": [], "formats": {}}
    results["server_logs"] = str(log_dir)
    json_path = args.out or RESULTS_DIR / f"serving-{source.name}-{started:%Y%m%d-%H%M}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    for fmt in formats:
        setups, skipped = engine_setups(args, source, fmt, peers, prompts)
        results["skipped"] += skipped
        sessions = run_format(check_peers_present(setups), load, prompts, bandwidth, args.threads, log_dir,
                              QuietMachine(args.quiet_cores, args.quiet_timeout), args.session_timeout)
        results["formats"][fmt] = {setup.label: summarize(setup, sessions[setup.label])
                                   for setup in setups if sessions.get(setup.label)}
        json_path.write_text(json.dumps(results, indent=1))  # after each format, so a cut-short run keeps them
    print_table(results)
    for reason in results["skipped"]:
        print(f"skipped: {reason}")
    chart = write_chart(results, json_path, peers.llama_cpp_python)
    print(f"wrote {json_path}" + (f" and {chart}" if chart else ""))
    return 0


def machine_facts() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    # Others edit the same checkout: Shrike runs whatever the work tree holds, which may differ from the commit
    changed = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True).stdout.split("\n")
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "shrike_commit": commit,
            "shrike_files_changed_since_commit": sorted(line[3:] for line in changed if line.strip())}


if __name__ == "__main__":
    sys.exit(main())
