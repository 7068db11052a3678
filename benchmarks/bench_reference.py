"""Shrike's engine on an unquantized model next to Hugging Face transformers `generate`, in one run.

Time to first token (prompt prefill + first sampled token) and decode tokens/s, greedy, for
fp32 and bf16, medians over --reps interleaved repetitions (the machine's speed drifts).
    python benchmarks/bench_reference.py [--model DIR] [--reps 5] [--tokens 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _shrike_run(engine, prompt_ids: list[int], tokens: int) -> tuple[float, float]:
    from shrike.sampling.params import SamplingParams
    start = time.perf_counter()
    engine.add_request("bench", prompt_ids, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
    first = None
    while engine.has_unfinished():
        if engine.step() and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return first - start, (tokens - 1) / (end - first)


def _hf_run(model, prompt_ids: list[int], tokens: int) -> tuple[float, float]:
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        total = time.perf_counter() - start
    # generate() has no streaming hook cheap enough to time here: decode = the rest after one prefill.
    return ttft, (tokens - 1) / max(total - ttft, 1e-9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", default=None, help="write results here")
    args = parser.parse_args(argv)

    import transformers

    from shrike.default_model import resolve_model
    from shrike.engine.llm_engine import EngineConfig, LLMEngine

    model_dir = resolve_model(args.model)
    results = {}
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        engine = LLMEngine(EngineConfig(model=str(model_dir), dtype=dtype_name, max_model_len=1024, max_num_seqs=1,
                                        progress=False))
        prompt_ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}]),
                                             add_special_tokens=False)
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        _shrike_run(engine, prompt_ids, 4)
        _hf_run(hf, prompt_ids, 4)
        runs = {"shrike": [], "transformers": []}
        for _ in range(args.reps):
            runs["shrike"].append(_shrike_run(engine, prompt_ids, args.tokens))
            runs["transformers"].append(_hf_run(hf, prompt_ids, args.tokens))
        for name, samples in runs.items():
            results[f"{name} {dtype_name}"] = {
                "ttft_s": statistics.median(s[0] for s in samples),
                "decode_tok_s": statistics.median(s[1] for s in samples),
                "prompt_tokens": len(prompt_ids),
            }
        del engine, hf
    print(f"{'engine':<24}{'TTFT (s)':>10}{'decode tok/s':>14}   (medians of {args.reps}, {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads)")
    for name, r in results.items():
        print(f"{name:<24}{r['ttft_s']:>10.3f}{r['decode_tok_s']:>14.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
