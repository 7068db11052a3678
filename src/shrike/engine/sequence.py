"""One generated continuation: its tokens, its KV blocks and its progress."""
from __future__ import annotations

import enum
import itertools

import torch

from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import SamplingRow, TokenLogprobs

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, index: int, prompt_ids: list[int], params: SamplingParams,
                 eos_ids: frozenset[int]):
        self.seq_id = next(_seq_counter)  # arrival order: lower is older
        self.request_id = request_id
        self.index = index  # which of the request's n choices
        self.token_ids = list(prompt_ids)  # prompt followed by generated tokens
        self.num_prompt_tokens = len(prompt_ids)
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.num_registered_blocks = 0  # leading full blocks already findable by prefix caching
        self.params = params
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.output_logprobs: list[TokenLogprobs] = []
        self.prompt_logprobs: list[TokenLogprobs | None] = [None] if params.prompt_logprobs is not None else []
        generator = None
        if params.seed is not None:
            generator = torch.Generator().manual_seed(params.seed + index)
        self.spec_state = None  # the speculator's per-sequence figures, once it proposes for it
        self.pooling = None  # an embedding request's shrike.engine.pooling.PoolingState: no tokens are generated
        self.lora = None  # the shrike.engine.lora.RegisteredAdapter it runs with (None: the base model)
        self.sampling_row = SamplingRow(params, self.token_ids[:self.num_prompt_tokens], [], eos_ids, generator)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.sampling_row.output_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.sampling_row.output_ids.append(token_id)

    def drop_tokens_after(self, num_tokens: int) -> None:
        """Forget tokens past the first num_tokens (verified tokens after the one that ended the sequence)."""
        del self.token_ids[num_tokens:]
        del self.sampling_row.output_ids[max(0, num_tokens - self.num_prompt_tokens):]
        del self.output_logprobs[max(0, num_tokens - self.num_prompt_tokens):]
