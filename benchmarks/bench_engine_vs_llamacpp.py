"""Engine-level prefill and decode of one Shrike checkpoint next to `llama-bench` on a GGUF of the
same shape, interleaved in one run, with read bandwidth (benchmarks/read_probe.py: the best method of its sweep)
measured before and after, and each engine's decode weight-read rate beside it.

    python benchmarks/bench_engine_vs_llamacpp.py SHRIKE_DIR MODEL.gguf [--llama-bench PATH] [--reps 3]

Shrike: a 512-token prompt's time to first token gives prefill tokens/s; 32 further greedy
tokens give decode tokens/s. llama.cpp: `llama-bench -p 512 -n 0 -t 2` for prefill and `-p 0 -n 32 -d 512`
(ik_llama.cpp: `-gp 512,32`) for decode, so every engine decodes with the same 512 tokens in its cache (a
plain `-n 32` decodes from an empty cache: SmolLM2 Q4_1 160 tok/s there, 111 at depth 512); each --peer is another
llama-bench build (e.g. ik_llama.cpp's) with its own flags. Medians of --reps. Bytes per decoded token:
every matrix but the embedding, and of MoE experts only the share a token uses.

The MoE benchmark of issue 32 (Qwen3-30B-A3B's layer shapes, 12 of its 48 layers, W4A8-G128 = Q4_0):
    shrike synth M --like qwen3-30b-a3b --layers 12 --scheme w4a8-g128
    python benchmarks/export_gguf.py M M.gguf --dtype q4_0 --output-type q8_0
    python benchmarks/bench_engine_vs_llamacpp.py M M.gguf --lm-head-quant int8 \
        --peer "ik_llama.cpp=IK_BUILD/bin/llama-bench -rtr 1 -fmoe 1"
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import statistics
import subprocess
import time
from pathlib import Path
from shrike.platform.openmp import peer_environment

PROMPT_TOKENS, DECODE_TOKENS = 512, 32


def _bench_json(command: list[str], gguf: str, threads: int, *flags: str) -> list[dict]:
    out = subprocess.run([*command, "-m", gguf, "-t", str(threads), *flags, "-r", "1", "-o", "json"], check=True,
                         capture_output=True, text=True, env=peer_environment()).stdout
    return json.loads(out)


@functools.cache
def _depth_flags(binary: str) -> tuple[str, ...]:
    """llama-bench flags for 32 generated tokens after a 512-token prompt, as Shrike decodes them: mainline's
    `-d` (depth), or ik_llama.cpp's `-gp` (generation after a prompt, timed alone)."""
    usage = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    if "--n-depth" in usage:
        return ("-p", "0", "-n", str(DECODE_TOKENS), "-d", str(PROMPT_TOKENS))
    if "-gp" in usage:
        return ("-p", "0", "-n", "0", "-gp", f"{PROMPT_TOKENS},{DECODE_TOKENS}")
    raise SystemExit(f"{binary}: this llama-bench can generate only from an empty context (no -d or -gp); "
                     "build a newer one with benchmarks/build_peers.sh")


def llama_bench(command: list[str], gguf: str, threads: int) -> tuple[float, float]:
    """(prefill tok/s of a 512-token prompt, decode tok/s of 32 tokens with those 512 in the cache)."""
    prefill = _bench_json(command, gguf, threads, "-p", str(PROMPT_TOKENS), "-n", "0")[0]["avg_ts"]
    decode = next(r["avg_ts"] for r in _bench_json(command, gguf, threads, *_depth_flags(command[0]))
                  if r["n_gen"] == DECODE_TOKENS)
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
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=COMMAND",
                        help="another llama-bench timed in the same rounds, with its flags, e.g. "
                             "'ik_llama.cpp=/path/llama-bench -rtr 1 -fmoe 1' (repeatable)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--with-eager", action="store_true",
                        help="also time Shrike's eager forward (op by op from Python) in the same rounds")
    parser.add_argument("--lm-head-quant", default="none", choices=["none", "int8"],
                        help="Shrike's lm_head: the checkpoint's precision (none) or int8 per vocabulary row")
    args = parser.parse_args(argv)
    others = {"llama.cpp": [args.llama_bench]}
    for peer in args.peer:
        name, _, command = peer.partition("=")
        if not name or not command.strip():
            parser.error(f"--peer {peer!r}: expected NAME=COMMAND")
        others[name] = shlex.split(command)

    import importlib.util

    from shrike.engine.llm_engine import EngineConfig, LLMEngine

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    bench_serving, read_probe = load("bench_serving"), load("read_probe")
    probe = read_probe.ReadProbe(max_threads=args.threads)
    probe.sweep()

    def make_engine(compiled: bool) -> LLMEngine:
        return LLMEngine(EngineConfig(model=args.shrike_model, max_model_len=2048, max_num_seqs=1,
                                      max_num_batched_tokens=PROMPT_TOKENS, kv_cache_space=0.5,
                                      enable_prefix_caching=False, cpu_threads=args.threads, progress=False,
                                      lm_head_quant=args.lm_head_quant, compiled_forward=compiled))

    engine = make_engine(True)
    engines = {"shrike": engine, **({"shrike-eager": make_engine(False)} if args.with_eager else {})}
    # Bytes a decode step reads: every matrix but the input embedding (one row of it), unless it is the head.
    weight_bytes = bench_serving.safetensors_bytes_per_token(Path(args.shrike_model))
    llama_bytes = bench_serving.gguf_bytes_per_token(Path(args.gguf))
    if args.lm_head_quant == "int8":  # the lm_head is read as int8 (1 byte per weight) instead of bf16 (2)
        weight_bytes -= engine.model_config.vocab_size * engine.model_config.hidden_size
    for e in engines.values():
        shrike_run(e)  # warm-up
    bw_before = probe.gb_per_s()
    runs = {name: [] for name in [*engines, *others]}
    for _ in range(args.reps):
        for name, e in engines.items():
            runs[name].append(shrike_run(e))
        for name, command in others.items():
            runs[name].append(llama_bench(command, args.gguf, args.threads))
    bw_after = probe.gb_per_s()
    bw = max(bw_before, bw_after)  # the roofline: what the CPU read at best in this run
    print(f"read bandwidth {bw_before:.1f} -> {bw_after:.1f} GB/s ({probe.describe()}); bytes read per decoded token: "
          f"Shrike {weight_bytes / 1e9:.3f} GB, llama.cpp {llama_bytes / 1e9:.3f} GB")
    print(f"{'engine':<14}{'prefill tok/s':>15}{'decode tok/s':>14}{'decode GB/s':>13}{'of probe':>12}")
    medians = {}
    for name, samples in runs.items():
        nbytes = llama_bytes if name in others else weight_bytes
        prefill, decode = statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)
        medians[name] = (prefill, decode)
        print(f"{name:<14}{prefill:>15.1f}{decode:>14.2f}{decode * nbytes / 1e9:>13.1f}{decode * nbytes / 1e9 / bw:>11.0%}")
    for name in others:
        print(f"Shrike / {name}: prefill {medians['shrike'][0] / medians[name][0]:.2f}x, "
              f"decode {medians['shrike'][1] / medians[name][1]:.2f}x")
    (sp, sd), (lp, ld) = medians["shrike"], medians["llama.cpp"]
    if "shrike-eager" in medians:
        ep, ed = medians["shrike-eager"]
        print(f"Shrike executor / eager: prefill {sp / ep:.2f}x, decode {sd / ed:.2f}x; "
              f"eager / llama.cpp: prefill {ep / lp:.2f}x, decode {ed / ld:.2f}x")
    for name, samples in runs.items():
        print(f"  {name} runs (prefill, decode): " + ", ".join(f"({p:.1f}, {d:.2f})" for p, d in samples))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
