"""What LoRA adapters cost: decode at batch 1 and 8 concurrent streams with 0, 1 and 4 distinct adapters, against
the base model in an engine started without --enable-lora, interleaved in one run.

    python benchmarks/bench_lora.py [MODEL] [--rank 16] [--reps 5] [--threads 2]

MODEL defaults to the bundled SmolLM2-135M-Instruct GGUF (run natively). The adapters are written by peft with
random non-zero A and B on every linear (q, k, v, o, gate, up, down) of the model's Hugging Face form. Each
stream decodes 64 tokens after a 32-token prompt; tokens/s counts decoded tokens over the time from the first
step with every stream decoding to the last. Medians of --reps rounds, each round running every case once.
Target (issue 38): one adapter costs <= 15% of the base decode speed, four mixed <= 30%.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

PROMPT_TOKENS, DECODE_TOKENS = 32, 64
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapters(hf_dir: Path, out: Path, count: int, rank: int) -> list[Path]:
    import peft
    import torch
    import transformers
    base = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    paths = []
    for i in range(count):
        torch.manual_seed(i + 1)
        config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
        model = peft.get_peft_model(base, config)
        model.save_pretrained(out / f"adapter{i}")
        base = model.unload()
        paths.append(out / f"adapter{i}")
    return paths


def decode_rate(engine, streams: int, loras: list) -> float:
    """Decoded tokens/s of `streams` concurrent greedy requests, the i-th with loras[i % len(loras)] (or none)."""
    from shrike.sampling.params import SamplingParams
    params = SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0, ignore_eos=True)
    for s in range(streams):
        prompt = [(s * 131 + j * 7919) % 20000 + 100 for j in range(PROMPT_TOKENS)]
        engine.add_request(f"bench-{time.monotonic_ns()}-{s}", prompt, params,
                           lora_request=loras[s % len(loras)] if loras else None)
    started: set[str] = set()
    while engine.has_unfinished() and len(started) < streams:  # prefill until every stream has its first token
        started.update(out.request_id for out in engine.step() if out.num_output_tokens > 0)
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return streams * DECODE_TOKENS / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    from shrike.default_model import converted_gguf_dir, default_gguf_path, gguf_source
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.engine.lora import LoRARequest

    gguf = gguf_source(args.model)
    hf_dir = converted_gguf_dir(gguf) if gguf else Path(args.model)
    model = args.model or str(default_gguf_path())

    def engine(enable_lora: bool) -> LLMEngine:
        return LLMEngine(EngineConfig(model=model, max_model_len=512, max_num_seqs=8, cpu_threads=args.threads,
                                      enable_prefix_caching=False, progress=False, enable_lora=enable_lora,
                                      max_loras=4, max_lora_rank=args.rank))

    with tempfile.TemporaryDirectory() as tmp:
        paths = write_adapters(hf_dir, Path(tmp), 4, args.rank)
        requests = [LoRARequest(f"adapter{i}", i + 1, str(p)) for i, p in enumerate(paths)]
        base, with_lora = engine(False), engine(True)
        cases = {"base model": (base, []), "lora engine, no adapter": (with_lora, []),
                 "1 adapter": (with_lora, requests[:1]), "4 adapters": (with_lora, requests)}
        for streams in (1, 8):
            for eng, loras in cases.values():
                decode_rate(eng, streams, loras)  # warm-up: loads the adapters into their slots
        runs = {(name, streams): [] for name in cases for streams in (1, 8)}
        for _ in range(args.reps):
            for (name, streams), samples in runs.items():
                eng, loras = cases[name]
                samples.append(decode_rate(eng, streams, loras))

    print(f"{Path(model).name}, LoRA rank {args.rank} on {', '.join(TARGETS)}, {args.threads} threads, "
          f"medians of {args.reps} interleaved rounds (decoded tokens/s)")
    print(f"{'case':<26}{'1 stream':>10}{'vs base':>9}{'8 streams':>11}{'vs base':>9}")
    for name in cases:
        cells = []
        for streams in (1, 8):
            rate = statistics.median(runs[(name, streams)])
            cells.append(f"{rate:>10.1f}{rate / statistics.median(runs[('base model', streams)]):>8.2f}x")
        print(f"{name:<26}{cells[0]}{' '}{cells[1]}")
    for key, samples in runs.items():
        print(f"  {key}: " + ", ".join(f"{s:.1f}" for s in samples))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
