"""`--speculative-config`: vLLM's JSON, parsed once for the server, `shrike generate` and `LLM(...)`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shrike.errors import ConfigError

_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" (prompt lookup) or "draft_model"
    num_speculative_tokens: int  # proposed tokens per step
    prompt_lookup_min: int = 0  # ngram: shortest suffix that may match
    prompt_lookup_max: int = 0  # ngram: longest suffix tried
    model: str | None = None  # draft_model: checkpoint directory or .gguf


def _whole(config: dict, key: str, minimum: int, maximum: int | None = None) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ConfigError(f"speculative config: {key} must be a whole number {bound}, got {value!r}")
    return value


def parse_speculative_config(value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
    """JSON text or a dict as vLLM spells it -> the config, None when off; ConfigError (one line) when wrong."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"speculative config is not valid JSON ({e.msg} at character {e.pos}); e.g. "
                              """'{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}'""") from None
    if not isinstance(value, dict):
        raise ConfigError("speculative config must be a JSON object, e.g. "
                          """{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}""")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ConfigError(f"speculative config: unknown key(s) {', '.join(unknown)}; "
                          f"Shrike takes {', '.join(sorted(_KEYS))}")
    method, model = value.get("method"), value.get("model")
    if method is None:
        method = "draft_model" if model is not None else None
    if method not in ("ngram", "draft_model"):
        raise ConfigError(f"speculative config: method must be \"ngram\" or \"draft_model\" (or give \"model\"), "
                          f"got {method!r}")
    k = _whole(value, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    if k is None:
        raise ConfigError("speculative config: num_speculative_tokens is required (e.g. 4)")
    if method == "draft_model":
        if not isinstance(model, str) or not model:
            raise ConfigError("speculative config: method draft_model needs \"model\": a checkpoint directory or .gguf")
        for key in ("prompt_lookup_max", "prompt_lookup_min"):
            if key in value:
                raise ConfigError(f"speculative config: {key} applies to method ngram only")
        return SpeculativeConfig("draft_model", k, model=model)
    if model is not None:
        raise ConfigError("speculative config: method ngram takes no \"model\"")
    lo, hi = _whole(value, "prompt_lookup_min", 1), _whole(value, "prompt_lookup_max", 1)
    # As vLLM: either bound alone sets both; neither gives 5.
    lo, hi = lo or hi or 5, hi or lo or 5
    if lo > hi:
        raise ConfigError(f"speculative config: prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
    return SpeculativeConfig("ngram", k, prompt_lookup_min=lo, prompt_lookup_max=hi)
