"""GET /tokenizer_info (as vLLM serves it): the tokenizer's settings, so a client can tokenize as the server does.

Evaluation clients (lm-evaluation-harness's remote tokenizer) read it together with /tokenize and /detokenize.
"""
from __future__ import annotations

import json
from pathlib import Path

from shrike.tokenizer import Tokenizer


def tokenizer_info(model_dir: Path, tokenizer: Tokenizer, max_model_len: int) -> dict:
    path = Path(model_dir) / "tokenizer_config.json"
    info = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    info.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    info.update(tokenizer.special_tokens)  # AddedToken objects as plain strings
    info["model_max_length"] = max_model_len  # what this server accepts, prompt plus output
    info["vocab_size"] = tokenizer.vocab_size
    info["eos_token_ids"] = sorted(tokenizer.eos_token_ids)
    try:
        info["chat_template"] = tokenizer._select_chat_template(None)
    except ValueError:
        info.pop("chat_template", None)  # several templates and none is the default: nothing to report
    return info
