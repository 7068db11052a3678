"""A GGUF file run natively (its quant blocks on the int8 kernels) next to its bf16 conversion and llama.cpp's
`llama-bench` on the same file (and any --peer build, e.g. ik_llama.cpp's), interleaved in one run, with the
read probe before and after; then each Shrike mode's resident memory beside the file size, each in a fresh
process.

    python benchmarks/bench_gguf_native.py MODEL.gguf [--llama-bench PATH] [--reps 5] [--threads 2]
        [--peer "ik_llama.cpp=IK_BUILD/bin/llama-bench -rtr 1"] [--modes native,native:bfloat16,bf16]

Prefill: a 512-token prompt's time to first token; decode: 32 further greedy tokens at batch 1 (Shrike), and
`llama-bench` decoding with the same 512 tokens cached (bench_engine_vs_llamacpp.py's measurements). Medians
of --reps rounds, each round running every engine once. Decode GB/s: the file's bytes a token reads (every
matrix but an untied embedding; bench_serving.gguf_bytes_per_token) times tokens/s, the same bytes for every
engine, and its share of the best probe reading of the run. Resident memory: VmRSS after loading and one
short request, with a 128 MiB KV cache.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

MODES = ("native", "bf16")


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_engine(gguf: str, mode: str, threads: int):
    """mode: a --gguf-weights mode, optionally with a --dtype after a colon (native:float32)."""
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    weights, _, dtype = mode.partition(":")
    return LLMEngine(EngineConfig(model=gguf, gguf_weights=weights, dtype=dtype or "auto", max_model_len=1024,
                                  max_num_seqs=1, max_num_batched_tokens=512, kv_cache_space=0.125,
                                  enable_prefix_caching=False, cpu_threads=threads, progress=False))


def resident_mib(gguf: str, mode: str, threads: int) -> float:
    """VmRSS of a fresh process that loaded the model in `mode` and answered one short request."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from bench_gguf_native import make_engine\n"
            "from shrike.sampling.params import SamplingParams\n"
            f"e = make_engine({gguf!r}, {mode!r}, {threads})\n"
            "e.add_request('r', list(range(100, 164)), SamplingParams(max_tokens=8, temperature=0))\n"
            "while e.has_unfinished(): e.step()\n"
            "print(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    peers_dir = os.environ.get("SHRIKE_PEERS_DIR") or str(Path.home() / ".cache" / "shrike-peers")
    parser.add_argument("--llama-bench", default=f"{peers_dir}/llama-build/bin/llama-bench")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                        help="another llama-bench timed in the same rounds, with its flags, e.g. "
                             "'ik_llama.cpp=/path/llama-bench -rtr 1' (repeatable)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="Shrike's --gguf-weights modes to run, each optionally with a --dtype (native:bfloat16)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or {m.partition(":")[0] for m in modes} - set(MODES):
        parser.error(f"--modes: a comma-separated subset of {','.join(MODES)}, each optionally with :DTYPE")
    peers = {"llama.cpp": [args.llama_bench]}
    for peer in args.peer:
        name, _, command = peer.partition("=")
        if not name or not command.strip():
            parser.error(f"--peer {peer!r}: expected NAME=COMMAND")
        peers[name] = shlex.split(command)
    vs_llamacpp, read_probe = _sibling("bench_engine_vs_llamacpp"), _sibling("read_probe")
    token_bytes = _sibling("bench_serving").gguf_bytes_per_token(Path(args.gguf))
    probe = read_probe.ReadProbe(max_threads=args.threads)
    probe.sweep()

    engines = {f"shrike-{mode}": make_engine(args.gguf, mode, args.threads) for mode in modes}
    for engine in engines.values():
        vs_llamacpp.shrike_run(engine)  # warm-up
    bw_before = probe.gb_per_s()
    runs = {name: [] for name in [*engines, *peers]}
    for _ in range(args.reps):
        for name, engine in engines.items():
            runs[name].append(vs_llamacpp.shrike_run(engine))
        for name, command in peers.items():
            runs[name].append(vs_llamacpp.llama_bench(command, args.gguf, args.threads))
    bw_after = probe.gb_per_s()
    del engines

    bw = max(bw_before, bw_after)
    print(f"{Path(args.gguf).name}, {args.threads} threads, medians of {args.reps} interleaved rounds; read "
          f"bandwidth {bw_before:.1f} -> {bw_after:.1f} GB/s ({probe.describe()}); {token_bytes / 1e9:.3f} GB "
          "of the file read per decoded token")
    print(f"{'engine':<16}{'prefill-512 tok/s':>19}{'decode b1 tok/s':>17}{'decode GB/s':>13}{'of probe':>10}")
    medians = {}
    for name, samples in runs.items():
        medians[name] = statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)
        rate = medians[name][1] * token_bytes / 1e9
        print(f"{name:<16}{medians[name][0]:>19.1f}{medians[name][1]:>17.2f}{rate:>13.1f}{rate / bw:>10.0%}")
    first = f"shrike-{modes[0]}"  # the ratios are the first mode's
    for name in [n for n in medians if n != first]:
        print(f"{first} / {name}: prefill {medians[first][0] / medians[name][0]:.2f}x, "
              f"decode {medians[first][1] / medians[name][1]:.2f}x")
    for name, samples in runs.items():
        print(f"  {name} runs (prefill, decode): " + ", ".join(f"({p:.1f}, {d:.2f})" for p, d in samples))
    file_mib = Path(args.gguf).stat().st_size / 2**20
    for mode in modes:
        rss = resident_mib(args.gguf, mode, args.threads)
        print(f"resident memory, shrike-{mode}: {rss:.0f} MiB (file {file_mib:.0f} MiB, {rss / file_mib:.2f}x; "
              "process total incl. torch and a 128 MiB KV cache)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
