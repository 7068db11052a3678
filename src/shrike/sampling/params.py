"""Per-request generation settings, validated once when the request arrives."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shrike.sampling.structured_params import GuidedDecodingParams, StructuredOutputsParams  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from shrike.sampling.grammar import CompiledGrammar

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    max_tokens: int | None = 16  # None: until the context is full
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per generated token (0: only the chosen one)
    prompt_logprobs: int | None = None  # same for the prompt tokens (echo)
    skip_special_tokens: bool = True
    n: int = 1
    grammar: "CompiledGrammar | None" = None  # constrained decoding: every choice follows this grammar
    # vLLM's names for the same and more (LLM compiles structured_outputs / guided_decoding into grammar)
    structured_outputs: "StructuredOutputsParams | None" = None
    guided_decoding: "StructuredOutputsParams | None" = None  # vLLM's older name for structured_outputs
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) that ended the output
    logit_bias: dict[int, float] | None = None  # added to the logits of those token ids before sampling
    allowed_token_ids: list[int] | None = None  # only these tokens may be sampled
    bad_words: list[str] | None = None  # words never generated (LLM tokenizes them into bad_words_token_ids)
    bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last k tokens

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the parameter and the allowed range."""
        def check(ok: bool, message: str):
            if not ok:
                raise ValueError(message)
        check(self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}")
        check(self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}")
        check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
              f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        check(self.top_k >= -1, f"top_k must be -1 (off) or positive, got {self.top_k}")
        check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        check(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        check(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(value is None or 0 <= value <= MAX_LOGPROBS, f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        check(self.n >= 1, f"n must be at least 1, got {self.n}")
        check(all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings")
        check(self.structured_outputs is None or self.guided_decoding is None,
              "give structured_outputs or guided_decoding (its older name), not both")
        check(self.truncate_prompt_tokens is None or self.truncate_prompt_tokens >= 1,
              f"truncate_prompt_tokens must be at least 1, got {self.truncate_prompt_tokens}")
        check(self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
              "allowed_token_ids must not be empty (no token could be sampled)")
        check(all(isinstance(w, str) and w for w in self.bad_words or []), "bad_words must be non-empty strings")

    def clone(self) -> "SamplingParams":
        """A copy whose lists and dicts can be changed independently (a compiled grammar is shared: it is immutable)."""
        grammar, self.grammar = self.grammar, None
        try:
            copied = copy.deepcopy(self)
        finally:
            self.grammar = grammar
        copied.grammar = grammar
        return copied

    @property
    def greedy(self) -> bool:
        # Below this, dividing logits by the temperature overflows; the result is greedy anyway.
        return self.temperature < 1e-5
