"""Shrike behind Ray Serve (2 replicas x 1 core) against one `shrike serve` on 2 cores.

Workload: 16 concurrent streamed chats in waves, one turn of 16 conversations per wave; each
conversation starts with one of 4 long system prompts (shared by 4 conversations) and carries its
own growing history, as chat clients send it. Per configuration:
aggregate generated tokens/s, median time to first token, prefix-cache hit rate (from /metrics,
over all replicas), and the routing overhead: the median latency of GET /v1/models, which
computes nothing, so the difference between the paths is what the proxy, the ingress and the
router add per request. Configurations: `single` (shrike serve --cpu-threads 2), `ray-prefix`
(shrike serve --ray, prefix-affinity router), `ray-pow2` (Ray's default router) and `ray-1x2` (one
replica of 2 cores: the same engine as `single`, so the difference in idle time to first token,
20 lone 1-token requests, is what the Ray path adds).

    python benchmarks/bench_ray.py                       # all four, ~5 min on a quiet machine
    python benchmarks/bench_ray.py --configs ray-prefix,ray-pow2 --waves 4

Timings on a shared machine are noisy: run it when `uptime` shows a load below 1.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from shrike.server.child import ServerProcess

SERVED_NAME = "bench"
CONFIGS = {
    "single": ["--cpu-threads", "2"],
    "ray-prefix": ["--ray", "--num-replicas", "2", "--cpus-per-replica", "1"],
    "ray-pow2": ["--ray", "--num-replicas", "2", "--cpus-per-replica", "1", "--request-router", "power-of-two"],
    # The same engine as `single` behind Ray: the difference in idle TTFT is what the Ray path adds.
    "ray-1x2": ["--ray", "--num-replicas", "1", "--cpus-per-replica", "2"],
}
SYSTEM_PROMPTS = [f"You are assistant number {i} of a travel agency. " + ("Answer briefly, name the country first, "
                  f"and never invent facts about destination {i}. ") * 10 for i in range(4)]
READY_TIMEOUT_S = 300


def _start(config: str, log_path: Path) -> ServerProcess:
    server = ServerProcess(["--served-model-name", SERVED_NAME, "--max-model-len", "2048", "--kv-cache-space", "0.5",
                            "--disable-log-stats", *CONFIGS[config]], log_path,
                           env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})

    def ready() -> bool:
        try:
            response = httpx.get(f"{server.base_url}/health", timeout=2)
            ray_ok = "--ray" not in CONFIGS[config] or response.json()["status"] == "ok"
            return response.status_code == 200 and ray_ok and "serving" in server.log
        except (httpx.TransportError, ValueError):
            return False
    return server.wait_ready(READY_TIMEOUT_S, ready)


def _prefix_counters(base: str) -> tuple[float, float]:
    text = httpx.get(f"{base}/metrics", timeout=30).text

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))
    return total("shrike:prefix_cache_hits_total"), total("shrike:prefix_cache_queries_total")


def _conversation(stream: int, turn: int) -> list[dict]:
    """Stream i's conversation at a turn: a system prompt shared with 3 other streams, then its own
    history (fixed answers, so every run sends the same text)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPTS[stream % len(SYSTEM_PROMPTS)]}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"Traveller {stream}, question {t}: which city in region {t} "
                                                    "should I visit first, and why?"})
        if t < turn:
            messages.append({"role": "assistant", "content": f"Region {t}: start with its capital; it is the "
                                                             "easiest to reach and has the most to see."})
    return messages


async def _stream(client: httpx.AsyncClient, messages: list[dict], max_tokens: int) -> tuple[float, int]:
    body = {"model": SERVED_NAME, "stream": True, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "messages": messages}
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices") and event["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return ttft if ttft is not None else float("nan"), tokens


async def _workload(base: str, streams: int, waves: int, max_tokens: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        # Routing overhead: an endpoint that computes nothing, one request at a time.
        models = []
        for _ in range(40):
            start = time.perf_counter()
            (await client.get("/v1/models")).raise_for_status()
            models.append(time.perf_counter() - start)
        await _stream(client, [{"role": "user", "content": "Say hi."}], 2)
        idle_ttfts = [(await _stream(client, [{"role": "user", "content": f"Say {i}."}], 1))[0] for i in range(20)]
        hits0, queries0 = _prefix_counters(base)
        ttfts, tokens = [], 0
        start = time.perf_counter()
        for wave in range(waves):
            results = await asyncio.gather(*(_stream(client, _conversation(i, wave), max_tokens)
                                             for i in range(streams)))
            ttfts += [t for t, _ in results]
            tokens += sum(n for _, n in results)
        elapsed = time.perf_counter() - start
        hits, queries = _prefix_counters(base)
    return {"idle_ttft_median_ms": 1000 * statistics.median(idle_ttfts), "aggregate_tok_s": tokens / elapsed,
            "ttft_median_s": statistics.median(ttfts),
            "ttft_p90_s": statistics.quantiles(ttfts, n=10)[-1],
            "prefix_hit_rate": (hits - hits0) / max(queries - queries0, 1),
            "models_latency_median_ms": 1000 * statistics.median(models), "generated_tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="single,ray-1x2,ray-prefix,ray-pow2")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for config in args.configs.split(","):
            server = _start(config, Path(tmp) / f"{config}.log")
            try:
                results[config] = asyncio.run(_workload(server.base_url, args.streams, args.waves, args.max_tokens))
            finally:
                server.stop(timeout=90)
            print(config, json.dumps({k: round(v, 4) for k, v in results[config].items()}), flush=True)
    if "single" in results:
        for config in results.keys() - {"single"}:
            results[config]["routing_overhead_ms"] = (results[config]["models_latency_median_ms"]
                                                      - results["single"]["models_latency_median_ms"])
            results[config]["idle_ttft_added_ms"] = (results[config]["idle_ttft_median_ms"]
                                                     - results["single"]["idle_ttft_median_ms"])
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"load_average": os.getloadavg(), "args": vars(args) | {"out": str(args.out)},
                                        "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
