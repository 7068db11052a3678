"""`shrike generate`: one prompt, streamed to the terminal."""
from __future__ import annotations

import argparse
import sys
import time

from shrike.engine.config import engine_config_from_args
from shrike.engine.llm_engine import LLMEngine
from shrike.sampling.params import SamplingParams


def sampling_params_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, min_p=args.min_p, seed=args.seed, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, stop=args.stop,
        ignore_eos=args.ignore_eos)


def run_generate(args: argparse.Namespace) -> int:
    params = sampling_params_from_args(args)
    engine = LLMEngine(engine_config_from_args(args))
    tok = engine.tokenizer
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": args.prompt})
        prompt_ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    else:
        prompt_ids = tok.encode(args.prompt)
    if params.max_tokens is not None:
        params.max_tokens = min(params.max_tokens, engine.max_model_len - len(prompt_ids))
    start = time.perf_counter()
    engine.add_request("cli", prompt_ids, params)
    first = None
    generated = 0
    while engine.has_unfinished():
        for out in engine.step():
            if first is None:
                first = time.perf_counter()
            generated = out.num_output_tokens
            for delta in out.deltas:
                sys.stdout.write(delta.text)
                sys.stdout.flush()
    sys.stdout.write("\n")
    end = time.perf_counter()
    if args.stats and first is not None:
        decode = (generated - 1) / (end - first) if generated > 1 and end > first else float("nan")
        print(f"prompt {len(prompt_ids)} tokens, generated {generated}; time to first token {first - start:.3f} s; "
              f"decode {decode:.1f} tokens/s", file=sys.stderr)
        spec = engine.speculator
        if spec is not None:
            s = spec.stats
            print(f"speculative decoding: {s.num_accepted} of {s.num_proposed} proposed tokens accepted "
                  f"(acceptance rate {s.acceptance_rate:.1%}), {s.num_emitted} tokens from {s.num_drafts} "
                  "verifying steps", file=sys.stderr)
    return 0
