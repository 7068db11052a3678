"""Python time per engine step: LLMEngine.step and ModelRunner.step minus the time inside the
executor's C++ calls, batch-1 decode (default: 200 steps after 20 warm-up steps).

    python benchmarks/bench_step_overhead.py MODEL_DIR [--steps 200] [--batch 1] [--eager] [--ops] [--dtype D] [--depth N]

Prints medians in ms: the C++ forward, the runner's Python around it (of which the sampler), and
the rest of the engine step (scheduling, postprocessing, detokenizing). `--ops` then runs as many
steps again with the executor's per-op timer on and prints where the forward goes: each op kind
(a linear by its N x K) with its calls and milliseconds per step, its share of the forward, and the
gap between the summed ops and the executor's run calls (the binding, the GIL hand-over). A benchmark, not a test:
timings on a shared machine are noisy, so the Python share is also given as the main thread's CPU
time (time.thread_time), which other processes on the machine do not inflate as much.
"""
from __future__ import annotations

import argparse
import statistics
import time

from shrike.engine import model_runner
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams


class _Timed:
    """Wraps a callable and records the wall time and the calling thread's CPU time of each call."""

    def __init__(self, fn):
        self.fn, self.times, self.cpu = fn, [], []

    def __call__(self, *args, **kwargs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.times.append(time.perf_counter() - start)
            self.cpu.append(time.thread_time() - start_cpu)


class _TimedExecutor:
    """The executor's methods the step calls, with `run` (one call per tape segment) timed."""

    def __init__(self, exe):
        self.exe, self.run = exe, _Timed(exe.run)

    def __getattr__(self, name):
        return getattr(self.exe, name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--eager", action="store_true", help="time the eager Python forward instead")
    p.add_argument("--ops", action="store_true", help="then profile the compiled forward op by op")
    p.add_argument("--dtype", default="auto", help="--dtype of the engine (default auto)")
    p.add_argument("--depth", type=int, default=4, help="prompt tokens already in the cache when decode starts")
    args = p.parse_args()
    if args.depth + args.warmup + args.steps + 2 > 2048:
        p.error("--depth plus --warmup plus --steps must fit the 2048-token context")
    engine = LLMEngine(EngineConfig(model=args.model, max_model_len=2048, max_num_batched_tokens=2048, kv_cache_space=0.25,
                                    compiled_forward=not args.eager, dtype=args.dtype,
                                    progress=False))
    runner = engine.runner
    print(f"op executor: {runner.compiled.describe() if runner.compiled else 'no (' + runner.eager_reason + ')'}")
    forward_name = "_run_compiled" if runner.compiled else "_run_eager"
    if runner.compiled:
        runner.compiled.exe = _TimedExecutor(runner.compiled.exe)
    forward = _Timed(getattr(runner, forward_name))
    setattr(runner, forward_name, forward)
    runner.step = step = _Timed(runner.step)
    model_runner.sample = sampler = _Timed(model_runner.sample)
    total = args.warmup + args.steps
    params = SamplingParams(max_tokens=total + 1, temperature=0, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"r{i}", prompt(args.depth, i), params)
    engine.step()  # prefill
    engine_step = _Timed(engine.step)
    for _ in range(total):
        engine_step()
    n = args.steps
    inner = runner.compiled.exe.run if runner.compiled else forward
    ms = lambda xs: statistics.median(xs[-n:]) * 1e3  # noqa: E731
    minus = lambda a, b: [x - y for x, y in zip(a[-n:], b[-n:])]  # noqa: E731
    print(f"batch {args.batch}, {n} decode steps, medians in ms: wall / main-thread CPU")
    print(f"  forward ({'C++ call' if runner.compiled else 'eager Python model'})"
          f"{ms(inner.times):>12.3f} / {ms(inner.cpu):.3f}")
    print(f"  runner.step minus forward {ms(minus(step.times, inner.times)):>10.3f} / "
          f"{ms(minus(step.cpu, inner.cpu)):.3f}   of which sampler {ms(sampler.times):.3f} / {ms(sampler.cpu):.3f}")
    print(f"  engine.step minus forward {ms(minus(engine_step.times, inner.times)):>10.3f} / "
          f"{ms(minus(engine_step.cpu, inner.cpu)):.3f}")
    print(f"  engine.step               {ms(engine_step.times):>10.3f} / {ms(engine_step.cpu):.3f}")
    if args.ops and runner.compiled:
        print_op_profile(engine, runner.compiled.exe, n, args.batch, args.depth)


def prompt(depth: int, stream: int) -> list[int]:
    return [1, 2, 3] + [(4 + stream + 7 * i) % 1000 + 4 for i in range(max(1, depth - 3))]


def print_op_profile(engine, timed_exe, steps: int, batch: int, depth: int) -> None:
    params = SamplingParams(max_tokens=steps + 2, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"profiled{i}", prompt(depth, i), params)
    engine.step()  # prefill, not profiled
    exe = timed_exe.exe
    exe.set_profiling(True)
    calls_before = len(timed_exe.run.times)
    for _ in range(steps):
        engine.step()
    forward_ns = sum(timed_exe.run.times[calls_before:]) * 1e9
    nanoseconds = exe.op_nanoseconds
    exe.set_profiling(False)
    kinds: dict[tuple[str, str], list[float]] = {}
    for name, detail, ns in zip(exe.op_names, exe.op_details, nanoseconds):
        kind = kinds.setdefault((name, detail), [0, 0.0])
        kind[0] += 1
        kind[1] += ns
    print(f"per op over {steps} more steps (executor timer on), ms per step:")
    print(f"  {'op':<28}{'calls':>6}{'ms':>9}{'share':>8}")
    for (name, detail), (calls, ns) in sorted(kinds.items(), key=lambda item: -item[1][1]):
        label = f"{name} {detail}".strip()
        print(f"  {label:<28}{calls:>6}{ns / steps / 1e6:>9.3f}{ns / forward_ns:>8.1%}")
    summed = sum(nanoseconds)
    print(f"  {'run call, not in an op':<28}{'':>6}{(forward_ns - summed) / steps / 1e6:>9.3f}"
          f"{(forward_ns - summed) / forward_ns:>8.1%}")


if __name__ == "__main__":
    main()
