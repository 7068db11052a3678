"""bf16 dense_linear GFLOP/s (2 M N K / median time) on the SmolLM2 and MiniCPM5-2B shapes, the weights in
the form the engine loads them (AMX tiles on the amx level), and an in-process 8 x 256-token prefill and a
batch-1 decode of a bf16 model through the engine. A benchmark, not a test: on a shared machine take the
medians as rough.

    python benchmarks/bench_dense.py kernels [--m 1,512,2048]
    python benchmarks/bench_dense.py model [MODEL_DIR]      (default: the converted SmolLM2-135M)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from shrike import _C, kernels
from shrike.ops import weight_for_op
from shrike.ops import dense_linear_kernel

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576), (2560, 2048), (12288, 2048), (2048, 6144),
          (130560, 2048)]
MAX_FLOP_PER_CALL = 2e11  # skips 130560 x 2048 at M = 2048 (a second per call)


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_table(ms: list[int]) -> None:
    print(f"dense_linear bf16 GFLOP/s, variant {_C.dense_variant('bfloat16', 'bfloat16')}, "
          f"{kernels.get_threads()} threads")
    print(f"{'N x K':>13} " + " ".join(f"{f'M={m}':>8}" for m in ms))
    for n, k in SHAPES:
        weight = weight_for_op((torch.randn(n, k) * 0.05).bfloat16(), dense_linear_kernel)
        cells = []
        for m in ms:
            if 2 * m * n * k > MAX_FLOP_PER_CALL:
                cells.append(f"{'-':>8}")
                continue
            x, out = torch.randn(m, k).bfloat16(), torch.empty(m, n, dtype=torch.bfloat16)
            seconds = median_seconds(lambda: dense_linear_kernel(x, weight, None, out), 20 if m == 1 else 3)
            cells.append(f"{2 * m * n * k / seconds / 1e9:8.0f}")
        print(f"{f'{n}x{k}':>13} " + " ".join(cells), flush=True)


def model_numbers(model_dir: str) -> None:
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.sampling.params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model_dir, dtype="bfloat16", max_model_len=1024, kv_cache_space=0.5,
                                    progress=False))
    gen = torch.Generator().manual_seed(0)

    def prefill(tag: str) -> float:
        params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
        for i in range(8):
            engine.add_request(f"{tag}{i}", torch.randint(100, 40000, (256,), generator=gen).tolist(), params)
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return 8 * 256 / (time.perf_counter() - start)

    prefill("warm-up")
    rates = [prefill(f"run{r}-") for r in range(3)]
    print(f"8 x 256 prefill: {statistics.median(rates):.0f} tok/s (runs {', '.join(f'{r:.0f}' for r in rates)})")
    engine.add_request("decode", [1, 2, 3, 4], SamplingParams(max_tokens=140, temperature=0, ignore_eos=True))
    engine.step()
    steps = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    print(f"batch-1 decode: {1 / statistics.median(steps[10:]):.1f} tok/s (median step)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["kernels", "model"])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--m", default="1,512,2048", help="row counts of the kernel table")
    args = p.parse_args()
    if args.what == "kernels":
        kernel_table([int(m) for m in args.m.split(",")])
    else:
        from shrike.default_model import default_model_dir
        model_numbers(args.model or str(default_model_dir()))


if __name__ == "__main__":
    main()
