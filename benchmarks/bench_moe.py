"""The moe op at Qwen3-30B-A3B's layer shape (hidden 2048, 128 experts, 8 active, expert intermediate 768): decode
(one token) and prefill (512 tokens) per layer, and decode bandwidth (active expert bytes / time) as a share of a
STREAM-like read measured before and after. Several layers' experts are cycled so the weights come from memory.

  python benchmarks/bench_moe.py [--format w4a8-g128|w8a8|bf16] [--layers 4] [--reps 9]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from shrike import kernels
from shrike.ops import dense_linear_kernel, moe_kernel, weight_for_op
from shrike.weight_formats import ExpertWeights

HIDDEN, EXPERTS, ACTIVE, INTER = 2048, 128, 8, 768


def _weight(n: int, k: int, fmt: str, gen: torch.Generator):
    if fmt == "bf16":
        return weight_for_op((torch.randn(n, k, generator=gen) * 0.02).bfloat16(), dense_linear_kernel)
    values = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=gen) if fmt == "w4a8-g128" \
        else torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    if fmt == "w4a8-g128":
        return kernels.W4A8Weight.from_int8(values, torch.full((n, k // 128), 0.003), 128)
    return kernels.W8A8Weight.from_int8(values, torch.full((n, 1), 0.0002))


def _layer(fmt: str, gen: torch.Generator) -> ExpertWeights:
    op = {"bf16": "dense_linear", "w4a8-g128": "w4a8_linear", "w8a8": "w8a8_linear"}[fmt]
    return ExpertWeights(op, [_weight(2 * INTER, HIDDEN, fmt, gen) for _ in range(EXPERTS)],
                         [_weight(HIDDEN, INTER, fmt, gen) for _ in range(EXPERTS)], INTER)


def _bytes(weight) -> int:
    if isinstance(weight, torch.Tensor):
        return weight.numel() * weight.element_size()
    return (weight.tiles if isinstance(weight, kernels.DenseTileWeight) else weight.packed).numel()


def _median(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="w4a8-g128", choices=["w4a8-g128", "w8a8", "bf16"])
    parser.add_argument("--layers", type=int, default=4, help="layers of experts cycled (more than the caches hold)")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    kernels.set_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    layers = [_layer(args.format, gen) for _ in range(args.layers)]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from read_probe import ReadProbe
    probe = ReadProbe(max_threads=args.threads)
    probe.sweep()
    before = probe.gb_per_s(args.reps)
    x1, x512 = (torch.randn(rows, HIDDEN, generator=gen).bfloat16() for rows in (1, 512))
    out1, out512 = torch.empty_like(x1), torch.empty_like(x512)
    # Each decode token picks its 8 experts at random; every layer's experts are read once per cycle.
    logits = [torch.randn(1, EXPERTS, generator=gen) for _ in layers]
    logits512 = torch.randn(512, EXPERTS, generator=gen)

    def decode():
        for layer, row_logits in zip(layers, logits):
            moe_kernel(x1, row_logits, layer, out1, ACTIVE, True)

    decode_s = _median(decode, args.reps) / len(layers)
    prefill_s = _median(lambda: moe_kernel(x512, logits512, layers[0], out512, ACTIVE, True), max(3, args.reps // 3))
    after = probe.gb_per_s(args.reps)
    expert_bytes = _bytes(layers[0].gate_up[0]) + _bytes(layers[0].down[0])
    active = ACTIVE * expert_bytes
    gbs = active / decode_s / 1e9
    print(f"moe op, Qwen3-30B-A3B layer ({EXPERTS} experts, {ACTIVE} active, {HIDDEN}x{INTER}), {args.format}, "
          f"{args.threads} threads, kernels {kernels.active_isa()}, medians of {args.reps}")
    print(f"  read probe before / after: {before:.1f} / {after:.1f} GB/s ({probe.describe()})")
    print(f"  decode, 1 token: {decode_s * 1e3:.3f} ms per layer, {active / 1e6:.1f} MB of experts read, "
          f"{gbs:.1f} GB/s = {100 * gbs / max(before, after):.0f}% of the read probe")
    print(f"  prefill, 512 tokens: {prefill_s * 1e3:.1f} ms per layer, {512 / prefill_s:.0f} tokens/s per layer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
