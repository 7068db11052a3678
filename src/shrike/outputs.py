"""What `LLM.generate` and `LLM.chat` return, shaped like vLLM's outputs so code written for it reads them as is."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """One candidate token at one position: its log-probability, its rank (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None  # None: the sampled token was outside the requested top alternatives
    decoded_token: str | None = None


# Per position: token id -> Logprob, the sampled token first, then the top alternatives.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One of the n sequences generated for a prompt."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # only with logprobs requested
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # stop, length or abort
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it; None for EOS or length

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # the first position has none


@dataclass
class EmbeddingOutput:
    """The vector of one input (vLLM's EmbeddingOutput)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` returns per prompt, shaped like vLLM's: `.outputs.embedding`."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True
