"""What constrained decoding costs: token-mask time per step, decode speed and time to first token with a schema.

    python benchmarks/bench_structured.py                  # everything, both backends
    python benchmarks/bench_structured.py --skip-server    # only the mask timings

Mask timings run on SmolLM2's 49,152-token vocabulary and on a 130,560-token one (the size of the 2B
model's) built from SmolLM2's by adding tokens that concatenate two existing ones: real byte strings of
realistic lengths, so the grammar engines walk a trie like a real large vocabulary's.
The server part starts `shrike serve` on the default model and compares, interleaved, median decode tokens/s
of a streamed answer with and without a JSON schema, and median time to first token with a schema never
seen before (compiled on arrival) and without one.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import torch

from shrike.default_model import default_model_dir
from shrike.sampling.grammar import GrammarSpec
from shrike.sampling.grammar_backends import new_grammar_compiler
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, sample
from shrike.tokenizer import Tokenizer

LARGE_VOCAB = 130_560
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
    "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string",
                                                                                     "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "email", "tags", "address"], "additionalProperties": False}
DOCUMENT = {"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "email": "ada@analytical.com",
            "tags": ["admin", "guest"], "address": {"city": "London, Marylebone", "zip": "12345"}}


def large_vocabulary_dir(model_dir: Path, size: int, out: Path) -> Path:
    """A copy of the model's tokenizer grown to `size` tokens by concatenating pairs of existing tokens."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    words = [w for w in vocab if not w.startswith("<")]
    rng = random.Random(0)
    next_id = max([*vocab.values(), *(t["id"] for t in tokenizer.get("added_tokens", []))]) + 1
    while next_id < size:
        word = rng.choice(words) + rng.choice(words)
        if word not in vocab:
            vocab[word] = next_id
            next_id += 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    for name in ("tokenizer_config.json", "generation_config.json"):
        if (model_dir / name).is_file():
            (out / name).write_text((model_dir / name).read_text(encoding="utf-8"), encoding="utf-8")
    return out


def mask_timings(tokenizer_dir: Path, vocab_size: int, backend: str) -> dict:
    tokenizer = Tokenizer(tokenizer_dir)
    start = time.perf_counter()
    compiler = new_grammar_compiler(backend, tokenizer, vocab_size)
    compiler.warm_up()
    setup_s = time.perf_counter() - start
    fresh = dict(SCHEMA, title=uuid.uuid4().hex)  # a schema the compiler has not seen
    start = time.perf_counter()
    matcher = compiler.compile(GrammarSpec("json_schema", fresh, "bench")).matcher()
    mask = torch.empty((vocab_size + 31) // 32, dtype=torch.int32)
    matcher.fill_mask(mask)
    first_mask_ms = (time.perf_counter() - start) * 1e3
    fill = []
    tokens = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    for token in tokens:
        t0 = time.perf_counter()
        matcher.fill_mask(mask)
        fill.append(time.perf_counter() - t0)
        if not matcher.accept(token):
            raise RuntimeError(f"{backend} refused token {token} of the benchmark document")
    # The sampler's step for one row, with the grammar (waiting for the mask computed after the previous
    # token, expanding and applying it, advancing the matcher) and without; greedy on logits that favour the
    # document's next token, so the constrained row walks the document.
    grammar = compiler.compile(GrammarSpec("json_schema", SCHEMA, "bench"))
    eos = frozenset(tokenizer.eos_token_ids)
    constrained = SamplingRow(SamplingParams(temperature=0, grammar=grammar), [0], [], eos, None)
    free = SamplingRow(SamplingParams(temperature=0), [0], [], eos, None)
    with_grammar, without = [], []
    for token in tokens:
        logits = torch.randn(1, vocab_size)
        logits[0, token] = 100.0
        for row, times in ((free, without), (constrained, with_grammar)):
            t0 = time.perf_counter()
            sample(logits, [row])
            times.append(time.perf_counter() - t0)
    return {"backend": backend, "vocab": vocab_size, "tokens": len(tokens), "setup_s": round(setup_s, 2),
            "fresh_schema_first_mask_ms": round(first_mask_ms, 2),
            "mask_us_median": round(statistics.median(fill) * 1e6, 1),
            "mask_us_p90": round(sorted(fill)[int(0.9 * len(fill))] * 1e6, 1),
            "sampler_us_median_with_grammar": round(statistics.median(with_grammar) * 1e6, 1),
            "sampler_us_median_without": round(statistics.median(without) * 1e6, 1)}


def _stream(client: httpx.Client, body: dict) -> tuple[float, list[float]]:
    """-> (time to first token, arrival times of the content chunks)."""
    start = time.perf_counter()
    arrivals = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    arrivals.append(time.perf_counter())
    return arrivals[0] - start, arrivals


def server_timings(backend: str, rounds: int, port: int) -> dict:
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    server = subprocess.Popen([sys.executable, "-m", "shrike.cli", "serve", "--port", str(port),
                               "--structured-outputs-backend", backend, "--disable-log-stats",
                               "--kv-cache-space", "0.5"], stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the server did not start; see {log.name}")
                time.sleep(0.5)
            time.sleep(3)  # let the grammar warm-up thread finish
            ask = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
                   "temperature": 0, "max_tokens": 96}
            story = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
            free_rates, schema_rates, free_ttft, fresh_ttft = [], [], [], []
            _stream(client, {**ask, "ignore_eos": True})  # warm-up
            for _ in range(rounds):
                _, arrivals = _stream(client, {**ask, "ignore_eos": True})
                free_rates.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
                _, arrivals = _stream(client, {**ask, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "s", "schema": story}}})
                schema_rates.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
                short = {**ask, "max_tokens": 2}
                free_ttft.append(_stream(client, short)[0])
                fresh = dict(SCHEMA, title=uuid.uuid4().hex)
                fresh_ttft.append(_stream(client, {**short, "response_format": {
                    "type": "json_schema", "json_schema": {"name": "s", "schema": fresh}}})[0])
    finally:
        server.terminate()
        server.wait(timeout=60)
    free, constrained = statistics.median(free_rates), statistics.median(schema_rates)
    return {"backend": backend, "rounds": rounds,
            "decode_tok_s_without_schema": round(free, 1), "decode_tok_s_with_schema": round(constrained, 1),
            "decode_slowdown_pct": round(100 * (1 - constrained / free), 1),
            "ttft_ms_without_schema": round(1e3 * statistics.median(free_ttft), 1),
            "ttft_ms_fresh_schema": round(1e3 * statistics.median(fresh_ttft), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["llguidance", "xgrammar"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--skip-server", action="store_true")
    args = parser.parse_args()
    model_dir = default_model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        large = large_vocabulary_dir(model_dir, LARGE_VOCAB, Path(tmp) / "large")
        for backend in args.backends:
            for directory, size in ((model_dir, 49152), (large, LARGE_VOCAB)):
                print(json.dumps(mask_timings(directory, size, backend)), flush=True)
    if not args.skip_server:
        for backend in args.backends:
            print(json.dumps(server_timings(backend, args.rounds, args.port)), flush=True)


if __name__ == "__main__":
    main()
