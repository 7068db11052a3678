"""Engine-level prefill and decode of one Shrike checkpoint next to `llama-bench` on a GGUF of the
same shape, interleaved in one run, with the STREAM-like read bandwidth measured before and after.

    python benchmarks/bench_engine_vs_llamacpp.py SHRIKE_DIR MODEL.gguf [--llama-bench PATH] [--reps 3]

Shrike: a 512-token prompt's time to first token gives prefill tokens/s; 32 further greedy
tokens give decode tokens/s. llama.cpp: `llama-bench -p 512 -n 32 -t 2`. Medians of --reps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

PROMPT_TOKENS, DECODE_TOKENS = 512, 32


def llama_bench(binary: str, gguf: str, threads: int) -> tuple[float, float]:
    out = subprocess.run([binary, "-m", gguf, "-t", str(threads), "-p", str(PROMPT_TOKENS), "-n", str(DECODE_TOKENS),
                          "-r", "1", "-o", "json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    prefill = next(r["avg_ts"] for r in rows if r["n_prompt"] == PROMPT_TOKENS)
    decode = next(r["avg_ts"] for r in rows if r["n_gen"] == DECODE_TOKENS)
    return prefill, decode


def shrike_run(engine) -> tuple[float, float]:
    from shrike.sampling.params import SamplingParams
    prompt = [(i * 7919) % 20000 + 100 for i in range(PROMPT_TOKENS)]
    engine.add_request(f"bench-{time.monotonic_ns()}", prompt,
                       SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True))
    start, first = time.perf_counter(), None
    while engine.has_unfinished():
        if engine.step() and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return PROMPT_TOKENS / (first - start), DECODE_TOKENS / (end - first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shrike_model")
    parser.add_argument("gguf")
    peers = os.environ.get("SHRIKE_PEERS_DIR") or str(Path.home() / ".cache" / "shrike-peers")
    parser.add_argument("--llama-bench", default=f"{peers}/llama-build/bin/llama-bench",
                        help="default: the one benchmarks/build_peers.sh built ($SHRIKE_PEERS_DIR or ~/.cache/shrike-peers)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import importlib.util

    from shrike.engine.llm_engine import EngineConfig, LLMEngine

    spec = importlib.util.spec_from_file_location("bench_kernels", Path(__file__).with_name("bench_kernels.py"))
    bench_kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_kernels)

    def bandwidth() -> float:
        return bench_kernels.stream_read_gbs(1 << 30, 5)

    engine = LLMEngine(EngineConfig(model=args.shrike_model, max_model_len=2048, max_num_seqs=1,
                                    max_num_batched_tokens=PROMPT_TOKENS, kv_cache_space_gib=0.5, enable_prefix_caching=False,
                                    cpu_threads=args.threads, progress=False))
    weight_bytes = sum(p.stat().st_size for p in Path(args.shrike_model).glob("*.safetensors"))
    shrike_run(engine)  # warm-up
    bw_before = bandwidth()
    runs = {"shrike": [], "llama.cpp": []}
    for _ in range(args.reps):
        runs["shrike"].append(shrike_run(engine))
        runs["llama.cpp"].append(llama_bench(args.llama_bench, args.gguf, args.threads))
    bw_after = bandwidth()
    print(f"read bandwidth {bw_before:.1f} -> {bw_after:.1f} GB/s; Shrike weights {weight_bytes / 1e9:.2f} GB")
    print(f"{'engine':<12}{'prefill tok/s':>15}{'decode tok/s':>14}")
    for name, samples in runs.items():
        print(f"{name:<12}{statistics.median(s[0] for s in samples):>15.1f}{statistics.median(s[1] for s in samples):>14.2f}")
    decode = statistics.median(s[1] for s in runs["shrike"])
    print(f"Shrike decode x weight bytes = {decode * weight_bytes / 1e9:.1f} GB/s "
          f"({decode * weight_bytes / 1e9 / min(bw_before, bw_after):.0%} of the measured read bandwidth)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
