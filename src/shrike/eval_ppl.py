"""`shrike eval-ppl`: perplexity of a model on a text file.

The text is tokenized once (no special tokens) and cut into non-overlapping chunks of
--context tokens (the last one shorter). Each chunk is scored from scratch: every token after
the first of its chunk is predicted from the tokens before it in that chunk, so the first token
of a chunk is context only. Perplexity = exp(mean negative log-likelihood of the scored tokens).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shrike.engine.batch import BatchContext
from shrike.engine.config import add_engine_arguments, engine_config_from_args
from shrike.errors import ConfigError
from shrike.layers.attention import KVCache
from shrike.model.llama import CausalLM

DEFAULT_CONTEXT = 512
_BLOCK_SIZE = 16


def add_eval_ppl_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL (optional: omit it when only FILE is given), FILE, --context and every engine flag. The flags that
    shape serving (batching, prefix caching, KV-cache size, speculative decoding) are checked like everywhere
    but change no score: each chunk runs alone from an empty cache of its own."""
    add_engine_arguments(p)
    p.add_argument("file", type=Path, help="UTF-8 text file to score")
    p.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                   help=f"tokens per non-overlapping chunk (default {DEFAULT_CONTEXT}; at most --max-model-len)")


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
    threshold = model.rotary.long_threshold
    ctx = BatchContext(positions=torch.arange(count), slot_mapping=torch.arange(count), query_lens=[count],
                       context_lens=[count], block_tables=[list(range(blocks))], block_size=_BLOCK_SIZE,
                       use_long_rope=None if threshold is None else torch.full((count,), count > threshold))
    return model.forward(torch.tensor(token_ids, dtype=torch.int64), ctx, caches, torch.arange(count))


def evaluate_perplexity(model: CausalLM, token_ids: list[int], context: int,
                        kv_dtype: torch.dtype | None = None) -> PerplexityResult:
    if context < 2:
        raise ConfigError(f"--context {context} is too small: a chunk needs at least 2 tokens")
    result = PerplexityResult()
    for start in range(0, len(token_ids) - 1, context):
        chunk = token_ids[start:start + context]
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


def run_eval_ppl(args: argparse.Namespace) -> int:
    from shrike.layers.kv_dtypes import resolve_kv_cache_dtype
    from shrike.model.loader import load_model
    from shrike.platform.binding import bind_compute_threads
    config = engine_config_from_args(args)
    if not args.file.is_file():
        raise ConfigError(f"{args.file} is not a file")
    bind_compute_threads(config.cpu_threads, config.cpu_bind)
    loaded = load_model(config.model, config.dtype, config.max_model_len, config.chat_template, config.progress,
                        config.kernel_backend, config.lm_head_quant, config.activation_quant)
    context = min(args.context, loaded.max_model_len)
    token_ids = loaded.tokenizer.encode(args.file.read_text(encoding="utf-8"), add_special_tokens=False)
    result = evaluate_perplexity(loaded.model, token_ids, context,
                                 resolve_kv_cache_dtype(config.kv_cache_dtype, loaded.dtype))
    print(f"perplexity {result.perplexity:.4f} over {result.scored_tokens} scored tokens "
          f"({len(token_ids)} tokens in {result.chunks} non-overlapping chunks of up to {context})", file=sys.stdout)
    return 0
