"""Accuracy on a small local multiple-choice set, scored through a running `shrike serve` as lm-eval's
`local-completions` model scores loglikelihood tasks.

The questions (benchmarks/data/multiple_choice.jsonl, 52 simple factual and commonsense items written for
this project) are asked zero-shot as "Question: Q\\nAnswer:" followed by " CHOICE". Per choice the whole
text goes to /v1/completions as token ids with echo and logprobs, and the choice's score is the sum of the
logprobs of its own tokens (the continuation tokens: those of context + choice after the context's
tokens); the highest-scoring choice is the model's answer (lm-eval's `acc`). lm-eval asks for one
generated token and drops it; Shrike scores the prompt alone with max_tokens 0. When the tokenizer puts
BOS before a text (Gemma 3) the ids start with it, as lm-eval's tokenizer would put it there.

    python benchmarks/multiple_choice.py MODEL_DIR
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

QUESTIONS = Path(__file__).resolve().parent / "data" / "multiple_choice.jsonl"
READY_TIMEOUT_S = 300


def load_questions() -> list[dict]:
    return [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accuracy(model_dir: Path, log_path: Path) -> float:
    """Share of the questions whose correct choice gets the highest summed logprob from `shrike serve model_dir`."""
    import httpx
    from openai import OpenAI

    from shrike.eval_ppl import scoring_bos
    from shrike.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir)
    bos, _ = scoring_bos(tokenizer, model_dir)
    port = _free_port()
    with log_path.open("wb") as log:
        server = subprocess.Popen([str(Path(sys.executable).with_name("shrike")), "serve", str(model_dir), "--port", str(port),
                                   "--served-model-name", "model", "--max-model-len", "512"],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"shrike serve exited with {server.returncode}; log: {log_path}")
                try:
                    if httpx.get(f"{base}/models", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"shrike serve not ready after {READY_TIMEOUT_S} s; log: {log_path}")
                time.sleep(0.2)
            client = OpenAI(base_url=base, api_key="none")
            correct = 0
            questions = load_questions()
            for item in questions:
                context = f"Question: {item['question']}\nAnswer:"
                context_ids = ([] if bos is None else [bos]) + tokenizer.encode(context, add_special_tokens=False)
                scores = []
                for choice in item["choices"]:
                    ids = ([] if bos is None else [bos]) + tokenizer.encode(f"{context} {choice}",
                                                                            add_special_tokens=False)
                    response = client.completions.create(model="model", prompt=ids, max_tokens=0, echo=True,
                                                         logprobs=1, temperature=0.0)
                    logprobs = response.choices[0].logprobs.token_logprobs  # (len(ids),), the first is None
                    scores.append(sum(logprobs[len(context_ids):]))
                correct += max(range(len(scores)), key=scores.__getitem__) == item["answer"]
            return correct / len(questions)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=60)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    print(f"{path}: {accuracy(path, Path('/tmp/multiple_choice_server.log')):.1%}")
