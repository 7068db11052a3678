"""`from shrike import LLM, SamplingParams`: offline generation in Python, shaped like vLLM's `LLM` class.

All prompts of one call go through the engine together, so they share its batched steps.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, Union

from shrike.engine.config import EngineConfig
from shrike.engine.llm_engine import LLMEngine, RequestOutput as EngineOutput
from shrike.engine.lora import LoRARequest
from shrike.engine.pooling import PoolingParams
from shrike.outputs import (CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, Logprob, PositionLogprobs,
                            RequestOutput)
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import TokenLogprobs
from shrike.token_bytes import TokenBytes

# A prompt: text, token ids, or vLLM's dict forms {"prompt": text} / {"prompt_token_ids": ids}.
PromptType = Union[str, list[int], dict[str, Any]]
Message = dict[str, Any]

_ENGINE_ARGS = [f.name for f in dataclasses.fields(EngineConfig)]
_request_ids = itertools.count()


class LLM:
    """A model loaded for offline use.

    Engine arguments are EngineConfig's fields (shrike.engine.config), named as the CLI flags
    (--max-model-len -> max_model_len) and checked with the same words: dtype, max_model_len, max_num_seqs,
    max_num_batched_tokens, kv_cache_space, kv_cache_dtype, chat_template, enable_prefix_caching, cpu_threads,
    cpu_bind, kernel_backend, lm_head_quant, activation_quant, speculative_config (vLLM's JSON as a dict or text,
    e.g. {"method": "ngram", "num_speculative_tokens": 5}), and the Python-only block_size and progress.
    """

    def __init__(self, model: str | None = None, **engine_args: Any):
        unknown = sorted(set(engine_args) - set(_ENGINE_ARGS))
        if unknown:
            raise TypeError(f"LLM() got unknown engine argument(s) {', '.join(unknown)}; "
                            f"the accepted ones are {', '.join(a for a in _ENGINE_ARGS if a != 'model')}")
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self._token_bytes = TokenBytes(self.llm_engine.tokenizer)
        self._grammars = None  # compiles SamplingParams.structured_outputs, made on first use

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The model's generation_config.json settings where it has them (as vLLM does), else SamplingParams()."""
        from shrike.server.sampling import SamplingDefaults
        d = SamplingDefaults.for_model(self.llm_engine.model_dir, "auto")
        params = SamplingParams(temperature=d.temperature, top_p=d.top_p, top_k=d.top_k, min_p=d.min_p,
                                repetition_penalty=d.repetition_penalty)
        if d.max_tokens is not None:
            params.max_tokens = d.max_tokens
        return params

    # Generation ------------------------------------------------------------------------------

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """Complete each prompt; one output per prompt, in order. lora_request: the LoRA adapter to run with, one
        for all prompts or one per prompt (None: the base model); needs enable_lora=True."""
        return self._run(_as_prompt_list(prompts), sampling_params, use_tqdm, self._encode_prompt, lora_request)

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt, in order, computed batched (needs an embedding model: runner="pooling").
        truncate_prompt_tokens: keep each prompt's last k tokens (-1: the last max_model_len)."""
        items = _as_prompt_list(prompts)
        ids = [self._encode_prompt(prompt)[1] for prompt in items]
        if truncate_prompt_tokens is not None:
            if truncate_prompt_tokens == 0 or truncate_prompt_tokens < -1:
                raise ValueError(f"truncate_prompt_tokens must be -1 or at least 1, got {truncate_prompt_tokens}")
            keep = self.llm_engine.max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
            ids = [p[-keep:] for p in ids]
        params = pooling_params if pooling_params is not None else PoolingParams()
        vectors = self.llm_engine.embed(ids, list(params) if isinstance(params, Sequence) else params)
        return [EmbeddingRequestOutput(f"embed-{i}", prompt_ids, EmbeddingOutput(vector))
                for i, (prompt_ids, vector) in enumerate(zip(ids, vectors))]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, tools: list[dict] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             continue_final_message: bool = False) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or a list of conversations.

        continue_final_message: the last (assistant) message is left open and the answer continues it.
        """
        conversations = _as_conversation_list(messages)
        if continue_final_message and add_generation_prompt:
            add_generation_prompt = False  # vLLM's default of True, meaningless when continuing the last message

        def encode(conversation: list[Message]) -> tuple[str, list[int]]:
            tok = self.llm_engine.tokenizer
            text = tok.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt, tools=tools,
                                           continue_final_message=continue_final_message,
                                           **(chat_template_kwargs or {}))
            return text, tok.encode(text, add_special_tokens=False)  # the template places any BOS itself

        return self._run(conversations, sampling_params, use_tqdm, encode)

    def stream(self, prompt: PromptType, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield the new text and tokens of each sequence as the engine produces them (vLLM's DELTA outputs).

        Stopping the iteration early (break, an exception) aborts the request.
        """
        text, ids = self._encode_prompt(prompt)
        return self._stream(text, ids, sampling_params)

    def chat_stream(self, messages: list[Message], sampling_params: SamplingParams | None = None,
                    add_generation_prompt: bool = True, tools: list[dict] | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None) -> Iterator[RequestOutput]:
        tok = self.llm_engine.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                       **(chat_template_kwargs or {}))
        return self._stream(text, tok.encode(text, add_special_tokens=False), sampling_params)

    # Internals -------------------------------------------------------------------------------

    def _encode_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs a 'prompt' (text) or 'prompt_token_ids' key")
        if isinstance(prompt, str):
            return prompt, self.llm_engine.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")

    def _prepared(self, params: SamplingParams, ids: list[int]) -> tuple[SamplingParams, list[int]]:
        """vLLM's fields the engine does not read, turned into what it does; the caller's params stay as given."""
        constraint = params.structured_outputs or params.guided_decoding
        if constraint is None and not params.bad_words and params.truncate_prompt_tokens is None:
            return params, ids
        params = params.clone()
        tok = self.llm_engine.tokenizer
        if constraint is not None:
            name = "structured_outputs" if params.structured_outputs is not None else "guided_decoding"
            params.grammar = self._grammar_compiler().compile(constraint.spec(name))
        # As vLLM: each bad word as written and with a leading space (how it appears after another word).
        spellings = {tuple(tok.encode(spelling, add_special_tokens=False))
                     for word in params.bad_words or [] for spelling in (word, " " + word.lstrip())}
        params.bad_words_token_ids = [list(word_ids) for word_ids in spellings if word_ids]
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]
        return params, ids

    def _grammar_compiler(self):
        if self._grammars is None:
            from shrike.sampling.grammar_backends import new_grammar_compiler
            self._grammars = new_grammar_compiler("llguidance", self.llm_engine.tokenizer,
                                                  self.llm_engine.model_config.vocab_size)
        return self._grammars

    def _params_for(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        params = list(sampling_params)
        if len(params) != count:
            raise ValueError(f"got {len(params)} sampling params for {count} prompts; give one, or one per prompt")
        return params

    def _run(self, items: list, sampling_params, use_tqdm: bool, encode, lora_request=None) -> list[RequestOutput]:
        params = self._params_for(sampling_params, len(items))
        engine = self.llm_engine
        loras = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(items)
        if len(loras) != len(items):
            raise ValueError(f"got {len(loras)} LoRA requests for {len(items)} prompts; give one, or one per prompt")
        for lora in loras:
            engine.lora_adapter(lora)  # an adapter that cannot be served is refused before any work starts
        encoded = [encode(item) for item in items]
        prepared = [self._prepared(p, ids) for (_, ids), p in zip(encoded, params)]
        params = [p for p, _ in prepared]
        encoded = [(text, ids) for (text, _), (_, ids) in zip(encoded, prepared)]
        for (_, ids), p in zip(encoded, params):
            engine.check_request(ids, p)  # refuse the whole call before any work starts
        builders: dict[str, _OutputBuilder] = {}
        try:
            for (text, ids), p, lora in zip(encoded, params, loras):
                request_id = str(next(_request_ids))
                engine.add_request(request_id, ids, p, lora)
                builders[request_id] = _OutputBuilder(request_id, text, ids, p, self._token_bytes)
            bar = _progress_bar(len(items)) if use_tqdm and len(items) > 1 else None
            unfinished = set(builders)
            while unfinished:
                for out in engine.step():
                    builder = builders[out.request_id]
                    builder.add(out)
                    if out.finished:
                        unfinished.discard(out.request_id)
                        if bar is not None:
                            bar.update(1)
            if bar is not None:
                bar.close()
        finally:
            for request_id in builders:
                engine.abort(request_id)  # no-op for finished ones; frees the rest after an interrupt
        return [builder.result() for builder in builders.values()]

    def _stream(self, text: str | None, ids: list[int], sampling_params: SamplingParams | None
                ) -> Iterator[RequestOutput]:
        params, ids = self._prepared(sampling_params or self.get_default_sampling_params(), ids)
        engine = self.llm_engine
        request_id = str(next(_request_ids))
        engine.add_request(request_id, ids, params)
        try:
            finished = False
            while not finished:
                for out in engine.step():
                    if out.request_id != request_id:
                        continue
                    builder = _OutputBuilder(request_id, text, ids, params, self._token_bytes)
                    builder.add(out)
                    finished = out.finished
                    yield builder.result()
        finally:
            engine.abort(request_id)


class _OutputBuilder:
    """Accumulates one request's engine outputs into the vLLM-shaped RequestOutput."""

    def __init__(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
                 token_bytes: TokenBytes):
        self.params, self.token_bytes = params, token_bytes
        want = params.logprobs is not None
        self.output = RequestOutput(request_id, prompt, list(prompt_ids), [
            CompletionOutput(i, "", [], 0.0 if want else None, [] if want else None) for i in range(params.n)])

    def add(self, out: EngineOutput) -> None:
        if out.prompt_logprobs is not None:
            self.output.prompt_logprobs = [None if e is None else self._position(e) for e in out.prompt_logprobs]
        for delta in out.deltas:
            seq = self.output.outputs[delta.index]
            seq.text += delta.text
            seq.token_ids += delta.token_ids
            seq.finish_reason = delta.finish_reason or seq.finish_reason
            seq.stop_reason = delta.stop_reason if delta.stop_reason is not None else seq.stop_reason
            if seq.logprobs is not None:
                for entry in delta.logprobs:
                    seq.logprobs.append(self._position(entry))
                    seq.cumulative_logprob += entry.logprob
        self.output.finished = out.finished

    def _position(self, entry: TokenLogprobs) -> PositionLogprobs:
        text = self.token_bytes.text
        rank = entry.top_ids.index(entry.token_id) + 1 if entry.token_id in entry.top_ids else None
        position = {entry.token_id: Logprob(entry.logprob, rank, text(entry.token_id))}
        for i, (token_id, logprob) in enumerate(zip(entry.top_ids, entry.top_logprobs)):
            position.setdefault(token_id, Logprob(logprob, i + 1, text(token_id)))
        return position

    def result(self) -> RequestOutput:
        return self.output


def _as_prompt_list(prompts) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # one prompt of token ids
    return prompts


def _as_conversation_list(messages) -> list[list[Message]]:
    messages = list(messages)
    if messages and isinstance(messages[0], dict):
        return [messages]
    return [list(conversation) for conversation in messages]


def _progress_bar(total: int):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="Processed prompts", unit="prompt", dynamic_ncols=True)
