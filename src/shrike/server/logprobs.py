"""Logprobs as clients rebuild text from them: each token's raw bytes, and no entry for the token that ended it."""
from __future__ import annotations

from shrike.engine.llm_engine import CompletionDelta
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import TokenLogprobs
from shrike.server.generation import clamp_logprob
from shrike.token_bytes import TokenBytes


def shown_logprobs(delta: CompletionDelta, params: SamplingParams, eos_ids: set[int]) -> list[TokenLogprobs]:
    """A stop or EOS token ends the text without being part of it, so its logprob is not shown either (as OpenAI)."""
    entries = delta.logprobs
    if entries and delta.finish_reason == "stop":
        last = delta.token_ids[-1]
        if last in params.stop_token_ids or (last in eos_ids and not params.ignore_eos):
            return entries[:-1]
    return entries


def chat_logprobs(token_bytes: TokenBytes, entries: list[TokenLogprobs]) -> dict:
    """The chat completions `logprobs` object: per token its text, logprob, bytes and top alternatives."""
    def token(token_id: int, logprob: float) -> dict:
        return {"token": token_bytes.text(token_id), "logprob": clamp_logprob(logprob),
                "bytes": list(token_bytes.of(token_id))}

    return {"content": [{**token(e.token_id, e.logprob),
                         "top_logprobs": [token(t, lp) for t, lp in zip(e.top_ids, e.top_logprobs)]}
                        for e in entries]}
