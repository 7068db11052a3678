"""Decode speed and KV memory per sequence at long context: Shrike with a bf16 and an int8 KV cache next
to llama.cpp with f16 and q8_0 caches (flash attention), interleaved, medians, 2 threads.

    python benchmarks/bench_long_context.py --contexts 1024 8192 [--reps 3] [--llama-reps 1]
    python benchmarks/bench_long_context.py --contexts 32768 --reps 3 --llama-reps 1   (many minutes)

Defaults: synthetic MiniCPM5-2B W4A8-G128 ($SHRIKE_PEERS_DIR/models/minicpm5-2b-synth-w4a8-g128) and the
llama.cpp Q4_0 GGUF of the same shapes. Each context runs on its own, so the contexts can be run in separate
invocations (and lock holds); every run appends its rows to --out (JSON lines).

Shrike: one engine per cache dtype. The first request prefills the CONTEXT-token prompt; each later
request repeats the prompt, finds it in the prefix cache (all but its last partial block), so the prefilled
state is reused and only 32 new tokens are decoded at depth CONTEXT. decode tok/s = 32 tokens / time from
the first to the last token. llama.cpp: `llama-bench -fa on -ctk T -ctv T -d CONTEXT -p 0 -n 32 -t 2`,
which prefills the depth again for every repetition (hence --llama-reps, default 1).

A context at the model's limit (32768 for MiniCPM5-2B) is run as deep as the limit allows with the decoded tokens
and the repeat's extra token (CONTEXT - 64, on both engines: 32704 for 32k), and reported under the depth it ran at.

KV bytes per sequence are computed for CONTEXT tokens: Shrike from its planner (2 x layers x KV heads x
row bytes, a row being head_dim x 2 in bf16 or head_dim + 4 in int8), llama.cpp from its cache types
(f16: 2 bytes per value; q8_0: 34 bytes per block of 32 values).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from shrike.platform.openmp import peer_environment

DECODE_TOKENS = 32
SHRIKE_KV = ("bfloat16", "int8")
LLAMA_KV = ("f16", "q8_0")


def llama_decode(binary: str, gguf: str, cache_type: str, context: int, threads: int) -> float:
    out = subprocess.run([binary, "-m", gguf, "-t", str(threads), "-fa", "on", "-ctk", cache_type, "-ctv", cache_type,
                          "-d", str(context), "-p", "0", "-n", str(DECODE_TOKENS), "-r", "1", "-o", "json"],
                         check=True, capture_output=True, text=True, env=peer_environment()).stdout
    return next(r["avg_ts"] for r in json.loads(out) if r["n_gen"] == DECODE_TOKENS)


def llama_kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, cache_type: str) -> float:
    values = 2 * layers * kv_heads * head_dim  # keys and values
    return values * (2 if cache_type == "f16" else 34 / 32)


class ShrikeRunner:
    def __init__(self, model: str, kv_dtype: str, context: int, threads: int):
        from shrike.engine.llm_engine import EngineConfig, LLMEngine
        from shrike.model.config import ModelConfig
        from shrike.layers.kv_dtypes import kv_cache_bytes, resolve_kv_cache_dtype
        import torch

        c = ModelConfig.from_dir(Path(model))
        value_bytes, scale_bytes = kv_cache_bytes(resolve_kv_cache_dtype(kv_dtype, torch.bfloat16))
        per_token = 2 * c.num_layers * c.num_kv_heads * (c.head_dim * value_bytes + scale_bytes)
        max_len = context + 2 * DECODE_TOKENS
        space = (max_len + 64) * per_token / 2**30
        self.engine = LLMEngine(EngineConfig(model=model, max_model_len=max_len, max_num_seqs=1,
                                             max_num_batched_tokens=2048, kv_cache_space=space,
                                             kv_cache_dtype=kv_dtype, cpu_threads=threads, progress=False))
        self.context = context
        self.prompt = [(i * 7919) % 20000 + 100 for i in range(context)]
        self.kv_bytes = self.engine.kv_plan.bytes_per_token * context
        self.prefill_seconds = None

    def decode(self) -> float:
        """One request of the prompt plus 32 tokens -> decode tokens/s (the first request also prefills)."""
        from shrike.sampling.params import SamplingParams
        engine = self.engine
        engine.add_request(f"bench-{time.monotonic_ns()}", self.prompt,
                           SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True))
        start, first = time.perf_counter(), None
        while engine.has_unfinished():
            if engine.step() and first is None:
                first = time.perf_counter()
        end = time.perf_counter()
        if self.prefill_seconds is None:
            self.prefill_seconds = first - start
        return DECODE_TOKENS / (end - first)


def main(argv: list[str] | None = None) -> int:
    peers = os.environ.get("SHRIKE_PEERS_DIR") or str(Path.home() / ".cache" / "shrike-peers")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--shrike-model", default=f"{peers}/models/minicpm5-2b-synth-w4a8-g128")
    parser.add_argument("--gguf", default=f"{peers}/models/minicpm5-2b-q4_0.gguf")
    parser.add_argument("--llama-bench", default=f"{peers}/llama-build/bin/llama-bench")
    parser.add_argument("--reps", type=int, default=3, help="Shrike decode measurements per cache dtype")
    parser.add_argument("--llama-reps", type=int, default=1, help="llama-bench runs per cache type (each prefills)")
    parser.add_argument("--engines", default="shrike,llama.cpp")
    parser.add_argument("--llama-kv", default=",".join(LLAMA_KV),
                        help="llama.cpp cache types to run (default f16,q8_0; at 32k each run prefills for 12+ minutes)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = parser.parse_args(argv)
    engines = args.engines.split(",")

    from shrike.model.config import ModelConfig
    c = ModelConfig.from_dir(Path(args.shrike_model))
    for asked in args.contexts:
        context = min(asked, c.max_position_embeddings - 2 * DECODE_TOKENS)
        if context != asked:
            print(f"context {asked}: run at depth {context} (the model's limit is {c.max_position_embeddings} positions)")
        samples: dict[str, list[float]] = {}
        kv_bytes: dict[str, float] = {}
        notes: dict[str, str] = {}
        runners = {}
        if "shrike" in engines:
            for kv in SHRIKE_KV:
                runner = ShrikeRunner(args.shrike_model, kv, context, args.threads)
                samples[f"shrike {kv}"] = [runner.decode()]  # includes the prefill (not timed as decode)
                notes[f"shrike {kv}"] = f"prefill {context / runner.prefill_seconds:.1f} tok/s"
                kv_bytes[f"shrike {kv}"] = runner.kv_bytes
                runners[kv] = runner
        for rep in range(max(args.reps - 1, args.llama_reps if "llama.cpp" in engines else 0)):
            if rep < args.reps - 1:
                for kv, runner in runners.items():
                    samples[f"shrike {kv}"].append(runner.decode())
            if "llama.cpp" in engines and rep < args.llama_reps:
                for cache_type in args.llama_kv.split(","):
                    name = f"llama.cpp {cache_type}"
                    samples.setdefault(name, []).append(
                        llama_decode(args.llama_bench, args.gguf, cache_type, context, args.threads))
                    kv_bytes[name] = llama_kv_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim,
                                                              cache_type) * context
        del runners
        print(f"\ncontext {context} tokens, {args.threads} threads, decode {DECODE_TOKENS} tokens")
        print(f"{'engine / KV cache':<22}{'decode tok/s':>13}{'KV MiB/seq':>12}  samples")
        medians = {}
        for name, values in samples.items():
            medians[name] = statistics.median(values)
            print(f"{name:<22}{medians[name]:>13.2f}{kv_bytes[name] / 2**20:>12.1f}  "
                  f"{', '.join(f'{v:.2f}' for v in values)}  {notes.get(name, '')}")
        if "shrike int8" in medians:
            line = (f"int8 / bf16: decode {medians['shrike int8'] / medians['shrike bfloat16']:.2f}x, "
                    f"memory {kv_bytes['shrike int8'] / kv_bytes['shrike bfloat16']:.3f}x")
            if "llama.cpp q8_0" in medians:
                line += f"; Shrike int8 / llama.cpp q8_0: decode {medians['shrike int8'] / medians['llama.cpp q8_0']:.2f}x"
            print(line)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps({"context": context, "threads": args.threads, "time": time.strftime("%Y-%m-%d %H:%M"),
                                    "samples": samples, "medians": medians, "kv_bytes_per_seq": kv_bytes,
                                    "notes": notes}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
