"""Attention-only speed of `paged_attention` at long context: GFLOP/s of one prefill chunk (the last CHUNK tokens of a
CONTEXT-token sequence) and of one decode step, bf16 queries over a bf16 and an int8 KV cache, per kernel variant.

    python benchmarks/bench_attention.py --contexts 1024 8192 32768 --chunk 512 --isas avx512bf16 amx

Shapes default to MiniCPM5-2B's (16 query heads, 2 KV heads, head_dim 128), block size 16. FLOPs count the two
matrix products over the keys each query sees (4 x head_dim per query head and visible key). Medians of --reps runs;
each variant is run on the same data, interleaved. `--layers N` cycles through N caches per timed call, so that
long contexts are read from memory as in a model, not from the last-level cache.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from shrike import _C
from shrike import kv_int8


def make_case(context: int, q_len: int, heads: int, kv_heads: int, head_dim: int, block_size: int, kv: str,
              seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-context // block_size)
    shape = (blocks * block_size, kv_heads, head_dim)
    k, v = (torch.randn(shape, generator=gen) for _ in range(2))  # (slots, kv_heads, head_dim)
    if kv == "int8":
        k, v = kv_int8.quantize(k), kv_int8.quantize(v)
    else:
        k, v = k.bfloat16(), v.bfloat16()
    q = torch.randn(q_len, heads, head_dim, generator=gen).bfloat16()  # (q_len, heads, head_dim)
    tables = torch.randperm(blocks, generator=gen).int()[None, :]  # (1, blocks)
    query_start = torch.tensor([0, q_len], dtype=torch.int32)
    context_lens = torch.tensor([context], dtype=torch.int32)
    return q, k, v, tables, query_start, context_lens


def gflops(context: int, q_len: int, heads: int, head_dim: int) -> float:
    visible = sum(context - q_len + 1 + i for i in range(q_len))
    return 4 * head_dim * heads * visible / 1e9


def seconds_per_call(call, min_seconds: float = 0.2) -> float:
    """Mean time of one call over a run of at least min_seconds, after a warm-up call."""
    call()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        seconds = time.perf_counter() - start
        if seconds >= min_seconds:
            return seconds / calls
        calls *= 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk: new tokens at the end of the context")
    parser.add_argument("--isas", nargs="+", default=["avx512bf16", "amx"])
    parser.add_argument("--kv", nargs="+", default=["bf16", "int8"])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1,
                        help="caches cycled through per timed call, like a model's layers: with several, a long "
                             "context's cache no longer fits in the last-level cache (an int8 cache at 32k does)")
    args = parser.parse_args(argv)
    _C.set_threads(args.threads, [])
    before = _C.active_isa()
    print(f"{'kv':<5}{'context':>8}{'q_len':>7}" + "".join(f"{isa + ' GFLOP/s':>20}" for isa in args.isas))
    for kv in args.kv:
        for context in args.contexts:
            for q_len in (min(args.chunk, context), 1):
                layers = [make_case(context, q_len, args.heads, args.kv_heads, args.head_dim, args.block_size, kv,
                                    seed) for seed in range(args.layers)]
                out = torch.empty_like(layers[0][0])

                def call():
                    for q, k, v, tables, qs, cl in layers:
                        _C.paged_attention(q, k, v, tables, qs, cl, args.block_size, args.head_dim ** -0.5, out)
                samples: dict[str, list[float]] = {isa: [] for isa in args.isas}
                for _ in range(args.reps):
                    for isa in args.isas:
                        _C.set_isa(isa)
                        seconds = seconds_per_call(call) / args.layers
                        samples[isa].append(gflops(context, q_len, args.heads, args.head_dim) / seconds)
                print(f"{kv:<5}{context:>8}{q_len:>7}" +
                      "".join(f"{statistics.median(samples[isa]):>20.1f}" for isa in args.isas), flush=True)
    _C.set_isa(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
