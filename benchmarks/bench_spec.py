"""Speculative decoding: single-stream greedy decode speed of Shrike with and without n-gram speculation,
next to llama.cpp's llama-server with and without its own (n-gram and draft-model) speculation.

    python benchmarks/bench_spec.py [--reps 3] [--models smollm2,minicpm5-2b] [--out FILE.json]
    shrike bench spec ...

Workloads: input-grounded (the prompt holds a passage to repeat with one change; for the random-weight
MiniCPM5-2B a token block repeated three times, whose continuation may or may not repeat it) and
open-ended (a story; random tokens for MiniCPM5-2B). Every run is greedy with ignore_eos and the same
output length; the same token ids go to both engines. Shrike decode tok/s = (tokens - 1) / (last token
- first token), in process on --threads threads; llama-server's is its own `timings.predicted_per_second`
(-t --threads). Rounds are interleaved (every engine once per round, rotated), medians reported. One
Shrike engine per model serves both variants: speculation is switched per run on its scheduler.
"""

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from shrike.platform.openmp import peer_environment

PASSAGE = ("The old river ran slowly past the mill, and in the evenings the miller sat by the river with his "
           "daughter, counting the boats that drifted down toward the town. Each boat carried grain, wool or "
           "timber, and each boatman waved as he passed. When the river froze in winter the boats stopped, the "
           "mill wheel stood still, and the miller told stories about the summers of his youth, when the river "
           "had been wider and the town much smaller than it is today.")
GROUNDED_ASK = f"Repeat the following text exactly, but write 'canal' instead of 'river'.\n\n{PASSAGE}"
STORY_ASK = "Write a long story about a fox who finds a lost key in the forest."
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@dataclass
class ModelCase:
    name: str
    shrike_dir: Path
    gguf: Path
    draft_gguf: Path | None  # llama.cpp draft model, None: no draft of this shape exists
    draft_dir: Path | None  # Shrike draft model, None: none
    output_tokens: int
    chat: bool  # a real instruct model (prompts through its chat template) or random weights (token ids)


@dataclass
class Result:
    speeds: list[float] = field(default_factory=list)
    acceptance: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, binary: Path, gguf: Path, threads: int, extra: list[str], log: Path):
        import httpx
        self.port = free_port()
        self.log = log.open("wb")
        command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                   "-tb", str(threads), "-np", "1", "-c", "4096", "--no-webui", *extra]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env=peer_environment() | {"OMP_NUM_THREADS": str(threads)})
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited while starting: {' '.join(command)}; log {log}")
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not ready; log {log}")
            time.sleep(0.1)

    def run(self, prompt: list[int], n: int) -> tuple[float, float | None]:
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        timings = self.http.post("/completion", json=body).json()["timings"]
        drafted = timings.get("draft_n") or 0
        accepted = timings.get("draft_n_accepted") or 0
        return timings["predicted_per_second"], (accepted / drafted if drafted else None)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)
        self.http.close()
        self.log.close()


def shrike_run(engine, prompt: list[int], n: int, speculate: bool) -> tuple[float, float | None]:
    from shrike.sampling.params import SamplingParams
    spec = engine.speculator
    engine.scheduler.speculator = spec if speculate else None
    before = (spec.stats.num_proposed, spec.stats.num_accepted)
    engine.add_request(f"bench-{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=n, temperature=0,
                                                                              ignore_eos=True))
    first = None
    while engine.has_unfinished():
        if engine.step() and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    proposed = spec.stats.num_proposed - before[0]
    accepted = spec.stats.num_accepted - before[1]
    return (n - 1) / (end - first), (accepted / proposed if proposed else None) if speculate else None


def prompts_for(case: ModelCase, tokenizer) -> dict[str, list[int]]:
    if case.chat:
        def chat(text: str) -> list[int]:
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
            return tokenizer.encode(rendered, add_special_tokens=False)
        return {"input-grounded": chat(GROUNDED_ASK), "open-ended": chat(STORY_ASK)}
    rng = random.Random(0)
    block = [rng.randrange(1000, 30000) for _ in range(48)]
    return {"input-grounded": block * 3, "open-ended": [rng.randrange(1000, 30000) for _ in range(144)]}


def make_draft_gguf(peers: Path, source: Path, work: Path) -> Path | None:
    """SmolLM2 in Q2_K (more aggressive than the target's Q4_0) as llama.cpp's draft model."""
    target = work / "smollm2-135m-q2_k.gguf"
    if not target.exists():
        quantize = peers / "llama-build/bin/llama-quantize"
        if not source.exists() or not quantize.exists():
            return None
        subprocess.run([str(quantize), str(source), str(target), "Q2_K"], check=True, capture_output=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    peers_default = os.environ.get("SHRIKE_PEERS_DIR") or str(Path.home() / ".cache" / "shrike-peers")
    parser.add_argument("--peers", type=Path, default=Path(peers_default))
    parser.add_argument("--models", default="smollm2,minicpm5-2b")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default: print only)")
    args = parser.parse_args(argv)

    from shrike.engine.llm_engine import EngineConfig, LLMEngine

    models = args.peers / "models"
    work = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "shrike-bench-spec"
    work.mkdir(parents=True, exist_ok=True)
    cases = {
        "smollm2": ModelCase("SmolLM2-135M W4A8-G64 / Q4_0", models / "smollm2-135m-w4a8-g64",
                             models / "smollm2-135m-q4_0.gguf",
                             make_draft_gguf(args.peers, models / "smollm2-135m-bf16.gguf", work),
                             # No more aggressive Shrike format fits its 576-wide layers (G128 needs 128 | 576):
                             # the checkpoint drafts for itself, which shows the draft path's cost.
                             models / "smollm2-135m-w4a8-g64", 128, True),
        "minicpm5-2b": ModelCase("MiniCPM5-2B synthetic W4A8-G128 / Q4_0", models / "minicpm5-2b-synth-w4a8-g128",
                                 models / "minicpm5-2b-q4_0.gguf", None, None, 32, False),
    }
    llama = args.peers / "llama-build/bin/llama-server"
    report: dict = {"threads": args.threads, "reps": args.reps, "ngram": NGRAM, "models": {}}
    for key in args.models.split(","):
        case = cases[key]
        engine = LLMEngine(EngineConfig(model=str(case.shrike_dir), max_model_len=4096, max_num_seqs=1,
                                        kv_cache_space=0.5, cpu_threads=args.threads, progress=False,
                                        speculative_config=NGRAM))
        prompts = prompts_for(case, engine.tokenizer)
        drafting = None
        if case.draft_dir is not None:
            drafting = LLMEngine(EngineConfig(
                model=str(case.shrike_dir), max_model_len=4096, max_num_seqs=1, kv_cache_space=0.5,
                cpu_threads=args.threads, progress=False,
                speculative_config={"model": str(case.draft_dir), "num_speculative_tokens": 4}))
        lookup = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "5"]
        variants = {"shrike": ("shrike", False), "shrike ngram": ("shrike", True),
                    "llama.cpp": ("llama", []), "llama.cpp ngram": ("llama", lookup)}
        if drafting is not None:
            variants["shrike draft"] = ("shrike-draft", True)
        if case.draft_gguf is not None:
            variants["llama.cpp draft"] = ("llama", ["-md", str(case.draft_gguf), "--spec-type", "draft-simple",
                                                     "--spec-draft-n-max", "4"])
        servers = {name: LlamaServer(llama, case.gguf, args.threads, v[1], work / f"{key}-{name.replace(' ', '-')}.log")
                   for name, v in variants.items() if v[0] == "llama"}
        results = {w: {name: Result() for name in variants} for w in prompts}
        try:
            for workload, prompt in prompts.items():  # warm-up, unmeasured
                shrike_run(engine, prompt, 8, True)
                if drafting is not None:
                    shrike_run(drafting, prompt, 8, True)
                for server in servers.values():
                    server.run(prompt, 8)
            names = list(variants)
            for rep in range(args.reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for workload, prompt in prompts.items():
                    for name in order:
                        kind, option = variants[name]
                        if kind.startswith("shrike"):
                            speed, acc = shrike_run(drafting if kind == "shrike-draft" else engine, prompt,
                                                    case.output_tokens, option)
                        else:
                            speed, acc = servers[name].run(prompt, case.output_tokens)
                        results[workload][name].speeds.append(speed)
                        if acc is not None:
                            results[workload][name].acceptance.append(acc)
                        print(f"  {key} {workload} {name}: {speed:.1f} tok/s"
                              + (f", acceptance {acc:.0%}" if acc is not None else ""), file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
        del engine, drafting
        table = {}
        print(f"\n{case.name}: {case.output_tokens} tokens, greedy, single stream, {args.threads} threads, "
              f"medians of {args.reps}")
        print(f"{'workload':<16}{'engine':<18}{'decode tok/s':>13}{'acceptance':>12}{'vs Shrike':>11}{'vs llama best':>15}")
        for workload, by_engine in results.items():
            base = statistics.median(by_engine["shrike"].speeds)
            llama_best = max(statistics.median(r.speeds) for n, r in by_engine.items() if n.startswith("llama"))
            table[workload] = {}
            for name, r in by_engine.items():
                speed = statistics.median(r.speeds)
                acc = statistics.median(r.acceptance) if r.acceptance else None
                table[workload][name] = {"decode_tok_s": speed, "acceptance": acc, "runs": r.speeds}
                print(f"{workload:<16}{name:<18}{speed:>13.1f}{'' if acc is None else f'{acc:.0%}':>12}"
                      f"{speed / base:>10.2f}x{speed / llama_best:>14.2f}x")
        report["models"][key] = {"name": case.name, "output_tokens": case.output_tokens, "results": table}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
