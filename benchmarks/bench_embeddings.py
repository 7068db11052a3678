"""Embedding throughput over HTTP: 64 inputs of 128 tokens in one /v1/embeddings request, texts/s and tokens/s,
Shrike (`shrike serve MODEL --runner pooling`) and, given its binary, llama-server (`--embeddings --pooling last`)
on the same GGUF, both last-token pooled and normalized, run one after the other on the same cores.

    python benchmarks/bench_embeddings.py [--gguf MODEL.gguf] [--llama-server PATH] [--reps 3] [--threads N]

Inputs are token ids (the same for every engine, new ones in every request so that no prompt cache answers;
no tokenizer in the timing); medians of --reps after one
warm-up request. The default model is the test model, SmolLM2-135M-Instruct Q4_1 (Shrike runs its bf16 conversion).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from shrike.default_model import default_gguf_path
from shrike.server.child import ServerProcess, free_port, health_ok
from shrike.platform.openmp import peer_environment

NUM_INPUTS, INPUT_TOKENS = 64, 128


def inputs(rep: int) -> list[list[int]]:
    """Request rep's inputs: new tokens in every request, so no engine answers from a prompt cache."""
    return [[((rep * NUM_INPUTS + i) * 7919 + j * 31) % 20000 + 100 for j in range(INPUT_TOKENS)]
            for i in range(NUM_INPUTS)]


def measure(base_url: str, reps: int, model: str) -> float:
    """Median seconds for one request of NUM_INPUTS inputs."""
    times = []
    for rep in range(reps + 1):
        body = {"model": model, "input": inputs(rep), "encoding_format": "float"}
        start = time.perf_counter()
        response = httpx.post(f"{base_url}/v1/embeddings", json=body, timeout=600)
        response.raise_for_status()
        assert len(response.json()["data"]) == NUM_INPUTS
        if rep:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def shrike(gguf: Path, threads: int, reps: int, log_dir: Path) -> float:
    server = ServerProcess([str(gguf), "--runner", "pooling", "--served-model-name", "bench", "--cpu-threads",
                            str(threads), "--max-model-len", "512", "--disable-log-stats"], log_dir / "shrike.log")
    try:
        server.wait_ready(600)
        return measure(server.base_url, reps, "bench")
    finally:
        server.stop()


def llama_server(binary: str, gguf: Path, threads: int, reps: int, log_dir: Path) -> float:
    port = free_port()
    # One slot of a context that holds all 64 inputs (llama-server batches the inputs of a request in one slot).
    command = [binary, "-m", str(gguf), "--embeddings", "--pooling", "last", "-t", str(threads), "--port", str(port),
               "-c", str(NUM_INPUTS * INPUT_TOKENS), "-b", str(NUM_INPUTS * INPUT_TOKENS),
               "-ub", str(NUM_INPUTS * INPUT_TOKENS), "-np", "1"]
    with open(log_dir / "llama-server.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=peer_environment())
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not health_ok(base_url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not start; see {log_dir / 'llama-server.log'}")
            time.sleep(0.5)
        return measure(base_url, reps, "bench")
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--llama-server", default=None, help="llama-server binary (benchmarks/build_peers.sh)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    gguf = args.gguf or default_gguf_path()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    rows = [("shrike", shrike(gguf, args.threads, args.reps, log_dir))]
    if args.llama_server:
        rows.append(("llama-server", llama_server(args.llama_server, gguf, args.threads, args.reps, log_dir)))
    print(f"{NUM_INPUTS} inputs x {INPUT_TOKENS} tokens, {gguf.name}, {args.threads} threads, median of {args.reps}")
    print("| engine | seconds | texts/s | tokens/s |\n|---|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {NUM_INPUTS / seconds:.1f} | {NUM_INPUTS * INPUT_TOKENS / seconds:.0f} |")


if __name__ == "__main__":
    main()
