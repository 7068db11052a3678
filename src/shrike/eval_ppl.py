"""`shrike eval-ppl`: perplexity of a model on a text file.

The text is tokenized once (no special tokens) and cut into non-overlapping chunks; each chunk
is scored from scratch as its own sequence. When the model's tokenizer puts a BOS token before a
text (`add_bos_token` in tokenizer_config.json, or else tokenizer.json's post-processor, as
transformers encodes), every chunk is BOS + up to --context - 1 text tokens and all its text tokens
are scored, the first one predicted from BOS alone; a model trained that way scores much worse
without it (Gemma 3 270M on tests/data/public_domain_english.txt: 8.23 with BOS, 31.69 without).
Otherwise a chunk is --context text tokens and its first token is context only.
Perplexity = exp(mean negative log-likelihood of the scored tokens).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shrike.executor.step import EagerStep
from shrike.engine.config import add_engine_arguments, engine_config_from_args
from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.model.llama import CausalLM
from shrike.tokenizer import Tokenizer

DEFAULT_CONTEXT = 512
WINDOWS = ("chunks", "llama.cpp")  # --windows
_BLOCK_SIZE = 16


def add_eval_ppl_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL (optional: omit it when only FILE is given), FILE, --context and every engine flag. The flags that
    shape serving (batching, prefix caching, KV-cache size, speculative decoding) are checked like everywhere
    but change no score: each chunk runs alone from an empty cache of its own."""
    add_engine_arguments(p)
    p.add_argument("file", type=Path, help="UTF-8 text file to score")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                   help=f"tokens per non-overlapping chunk (default {DEFAULT_CONTEXT}; at most --max-model-len)")
    p.add_argument("--windows", choices=WINDOWS, default="chunks",
                   help="chunks: every text token scored once (above); llama.cpp: the windows `llama-perplexity -c "
                        "CONTEXT` scores, to compare with its figures (whole chunks of the BOS-led token stream, "
                        "each chunk's first token made BOS where the tokenizer adds one, only the second half of "
                        "each chunk scored)")


@dataclass
class PerplexityResult:
    nll_sum: float = 0.0
    scored_tokens: int = 0
    greedy_predictions: list[int] = field(default_factory=list)  # argmax for each scored token, in order
    chunks: int = 0

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.scored_tokens)


@torch.inference_mode()
def sequence_logits(model: CausalLM, token_ids: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Logits at every position of one sequence run from an empty KV cache (kv_dtype, default the
    model's): (T, vocab) fp32."""
    c = model.config
    count = len(token_ids)
    blocks = -(-count // _BLOCK_SIZE)
    caches = [KVCache(blocks, _BLOCK_SIZE, c.num_kv_heads, c.head_dim, kv_dtype or model.dtype)
              for _ in range(c.num_layers)]
    step = EagerStep.prefill(model.ops, torch.tensor(token_ids, dtype=torch.int64), _BLOCK_SIZE, torch.arange(count),
                             model.rotary.long_threshold)
    return model.forward(step, caches)


def scoring_bos(tokenizer: Tokenizer, model_dir: Path) -> tuple[int | None, str]:
    """The BOS id every scored sequence starts with (None: none) and where that rule comes from."""
    config_path = Path(model_dir) / "tokenizer_config.json"
    settings = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    if "add_bos_token" in settings:
        if not settings["add_bos_token"]:
            return None, "tokenizer_config.json add_bos_token is false"
        if tokenizer.bos_token_id is None:
            raise ConfigError(f"{config_path} sets add_bos_token but names no bos_token that the vocabulary has")
        return tokenizer.bos_token_id, "tokenizer_config.json add_bos_token is true"
    added = tokenizer.encode("a", add_special_tokens=True)
    if tokenizer.bos_token_id is not None and added[:1] == [tokenizer.bos_token_id]:
        return tokenizer.bos_token_id, "the tokenizer's post-processor adds it"
    return None, "neither tokenizer_config.json nor the tokenizer's post-processor adds one"


def evaluate_perplexity(model: CausalLM, token_ids: list[int], context: int,
                        kv_dtype: torch.dtype | None = None, bos_token_id: int | None = None) -> PerplexityResult:
    """token_ids: the text without special tokens. With bos_token_id, each chunk is BOS + context - 1 text
    tokens and every text token is scored; without, a chunk's first token is context only."""
    if context < 2:
        raise ConfigError(f"--context {context} is too small: a chunk needs at least 2 tokens")
    result = PerplexityResult()
    prefix = [] if bos_token_id is None else [bos_token_id]
    stride = context - len(prefix)
    for start in range(0, len(token_ids) - 1 + len(prefix), stride):
        chunk = prefix + token_ids[start:start + stride]
        if len(chunk) < 2:
            break
        logits = sequence_logits(model, chunk, kv_dtype)[:-1]  # (L - 1, vocab): position p predicts token p + 1
        targets = torch.tensor(chunk[1:], dtype=torch.int64)
        nll = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
        result.nll_sum += float(nll)
        result.scored_tokens += len(targets)
        result.greedy_predictions += logits.argmax(dim=-1).tolist()
        result.chunks += 1
    if result.scored_tokens == 0:
        raise ConfigError("the text has fewer than 2 tokens; nothing to score")
    return result


def evaluate_perplexity_llama_cpp_windows(model: CausalLM, token_ids: list[int], context: int,
                                         kv_dtype: torch.dtype | None = None,
                                         bos_token_id: int | None = None) -> PerplexityResult:
    """As llama-perplexity scores: the stream (BOS + text where the tokenizer adds BOS) in whole chunks of
    `context`, each chunk's first token replaced by BOS, positions context/2 .. context-2 predicting the next."""
    stream = ([] if bos_token_id is None else [bos_token_id]) + token_ids
    if len(stream) < 2 * context:
        raise ConfigError(f"--windows llama.cpp needs at least 2 x --context = {2 * context} tokens; the text has "
                          f"{len(stream)}: use a longer text or a smaller --context")
    result, first = PerplexityResult(), context // 2
    for start in range(0, len(stream) - context + 1, context):
        chunk = stream[start:start + context]
        if bos_token_id is not None:
            chunk[0] = bos_token_id
        logits = sequence_logits(model, chunk, kv_dtype)[first:-1]  # (context - 1 - first, vocab)
        targets = torch.tensor(chunk[first + 1:], dtype=torch.int64)
        result.nll_sum += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        result.scored_tokens += len(targets)
        result.greedy_predictions += logits.argmax(dim=-1).tolist()
        result.chunks += 1
    return result


def run_eval_ppl(args: argparse.Namespace) -> int:
    from shrike.layers.kv_dtypes import resolve_kv_cache_dtype
    from shrike.model.loader import load_model
    from shrike.platform.binding import bind_compute_threads
    config = engine_config_from_args(args)
    if not args.file.is_file():
        raise ConfigError(f"{args.file} is not a file")
    bind_compute_threads(config.cpu_threads, config.cpu_bind)
    loaded = load_model(config.model, config.dtype, config.max_model_len, config.chat_template, config.progress,
                        config.kernel_backend, config.lm_head_quant, config.activation_quant, config.gguf_weights)
    context = min(args.context, loaded.max_model_len)
    token_ids = loaded.tokenizer.encode(args.file.read_text(encoding="utf-8"), add_special_tokens=False)
    bos, bos_reason = scoring_bos(loaded.tokenizer, loaded.model_dir)
    kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, loaded.dtype)
    start = (f"each chunk starts with BOS {loaded.tokenizer.decode([bos], skip_special_tokens=False)!r}" if bos is not None
             else "no BOS, the first token of each chunk is context only")
    if args.windows == "llama.cpp":
        result = evaluate_perplexity_llama_cpp_windows(loaded.model, token_ids, context, kv_dtype, bos)
        scored = f"the second half of each of {result.chunks} chunks of {context} tokens, as llama-perplexity"
    else:
        result = evaluate_perplexity(loaded.model, token_ids, context, kv_dtype, bos)
        scored = f"{len(token_ids)} text tokens in {result.chunks} non-overlapping chunks of up to {context} tokens"
    print(f"perplexity {result.perplexity:.4f} over {result.scored_tokens} scored tokens "
          f"({scored}; {start} ({bos_reason}))", file=sys.stdout)
    return 0
