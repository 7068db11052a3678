"""A/B of two Shrike source trees on one checkpoint, engine level, interleaved: this checkout against a
baseline tree (e.g. the last commit with the hand-written compiled plan, built into its own src/shrike).

    python benchmarks/bench_executor_ab.py MODEL_DIR --baseline-src /tmp/shrike-old/src [--reps 5]

Each sample is a fresh process (A, B, A, B, ...), measuring in order: prefill tokens/s of a 512-token
prompt (its time to first token), batch-1 decode tokens/s over 32 greedy tokens, and the aggregate decode
tokens/s of 8 concurrent streams (each 32 tokens after its prompt), and the process CPU time per prefill
and per decoded token. With `--threads 1` the CPU times are the work itself, little moved by whatever else
runs on the machine (with more threads they include the pool's spinning). Prints per-sample figures,
medians and the ratio this tree / baseline, and the rate batch-1 decode reads weights at (bytes per token x
tokens/s) next to the read bandwidth measured before and after (benchmarks/read_probe.py, best method).
A benchmark, not a test: quote it with the machine and load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TOKENS, DECODE_TOKENS, STREAMS = 512, 32, 8


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(model: str, threads: int) -> None:
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.sampling.params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, max_model_len=1024, cpu_threads=threads, progress=False))
    greedy = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True)

    def prompt(seed: int, n: int) -> list[int]:
        return [(i * 7919 + seed * 104729) % 20000 + 100 for i in range(n)]

    def run(tokens: list[int]) -> tuple[float, float, float, float]:
        """One request -> wall and CPU seconds to its first token, then of the decode steps after it."""
        engine.add_request(f"r{time.monotonic_ns()}", tokens, greedy)
        start, start_cpu, first = time.perf_counter(), cpu_seconds(), None
        while engine.has_unfinished():
            if engine.step() and first is None:
                first, first_cpu = time.perf_counter(), cpu_seconds()
        end, end_cpu = time.perf_counter(), cpu_seconds()
        return first - start, end - first, first_cpu - start_cpu, end_cpu - first_cpu

    run(prompt(0, 64))  # warm-up: threads, caches, first-call allocations
    ttft, decode, ttft_cpu, decode_cpu = run(prompt(1, PROMPT_TOKENS))
    # Streams: short distinct prompts, all prefilled in the first step(s); decode time from the first token on.
    start = time.perf_counter()
    for i in range(STREAMS):
        engine.add_request(f"s{i}", prompt(10 + i, 16), greedy)
    first = None
    while engine.has_unfinished():
        outputs = engine.step()
        if first is None and len(outputs) == STREAMS:
            first = time.perf_counter()
    end = time.perf_counter()
    print(json.dumps({"prefill_tok_s": PROMPT_TOKENS / ttft, "decode_tok_s": DECODE_TOKENS / decode,
                      "streams_tok_s": STREAMS * DECODE_TOKENS / (end - (first or start)),
                      "prefill_cpu_ms": ttft_cpu * 1e3, "decode_cpu_ms_per_token": decode_cpu / DECODE_TOKENS * 1e3}))


def sample(model: str, src: str | None, threads: int) -> dict:
    env = dict(os.environ)
    if src:  # the baseline tree's own shrike package (with its _C built into it), not this checkout's
        env.update(PYTHONPATH=src, SKBUILD_EDITABLE_SKIP="1")
    out = subprocess.run([sys.executable, __file__, model, "--child", "--threads", str(threads)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--baseline-src", help="src/ directory of the baseline tree")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.model, args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_serving import safetensors_bytes_per_token
    from read_probe import ReadProbe
    probe = ReadProbe(max_threads=args.threads)
    probe.sweep()
    bandwidth = [probe.gb_per_s()]
    samples: dict[str, list[dict]] = {"this": [], "baseline": []}
    for rep in range(args.reps):
        order = [("this", None), ("baseline", args.baseline_src)]
        for name, src in order if rep % 2 == 0 else order[::-1]:
            s = sample(args.model, src, args.threads)
            samples[name].append(s)
            print(f"rep {rep} {name:<8} " + "  ".join(f"{k} {v:.2f}" for k, v in s.items()), flush=True)
    bandwidth.append(probe.gb_per_s())
    print("medians:")
    for key in samples["this"][0]:
        a, b = (statistics.median(x[key] for x in samples[n]) for n in ("this", "baseline"))
        print(f"  {key:<15} this {a:8.2f}  baseline {b:8.2f}  ratio {a / b:.3f}")
    weight_gb = safetensors_bytes_per_token(Path(args.model)) / 1e9
    roofline = max(bandwidth)
    print(f"read bandwidth {bandwidth[0]:.1f} -> {bandwidth[1]:.1f} GB/s ({probe.describe()}); "
          f"{weight_gb:.3f} GB read per decoded token")
    for name in samples:
        rate = statistics.median(x["decode_tok_s"] for x in samples[name]) * weight_gb
        print(f"  {name:<8} batch-1 decode reads {rate:5.1f} GB/s, {rate / roofline:.0%} of the probe")
    print(json.dumps({"model": args.model, "samples": samples, "read_gb_per_s": bandwidth}))


if __name__ == "__main__":
    main()
