"""Linear kernel benchmark (also ``shrike bench kernels``).

M = 1 (decode): effective weight-read bandwidth of W4A8-G128 and W8A8 GEMV, cycling through at
least ``--gb`` GB of distinct packed weights so the last-level cache cannot serve them, next to
the best read of an equally large buffer on the same thread pool (benchmarks/read_probe.py).
M > 1 (``--m``, prefill): GOP/s (2 M N K / time) of W4A8-G128 and W8A8 next to torch fp32 and
bf16 matmul on the same shapes, torch limited to the same thread count.
GGUF block layouts (``--grouped``, the grouped kernel a GGUF file runs on): M = 1 GB/s of each layout as
the file's types pack it (Q4_0, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_XS), the same cycling and probe, with the bits
each weight takes.
Dense (the built-in ``dense_linear`` op, bf16 weights in the form the engine loads them: AMX tiles
on the amx level): GB/s of the lm_head shapes (MiniCPM5-2B 130560x2048, SmolLM2 49152x576) at M = 1,
4, 8, each timing interleaved with a read-bandwidth probe so the ratio compares like with like on a
busy machine.

``--isas`` runs the kernels once per variant (e.g. ``avx2,avxvnni,avx512vnni`` or ``all``) and
puts them side by side in one GOP/s table; the default is the active variant only.
Prints tables of medians over ``--reps`` repetitions and writes JSON. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from shrike import kernels
from shrike.convert.gguf_blocks import IQ4_GRID
from shrike.ops import dense_linear_kernel, grouped_linear_kernel, weight_for_op

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read_probe import ReadProbe  # noqa: E402 - beside this file, which `shrike bench` loads by path

SHAPES = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144)}
LM_HEADS = {"minicpm5-2b": (130560, 2048), "smollm2": (49152, 576)}
DENSE_M = (1, 4, 8)
# GGUF types -> (bits, group, has_min, codebook, params) of the grouped weight they pack into
GROUPED = {"q4_0": (4, 32, False, False, "float16"), "q4_k": (4, 32, True, False, "factored"),
           "q5_k": (6, 32, True, False, "factored"), "q6_k": (6, 16, False, False, "factored"),
           "q8_0": (8, 32, False, False, "float16"), "iq4_xs": (4, 32, False, True, "factored")}


CLOCK = time.perf_counter  # --cpu-time switches to time.process_time


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up: page faults, thread wake-up
    times = []
    for _ in range(reps):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return statistics.median(times)


def stream_read_gbs(nbytes: int, reps: int) -> float:
    return ReadProbe(nbytes / (1 << 30), max_threads=kernels.get_threads()).gb_per_s(reps)


def decode_gbs(weight, nbytes_target: int, reps: int) -> tuple[float, float]:
    """(GB/s, microseconds per call) over enough clones of the packed weight to exceed the LLC."""
    copies = max(2, math.ceil(nbytes_target / weight.packed.numel()))
    clones = [type(weight).from_tensors({**weight.tensors(), "packed": weight.packed.clone()}) for _ in range(copies)]
    x = torch.randn(1, weight.k)

    def cycle():
        for w in clones:
            kernels.linear(x, w)

    seconds = median_seconds(cycle, reps) / copies
    return weight.packed.numel() / seconds / 1e9, seconds * 1e6


def make_grouped(n: int, k: int, layout: str) -> kernels.GroupedWeight:
    """Random weights in one of GROUPED's layouts, scales and mins in the form the file's type holds them."""
    bits, group, has_min, codebook, params = GROUPED[layout]
    gen = torch.Generator().manual_seed(n + k + bits)
    low = -128 if bits == 8 else 0 if has_min else -(1 << (bits - 1))
    values = torch.randint(low, low + (1 << bits), (n, k), dtype=torch.int8, generator=gen)
    if codebook:
        values = torch.from_numpy(IQ4_GRID)[torch.randint(0, 16, (n, k), generator=gen)]
    d = dmin = None
    if params == "factored":  # fp16 d (dmin) per 256 K times a 6-bit factor per group, as the K-quants
        d = (torch.rand(n, k // 256, generator=gen) * 1e-3).half().float()
        dmin = (torch.rand(n, k // 256, generator=gen) * 1e-3).half().float() if has_min else None
        def factor(sb):
            return sb.repeat_interleave(256 // group, dim=1) * torch.randint(0, 64, (n, k // group), generator=gen).float()
        scale, mins = factor(d), factor(dmin) if has_min else None
    else:
        scale = (torch.rand(n, k // group, generator=gen) * 0.01).half().float()
        mins = (torch.rand(n, k // group, generator=gen) * 0.01).half().float() if has_min else None
    weight = kernels.GroupedWeight.from_values(values, scale, mins, group, bits, d, dmin, codebook)
    assert weight.params == params
    return weight


def grouped_decode_gbs(weight: kernels.GroupedWeight, nbytes_target: int, reps: int) -> tuple[float, float]:
    """decode_gbs for a grouped weight: (GB/s, microseconds per call)."""
    copies = max(2, math.ceil(nbytes_target / weight.packed.numel()))
    clones = [kernels.GroupedWeight(weight.packed.clone(), weight.n, weight.k, weight.group_size, weight.bits,
                                    weight.has_min, weight.params, weight.codebook) for _ in range(copies)]
    x, out = torch.randn(1, weight.k), torch.empty(1, weight.n)

    def cycle():
        for w in clones:
            grouped_linear_kernel(x, w, None, out)

    seconds = median_seconds(cycle, reps) / copies
    return weight.packed.numel() / seconds / 1e9, seconds * 1e6


def dense_decode(n: int, k: int, nbytes_target: int, reps: int) -> dict[str, dict[str, float]]:
    """Per M: bf16-weight GB/s of dense_linear (fp32 logits) over >= nbytes_target of distinct
    weights, the read bandwidth measured right after each repetition, and the ratio of the medians."""
    gen = torch.Generator().manual_seed(n + k)
    first = torch.empty(n, k, dtype=torch.bfloat16).normal_(0, 0.05, generator=gen)
    copies = max(2, math.ceil(nbytes_target / first.nbytes))
    weights = [weight_for_op(w, dense_linear_kernel) for w in [first] + [first.clone() for _ in range(copies - 1)]]
    probe = ReadProbe(first.nbytes * copies / (1 << 30), max_threads=kernels.get_threads())
    probe.sweep(1)
    results = {}
    for m in DENSE_M:
        x = torch.randn(m, k).bfloat16()
        out = torch.empty(m, n)
        dense_linear_kernel(x, weights[0], None, out)  # warm-up
        gemv, read = [], []
        for _ in range(reps):
            start = time.perf_counter()
            for w in weights:
                dense_linear_kernel(x, w, None, out)
            gemv.append(first.nbytes * copies / (time.perf_counter() - start) / 1e9)
            read.append(probe.gb_per_s(reps=1))
        g, r = statistics.median(gemv), statistics.median(read)
        results[f"M={m}"] = {"gbs": g, "read_gbs": r, "ratio": g / r}
    return results


def prefill_gops(m: int, k: int, w4, w8, reps: int) -> dict[str, float]:
    x = torch.randn(m, k)
    ops = 2 * m * w4.n * k
    return {
        "w4a8_g128": ops / median_seconds(lambda: kernels.linear(x, w4), reps) / 1e9,
        "w8a8": ops / median_seconds(lambda: kernels.linear(x, w8), reps) / 1e9,
    }


def torch_gops(m: int, n: int, k: int, reps: int) -> dict[str, float]:
    x = torch.randn(m, k)
    ops = 2 * m * n * k
    w_fp32 = torch.randn(n, k)
    x_bf16, w_bf16 = x.bfloat16(), w_fp32.bfloat16()
    return {
        "torch_fp32": ops / median_seconds(lambda: x @ w_fp32.T, reps) / 1e9,
        "torch_bf16": ops / median_seconds(lambda: x_bf16 @ w_bf16.T, reps) / 1e9,
    }


def variants(spec: str) -> list[str]:
    available = kernels.available_isas()
    if spec == "all":
        return [isa for isa in available if isa != "scalar"] or ["scalar"]
    names = [name for name in spec.split(",") if name] or [kernels.active_isa()]
    missing = [name for name in names if name not in available]
    if missing:
        raise SystemExit(f"shrike bench kernels: variant {', '.join(missing)} cannot run here; "
                         f"this build and CPU run: {', '.join(available)}")
    return names


def make_weights(n: int, k: int) -> tuple[kernels.W4A8Weight, kernels.W8A8Weight]:
    gen = torch.Generator().manual_seed(n + k)
    w4 = kernels.W4A8Weight.from_int8(
        torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=gen), torch.rand(n, k // 128, generator=gen) * 0.01, 128
    )
    w8 = kernels.W8A8Weight.from_int8(
        torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen), torch.rand(n, 1, generator=gen) * 0.01
    )
    return w4, w8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shrike bench kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="kernel and torch threads (default 2)")
    parser.add_argument("--cpu-bind", default=None, help="CPU list for the kernel pool, e.g. '0,1'")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement; medians are reported")
    parser.add_argument("--gb", type=float, default=1.0, help="GB of distinct weights cycled through at M=1")
    parser.add_argument("--m", default="16,128,512", help="prefill row counts (comma separated)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"subset of {','.join(SHAPES)} ('' for none)")
    parser.add_argument("--lm-heads", default=",".join(LM_HEADS),
                        help=f"dense_linear shapes, subset of {','.join(LM_HEADS)} ('' for none)")
    parser.add_argument("--grouped", default=",".join(GROUPED),
                        help=f"GGUF block layouts at M=1, subset of {','.join(GROUPED)} ('' for none)")
    parser.add_argument("--isas", default="", help="kernel variants to compare, comma separated, or 'all' "
                        "(default: the active one)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with this process's CPU time instead of the wall clock: per-core numbers that "
                             "other processes on a shared machine do not distort (use with --threads 1)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch matmul columns")
    parser.add_argument("--json", default="bench_kernels.json", help="output file")
    args = parser.parse_args(argv)

    isas = variants(args.isas)
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    kernels.set_threads(args.threads, cpu_bind=args.cpu_bind)
    torch.set_num_threads(args.threads)
    target = int(args.gb * 1e9)
    prefill_m = [int(m) for m in args.m.split(",") if m]
    shapes = {name: SHAPES[name] for name in args.shapes.split(",") if name}
    lm_heads = {name: LM_HEADS[name] for name in args.lm_heads.split(",") if name}

    stream = stream_read_gbs(target, args.reps)
    print(f"variants {', '.join(isas)}, {args.threads} threads, best read {stream:.1f} GB/s "
          f"({args.gb:g} GB buffer, median of {args.reps}; {'CPU' if args.cpu_time else 'wall-clock'} time)")
    results = {"isas": isas, "threads": args.threads, "cpu_time": args.cpu_time, "machine": platform.machine(), "stream_read_gbs": stream,
               "decode": {isa: {} for isa in isas}, "prefill": {isa: {} for isa in isas}, "torch": {}}

    print(f"\nM=1 {'shape':>8} {'N x K':>12} {'variant':>11} {'W4A8-G128 GB/s':>15} {'% read':>7} {'us':>7} "
          f"{'W8A8 GB/s':>10} {'% read':>7} {'us':>7}")
    for name, (n, k) in shapes.items():
        w4, w8 = make_weights(n, k)
        for isa in isas:
            kernels.set_isa(isa)
            g4, us4 = decode_gbs(w4, target, args.reps)
            g8, us8 = decode_gbs(w8, target, args.reps)
            results["decode"][isa][name] = {"n": n, "k": k, "w4a8_g128_gbs": g4, "w4a8_us": us4, "w8a8_gbs": g8,
                                            "w8a8_us": us8, "w4a8_g128": 2 * n * k / us4 / 1e3,
                                            "w8a8": 2 * n * k / us8 / 1e3}
            print(f"    {name:>8} {f'{n}x{k}':>12} {isa:>11} {g4:15.1f} {100 * g4 / stream:6.0f}% {us4:7.0f} "
                  f"{g8:10.1f} {100 * g8 / stream:6.0f}% {us8:7.0f}", flush=True)
            for m in prefill_m:
                results["prefill"][isa][f"{name}/M={m}"] = {"n": n, "k": k, "m": m, **prefill_gops(m, k, w4, w8, args.reps)}
        if not args.no_torch:
            for m in prefill_m:
                results["torch"][f"{name}/M={m}"] = torch_gops(m, n, k, args.reps)

    width = max(11, *(len(isa) + 1 for isa in isas))
    header = "".join(f"{isa:>{width}}" for isa in isas)
    torch_header = "" if args.no_torch else f" {'torch f32':>10} {'torch bf16':>11}"
    print("\nGOP/s (2 M N K / median time; M=1 over weights cycled past the LLC)")
    print(f"{'':>14} | {'W4A8-G128':<{width * len(isas)}} | {'W8A8':<{width * len(isas)}} |")
    print(f"{'shape':>8} {'M':>5} | {header} | {header} |{torch_header}")
    for name in shapes:
        for m in [1, *prefill_m]:
            key = f"{name}/M={m}"
            rows = [results["decode"][isa][name] if m == 1 else results["prefill"][isa][key] for isa in isas]
            w4_cells = "".join(f"{r['w4a8_g128']:{width}.1f}" for r in rows)
            w8_cells = "".join(f"{r['w8a8']:{width}.1f}" for r in rows)
            t = results["torch"].get(key)
            torch_cells = f" {t['torch_fp32']:10.1f} {t['torch_bf16']:11.1f}" if t else ""
            print(f"{name:>8} {m:5d} | {w4_cells} | {w8_cells} |{torch_cells}")

    if args.grouped:
        print("\ngrouped_linear (GGUF block layouts), M=1, weights cycled past the LLC")
        print(f"{'shape':>8} {'N x K':>12} {'layout':>7} {'bits/w':>6} {'variant':>11} {'GB/s':>7} {'% read':>7} "
              f"{'us':>7}")
        results["grouped"] = {isa: {} for isa in isas}
        for name, (n, k) in shapes.items():
            for layout in args.grouped.split(","):
                weight = make_grouped(n, k, layout)
                bits_per_weight = 8 * weight.packed.numel() / (n * k)
                for isa in isas:
                    kernels.set_isa(isa)
                    gbs, us = grouped_decode_gbs(weight, target, args.reps)
                    results["grouped"][isa][f"{name}/{layout}"] = {"n": n, "k": k, "bits_per_weight": bits_per_weight,
                                                                  "gbs": gbs, "us": us}
                    print(f"{name:>8} {f'{n}x{k}':>12} {layout:>7} {bits_per_weight:6.2f} {isa:>11} {gbs:7.1f} "
                          f"{100 * gbs / stream:6.0f}% {us:7.0f}", flush=True)
                del weight

    kernels.set_isa(isas[-1])
    print("\ndense_linear, bf16 weights, fp32 out (lm_head shapes; read = probe interleaved with each rep)")
    print(f"{'shape':>12} {'N x K':>12} {'M':>3} {'GB/s':>7} {'read GB/s':>10} {'ratio':>6}")
    results["dense"] = {}
    for name, (n, k) in lm_heads.items():
        rows = dense_decode(n, k, target, args.reps)
        results["dense"][name] = {"n": n, "k": k, **rows}
        for label, r in rows.items():
            print(f"{name:>12} {f'{n}x{k}':>12} {label[2:]:>3} {r['gbs']:7.1f} {r['read_gbs']:10.1f} "
                  f"{100 * r['ratio']:5.0f}%", flush=True)

    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
