"""Soak: a real `shrike serve` held at about twice its capacity for a while, by clients that misbehave on purpose.

Closed-loop workers (by default twice as many as the server holds sequences, --max-num-seqs plus
--max-queue-len) send a weighted mix of requests: chat and completions, streamed and not, short
prompts and long ones sharing a prefix, logprobs, n > 1, token-id prompts, clients that disconnect
mid-stream, reset the TCP connection mid-stream or give up before the answer, slow readers,
oversized prompts and invalid bodies. Every response is checked against what that request should get.

Checked continuously and at the end (each a named check in the summary; any failure fails the run):
  - no 5xx but 503 for overload, and that one carries Retry-After;
  - every accepted request completes (a finish reason for every choice, [DONE] on streams) or ends
    with a clear error; the invalid and oversized ones get a 4xx naming the problem;
  - no KV block leaked: once idle, every block of the pool is free again;
  - resident memory after warm-up grows by at most --rss-growth-mib over its warm-up peak;
  - the engine loop never spends longer than --max-step-seconds on one iteration (a stall);
  - /health answers 200 within --max-health-seconds throughout;
  - afterwards the server still answers, SIGTERM stops it with exit code 0, and its log has no traceback.

    python benchmarks/soak.py --duration 300                  # 5 minutes, summary JSON on stdout
    shrike bench soak --duration 1800 --json soak-30min.json  # the same through the CLI

Timings depend on what else runs on the machine; the bounds are meant to catch hangs and leaks,
not to measure speed.
"""
import argparse
import asyncio
import json
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shrike.server.child import HOST, ServerProcess, ServerStartError

SERVED_NAME = "soak"
STARTUP_TIMEOUT_S = 300
IDLE_TIMEOUT_S = 60
MAX_FAILURE_SAMPLES = 20
# A paragraph every long prompt starts with, so the prefix cache is exercised (and evicted) under load.
SHARED_PREFIX = ("You are a careful assistant for a shipping company. Answer questions about parcels, delivery "
                 "windows, customs forms and returns. Be brief, be polite, never invent tracking numbers. ") * 6
WORDS = ("apple river stone cloud engine paper violet window garden silver rocket candle harbor maple "
         "thunder pencil orbit lantern meadow copper falcon").split()

INVALID_BODIES = [b"{not json", b'{"model": "soak", "prompt": 5}', b'{"messages": "hi"}', b"[]",
                  b'{"model": "soak", "prompt": "x", "max_tokens": "many"}', b'{"model": "soak", "prompt": "x", "n": 0}']
# Outcomes that are what the request was meant to get; anything else is a failure.
GOOD_OUTCOMES = {"completed", "overloaded", "refused_as_expected", "client_disconnected", "client_gave_up",
                 "tcp_reset"}


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict[str, Counter] = field(default_factory=dict)
    completion_tokens: int = 0
    failures: list[str] = field(default_factory=list)
    violations: Counter = field(default_factory=Counter)

    def record(self, kind: str, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome not in GOOD_OUTCOMES and len(self.failures) < MAX_FAILURE_SAMPLES:
            self.failures.append(f"{kind}: {outcome}: {detail}"[:500])


class Unexpected(Exception):
    """A response that is not what its request should get; the message says how."""

    def __init__(self, outcome: str, detail: str):
        super().__init__(detail)
        self.outcome = outcome


# Requests ---------------------------------------------------------------------------------------

def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _chat_body(rng: random.Random, **extra) -> dict:
    return {"model": SERVED_NAME, "max_tokens": rng.randint(4, 40), "temperature": rng.choice([0, 0.7, 1.0]),
            "messages": [{"role": "user", "content": f"Tell me about {_words(rng, rng.randint(2, 12))}."}], **extra}


def _completion_body(rng: random.Random, **extra) -> dict:
    return {"model": SERVED_NAME, "max_tokens": rng.randint(4, 32), "temperature": rng.choice([0, 0.8]),
            "prompt": f"{_words(rng, rng.randint(3, 20))}", **extra}


def _check_json_response(response: httpx.Response, choices: int, path: str) -> int:
    body = response.json()
    if len(body.get("choices", ())) != choices:
        raise Unexpected("bad_body", f"expected {choices} choices, got {str(body)[:200]}")
    for choice in body["choices"]:
        if choice.get("finish_reason") not in ("stop", "length"):
            raise Unexpected("bad_body", f"finish_reason {choice.get('finish_reason')!r}")
        if path.endswith("chat/completions") and not isinstance(choice["message"].get("content"), str):
            raise Unexpected("bad_body", "a chat choice without content")
    return body["usage"]["completion_tokens"]


def _check_error_status(response: httpx.Response) -> str:
    """Classify a non-200 answer to a request that should have been served."""
    if response.status_code == 503:
        if not response.headers.get("Retry-After", "").isdigit():
            raise Unexpected("503_without_retry_after", response.text[:200])
        return "overloaded"
    raise Unexpected(f"status_{response.status_code}", response.text[:300])


async def _served(client: httpx.AsyncClient, path: str, body: dict, choices: int, tally: Tally,
                  read_pause: float = 0.0, stop_after_events: int | None = None) -> str:
    """Send a request that must be served (or shed with 503); streamed ones are read event by event."""
    if not body.get("stream"):
        response = await client.post(path, json=body)
        if response.status_code != 200:
            return _check_error_status(response)
        tally.completion_tokens += _check_json_response(response, choices, path)
        return "completed"
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return _check_error_status(response)
        finished: set[int] = set()
        events = 0
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                raise Unexpected("error_in_stream", str(event["error"])[:300])
            events += 1
            for choice in event.get("choices", ()):
                if choice.get("finish_reason") is not None:
                    finished.add(choice["index"])
            if event.get("usage"):
                tally.completion_tokens += event["usage"]["completion_tokens"]
            if stop_after_events is not None and events >= stop_after_events:
                return "client_disconnected"  # leaving the block closes the connection mid-stream
            if read_pause:
                await asyncio.sleep(read_pause)
        if not done:
            raise Unexpected("stream_cut", f"no [DONE] after {events} events")
        if stop_after_events is not None and events < stop_after_events:
            return "completed"  # it was over before the client meant to leave
        if len(finished) != choices:
            raise Unexpected("stream_unfinished", f"{len(finished)} of {choices} choices finished")
        return "completed"


async def _refused(client: httpx.AsyncClient, path: str, content: bytes, param_words: tuple[str, ...],
                   shed_first: bool = False) -> str:
    """A request the server must refuse with a 4xx whose message names the problem, busy or not
    (a 503 would tell its client to retry something that can never succeed). shed_first: under --ray the
    ingress sheds a request with 503 when every replica is full, before any replica has read it."""
    response = await client.post(path, content=content, headers={"Content-Type": "application/json"})
    if shed_first and response.status_code == 503 and response.json()["error"]["code"] == "queue_full":
        return _check_error_status(response)
    if not 400 <= response.status_code < 500:
        raise Unexpected(f"status_{response.status_code}", response.text[:300])
    message = response.json()["error"]["message"]
    if not any(word in message for word in param_words):
        raise Unexpected("unclear_error", message[:300])
    return "refused_as_expected"


async def _gives_up(client: httpx.AsyncClient, body: dict, wait: float) -> str:
    """A non-streamed client that stops waiting and closes its connection before the answer."""
    try:
        response = await client.post("/v1/completions", json=body, timeout=httpx.Timeout(30, read=wait))
    except httpx.ReadTimeout:
        return "client_gave_up"
    if response.status_code != 200:
        return _check_error_status(response)
    return "completed"


async def _tcp_reset(port: int, body: dict, rng: random.Random) -> str:
    """Stream a request, read a little of the answer, then reset the connection (RST, not FIN)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    payload = json.dumps(body).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await writer.drain()
    if rng.random() < 0.3:  # before the answer starts: the server may not have sent a byte yet
        await asyncio.sleep(rng.uniform(0, 0.05))
        _reset(writer)
        return "tcp_reset"
    status = (await reader.readline()).decode(errors="replace").split()
    code = status[1] if len(status) > 1 else "none"
    if code != "200":
        writer.close()
        if code == "503":
            return "overloaded"  # its Retry-After is checked on the other request kinds
        raise Unexpected(f"status_{code}", " ".join(status))
    await reader.read(rng.randint(1, 2000))
    _reset(writer)
    return "tcp_reset"


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _scenarios(port: int, max_model_len: int, vocab_hint: int, shed_first: bool = False):
    """(name, weight, coroutine factory(client, rng, tally) -> outcome)."""
    def long_prompt(rng: random.Random) -> str:
        return SHARED_PREFIX + _words(rng, rng.randint(20, 200))

    return [
        ("chat", 14, lambda c, r, t: _served(c, "/v1/chat/completions", _chat_body(r), 1, t)),
        ("chat_stream", 14, lambda c, r, t: _served(
            c, "/v1/chat/completions", _chat_body(r, stream=True, stream_options={"include_usage": True}), 1, t)),
        ("completion", 8, lambda c, r, t: _served(c, "/v1/completions", _completion_body(r), 1, t)),
        ("completion_stream", 8, lambda c, r, t: _served(
            c, "/v1/completions", _completion_body(r, stream=True), 1, t)),
        ("long_shared_prefix", 8, lambda c, r, t: _served(
            c, "/v1/completions", _completion_body(r, prompt=long_prompt(r), stream=r.random() < 0.5), 1, t)),
        ("logprobs_echo", 5, lambda c, r, t: _served(
            c, "/v1/completions", _completion_body(r, logprobs=3, echo=True, max_tokens=8), 1, t)),
        ("chat_n3_logprobs", 5, lambda c, r, t: _served(
            c, "/v1/chat/completions", _chat_body(r, n=3, logprobs=True, top_logprobs=2, temperature=1.0,
                                                   stream=r.random() < 0.5), 3, t)),
        ("token_id_prompt", 4, lambda c, r, t: _served(
            c, "/v1/completions", _completion_body(r, prompt=[r.randrange(vocab_hint) for _ in range(40)]), 1, t)),
        ("disconnect_mid_stream", 6, lambda c, r, t: _served(
            c, "/v1/completions", _completion_body(r, max_tokens=200, ignore_eos=True, stream=True), 1, t,
            stop_after_events=r.randint(1, 5))),
        ("tcp_reset_mid_stream", 3, lambda c, r, t: _tcp_reset(
            port, _chat_body(r, stream=True, max_tokens=200), r)),
        ("gives_up", 4, lambda c, r, t: _gives_up(
            c, _completion_body(r, max_tokens=300, ignore_eos=True), r.uniform(0.05, 1.0))),
        ("slow_reader", 4, lambda c, r, t: _served(
            c, "/v1/chat/completions", _chat_body(r, stream=True, max_tokens=24), 1, t, read_pause=0.2)),
        ("oversized_token_prompt", 3, lambda c, r, t: _refused(
            c, "/v1/completions", json.dumps({"model": SERVED_NAME, "prompt": [1] * (max_model_len + 5)}).encode(),
            ("maximum context length",), shed_first)),
        ("oversized_text_prompt", 2, lambda c, r, t: _refused(
            c, "/v1/chat/completions", json.dumps({"model": SERVED_NAME, "messages": [
                {"role": "user", "content": _words(r, max_model_len * 2)}]}).encode(), ("maximum context length",), shed_first)),
        ("max_tokens_too_large", 2, lambda c, r, t: _refused(
            c, "/v1/completions", json.dumps(_completion_body(r, max_tokens=max_model_len * 4, n=2)).encode(),
            ("max_tokens",), shed_first)),
        ("invalid_body", 4, lambda c, r, t: _refused(
            c, r.choice(["/v1/completions", "/v1/chat/completions"]), r.choice(INVALID_BODIES),
            ("JSON", "prompt", "messages", "max_tokens", "n", "valid", "body", "Input"), shed_first)),
    ]


# Watching the server -----------------------------------------------------------------------------

def parse_metrics(text: str) -> dict[str, float]:
    """Samples by name; the model_name label, the same on all of them, is left out of the key. Under --ray each
    replica's samples carry a replica label: they are added up (the largest is kept of a *_max)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            name = re.sub(r',?replica="[^"]*"', "", name).replace("{,", "{")
            name = name.replace(f'model_name="{SERVED_NAME}",', "").replace(f'{{model_name="{SERVED_NAME}"}}', "")
            name = name.replace("{}", "")
            if name in values:
                values[name] = max(values[name], float(value)) if name.endswith("_max") else values[name] + float(value)
            else:
                values[name] = float(value)
    return values


def rss_bytes(pid: int) -> int:
    """Resident memory of the server and every process under it (under --ray: the cluster and its replicas)."""
    total = 0
    for process in (pid, *_descendants(pid)):
        try:
            status = Path(f"/proc/{process}/status").read_text()
        except OSError:
            continue  # exited meanwhile
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


@dataclass
class Watch:
    started: float
    warmup_s: float
    rss_samples: list[tuple[float, int]] = field(default_factory=list)
    longest_health_s: float = 0.0
    health_checks: int = 0
    longest_step_s: float = 0.0


async def _watch_health(client: httpx.AsyncClient, watch: Watch, tally: Tally, bound: float, stop: asyncio.Event):
    while not stop.is_set():
        began = time.monotonic()
        try:
            response = await client.get("/health", timeout=bound)
            elapsed = time.monotonic() - began
            watch.longest_health_s = max(watch.longest_health_s, elapsed)
            if response.status_code != 200:
                tally.violations["health_not_200"] += 1
        except httpx.TimeoutException:
            watch.longest_health_s = max(watch.longest_health_s, time.monotonic() - began)
            tally.violations["health_timeout"] += 1
        watch.health_checks += 1
        await asyncio.sleep(0.5)


async def _watch_metrics(client: httpx.AsyncClient, pid: int, watch: Watch, stop: asyncio.Event):
    while not stop.is_set():
        watch.rss_samples.append((time.monotonic() - watch.started, rss_bytes(pid)))
        try:
            metrics = parse_metrics((await client.get("/metrics", timeout=30)).text)
            watch.longest_step_s = max(watch.longest_step_s, metrics.get("shrike:engine_step_seconds_max", 0.0))
        except httpx.TransportError:
            pass  # /health reports responsiveness; a slow scrape is not a finding of its own
        await asyncio.sleep(2.0)


async def _worker(client: httpx.AsyncClient, scenarios, rng: random.Random, tally: Tally, deadline: float):
    names = [s[0] for s in scenarios]
    weights = [s[1] for s in scenarios]
    factories = {s[0]: s[2] for s in scenarios}
    while time.monotonic() < deadline:
        kind = rng.choices(names, weights)[0]
        try:
            outcome = await factories[kind](client, rng, tally)
            tally.record(kind, outcome)
            if outcome == "overloaded":
                # As a client honouring Retry-After would, with jitter; instant retries would only measure
                # how fast the server says 503.
                await asyncio.sleep(rng.uniform(0.2, 1.0))
        except Unexpected as e:
            tally.record(kind, e.outcome, str(e))
        except httpx.TimeoutException as e:
            tally.record(kind, "client_timeout", repr(e))
        except (httpx.TransportError, OSError, asyncio.IncompleteReadError) as e:
            tally.record(kind, "transport_error", repr(e))
        except (ValueError, KeyError, TypeError) as e:  # a body that is not the JSON it should be
            tally.record(kind, "malformed_response", repr(e))
        if rng.random() < 0.3:
            await asyncio.sleep(rng.uniform(0, 0.2))


async def _wait_idle(client: httpx.AsyncClient, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        metrics = parse_metrics((await client.get("/metrics", timeout=30)).text)
        idle = (metrics["shrike:num_requests_running"] == 0 and metrics["shrike:num_requests_waiting"] == 0
                and metrics["shrike:kv_cache_free_blocks"] == metrics["shrike:kv_cache_blocks"]
                and metrics["shrike:num_sequences_in_flight"] == 0)
        if idle or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.5)


# The run ----------------------------------------------------------------------------------------

def _start_server(args: argparse.Namespace, log_path: Path) -> ServerProcess:
    server = ServerProcess([*([args.model] if args.model else []), "--served-model-name", SERVED_NAME,
                            "--max-num-seqs", str(args.max_num_seqs), "--max-queue-len", str(args.max_queue_len),
                            "--max-model-len", str(args.max_model_len), "--kv-cache-space", str(args.kv_cache_space),
                            "--max-num-batched-tokens", str(args.max_num_batched_tokens),
                            "--disable-log-stats", *args.serve_flag], log_path)
    try:
        return server.wait_ready(STARTUP_TIMEOUT_S)
    except ServerStartError as e:
        raise SystemExit(f"soak: {e}") from None


async def _drive(args: argparse.Namespace, port: int, process: subprocess.Popen) -> dict:
    tally = Tally()
    concurrency = args.concurrency or 2 * (args.max_num_seqs + args.max_queue_len)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    timeout = httpx.Timeout(args.request_timeout)
    async with httpx.AsyncClient(base_url=f"http://{HOST}:{port}", limits=limits, timeout=timeout) as client, \
            httpx.AsyncClient(base_url=f"http://{HOST}:{port}") as monitor:
        vocab_hint = 49152 if args.model is None else 1000  # token ids surely inside any vocabulary
        scenarios = _scenarios(port, args.max_model_len, vocab_hint, shed_first="--ray" in args.serve_flag)
        began = time.monotonic()
        watch = Watch(began, args.warmup if args.warmup is not None else min(60.0, args.duration * 0.25))
        stop = asyncio.Event()
        watchers = [asyncio.ensure_future(_watch_health(monitor, watch, tally, args.max_health_seconds, stop)),
                    asyncio.ensure_future(_watch_metrics(monitor, process.pid, watch, stop))]
        deadline = began + args.duration
        rng = random.Random(args.seed)
        workers = [asyncio.ensure_future(_worker(client, scenarios, random.Random(rng.random()), tally, deadline))
                   for _ in range(concurrency)]
        # Workers finish the request they are in after the deadline; one stuck past the request timeout is a failure.
        done, pending = await asyncio.wait(workers, timeout=args.duration + args.request_timeout + 30)
        for task in pending:
            task.cancel()
            tally.record("any", "hung_request", "still running long after the deadline")
        for task in done:
            if task.exception() is not None:
                tally.record("any", "harness_error", repr(task.exception()))
        load_seconds = time.monotonic() - began
        idle = await _wait_idle(monitor, IDLE_TIMEOUT_S)
        watch.rss_samples.append((time.monotonic() - began, rss_bytes(process.pid)))
        stop.set()
        await asyncio.gather(*watchers, return_exceptions=True)
        watch.longest_step_s = max(watch.longest_step_s, idle["shrike:engine_step_seconds_max"])
        after = await client.post("/v1/chat/completions", json=_chat_body(random.Random(0), max_tokens=4))
    return _summary(args, tally, watch, idle, load_seconds, concurrency, after.status_code)


def _summary(args, tally: Tally, watch: Watch, idle: dict[str, float], load_seconds: float, concurrency: int,
             status_after: int) -> dict:
    mib = 1 << 20
    warm = [rss for t, rss in watch.rss_samples if t <= watch.warmup_s] or [watch.rss_samples[0][1]]
    later = [rss for t, rss in watch.rss_samples if t > watch.warmup_s] or [warm[-1]]
    rss_growth = max(later) - max(warm)
    leaked = int(idle["shrike:kv_cache_blocks"] - idle["shrike:kv_cache_free_blocks"])
    stranded = int(idle["shrike:num_sequences_in_flight"])
    bad = {outcome: n for outcome, n in tally.outcomes.items() if outcome not in GOOD_OUTCOMES}
    checks = {
        "every_request_got_what_it_should": not bad,
        "no_kv_block_leaked": leaked == 0,
        "idle_afterwards": idle["shrike:num_requests_running"] == 0 and idle["shrike:num_requests_waiting"] == 0,
        "no_admission_stranded": stranded == 0,
        "rss_growth_within_bound": rss_growth <= args.rss_growth_mib * mib,
        "step_stall_within_bound": watch.longest_step_s <= args.max_step_seconds,
        "health_always_responsive": not tally.violations and watch.longest_health_s <= args.max_health_seconds,
        "serves_after_the_soak": status_after == 200,
        "was_overloaded": tally.outcomes["overloaded"] > 0 or not args.require_overload,
    }
    return {
        "duration_s": round(load_seconds, 1),
        "concurrency": concurrency,
        "server": {"max_num_seqs": args.max_num_seqs, "max_queue_len": args.max_queue_len,
                   "max_num_batched_tokens": args.max_num_batched_tokens,
                   "max_model_len": args.max_model_len, "kv_cache_space": args.kv_cache_space},
        "requests": sum(tally.outcomes.values()),
        "requests_by_outcome": dict(tally.outcomes.most_common()),
        "requests_by_kind": {kind: dict(c.most_common()) for kind, c in sorted(tally.by_kind.items())},
        "tokens_generated": int(idle["shrike:generation_tokens_total"]),
        "completion_tokens_received": tally.completion_tokens,
        "prompt_tokens": int(idle["shrike:prompt_tokens_total"]),
        "preemptions": int(idle["shrike:num_preemptions_total"]),
        "engine_steps": int(idle["shrike:engine_steps_total"]),
        "rss_mib": {"warmup_peak": round(max(warm) / mib, 1), "peak": round(max(max(warm), max(later)) / mib, 1),
                    "final": round(watch.rss_samples[-1][1] / mib, 1),
                    "growth_after_warmup": round(rss_growth / mib, 1),
                    "bound": args.rss_growth_mib, "warmup_s": watch.warmup_s},
        # About ten points over the run: how resident memory moved, not just where it ended.
        "rss_timeline_mib": [[round(t), round(rss / mib, 1)] for t, rss in
                             watch.rss_samples[::max(1, len(watch.rss_samples) // 10)]],
        "longest_step_stall_s": round(watch.longest_step_s, 3),
        "step_stall_bound_s": args.max_step_seconds,
        "longest_health_s": round(watch.longest_health_s, 3),
        "health_bound_s": args.max_health_seconds,
        "health_checks": watch.health_checks,
        "health_violations": dict(tally.violations),
        "leaked_blocks": leaked,
        "stranded_sequences": stranded,
        "kv_blocks": int(idle["shrike:kv_cache_blocks"]),
        "failure_samples": tally.failures,
        "checks": checks,
    }


def run(args: argparse.Namespace) -> dict:
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="shrike-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "server.log"
    server = _start_server(args, log_path)
    try:
        summary = asyncio.run(_drive(args, server.port, server.process))
    finally:
        exit_code = server.stop(timeout=60)
    log = log_path.read_text(errors="replace")
    summary["server_exit_code"] = exit_code
    summary["server_log"] = str(log_path)
    summary["checks"]["sigterm_exits_zero"] = exit_code == 0
    summary["checks"]["no_traceback_in_server_log"] = "Traceback" not in log
    summary["passed"] = all(summary["checks"].values())
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shrike bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=180, help="seconds of load (default: 180)")
    p.add_argument("--model", default=None, help="model to serve (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-queue-len", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=512,
                   help="tokens per step, which bounds a step's length (default: 512)")
    p.add_argument("--kv-cache-space", type=float, default=0.1, help="GiB; small, so that preemption happens too")
    p.add_argument("--concurrency", type=int, default=None,
                   help="closed-loop clients (default: twice --max-num-seqs plus --max-queue-len)")
    p.add_argument("--serve-flag", action="append", default=[], help="extra flag for shrike serve (repeatable)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds whose RSS peak is the baseline (default: a quarter of --duration, at most 60)")
    # Not a small number, and why: PyTorch's oneDNN keeps state per matmul shape (about 0.75 MiB for each new
    # token count of a bf16 linear on this machine, up to its primitive cache of 1024), and a server's steps
    # see every token count up to --max-num-batched-tokens, so RSS climbs for minutes before it levels off.
    p.add_argument("--rss-growth-mib", type=float, default=256,
                   help="allowed RSS growth after warm-up (default: 256; see the comment in build_parser)")
    p.add_argument("--max-step-seconds", type=float, default=10.0,
                   help="allowed longest engine-loop iteration (default: 10; a 2048-token prefill chunk takes about "
                        "1 s on two idle cores, many times that on a crowded machine)")
    p.add_argument("--max-health-seconds", type=float, default=5.0, help="allowed /health latency (default: 5)")
    p.add_argument("--request-timeout", type=float, default=120.0, help="client timeout per request (default: 120)")
    p.add_argument("--require-overload", action=argparse.BooleanOptionalAction, default=True,
                   help="fail unless some requests were shed with 503 (proof the load exceeded capacity)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", default=None, help="where the server log goes (default: a new temporary directory)")
    p.add_argument("--json", default=None, help="also write the summary to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    summary = run(args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    failed = [name for name, ok in summary["checks"].items() if not ok]
    if failed:
        print(f"soak: FAILED checks: {', '.join(failed)}", file=sys.stderr)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
