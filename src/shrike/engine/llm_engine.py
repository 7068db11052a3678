"""The engine: requests in, incremental outputs out, one scheduled model step at a time."""
from __future__ import annotations

import inspect
import itertools
import time
from dataclasses import dataclass, field

from shrike.engine.block_manager import BlockManager
from shrike.engine.config import EngineConfig
from shrike.engine.lora import LoRAManager, LoRARequest
from shrike.engine.model_runner import ModelRunner
from shrike.engine.pooling import PoolingParams, PoolingState, load_pooler, resolve_runner, runner_asked
from shrike.engine.scheduler import Scheduler
from shrike.engine.sequence import Sequence
from shrike.engine.stop import StopStringFilter
from shrike.errors import ConfigError
from shrike.layers.kv_dtypes import resolve_kv_cache_dtype
from shrike.model.loader import LoadedModel, load_model
from shrike.platform.binding import bind_compute_threads
from shrike.sampling.params import SamplingParams
from shrike.sampling.sampler import TokenLogprobs
from shrike.speculative.config import parse_speculative_config
from shrike.speculative.draft_model import DraftModel
from shrike.speculative.speculator import Speculator
from shrike.tokenizer import IncrementalDecoder


@dataclass
class CompletionDelta:
    """What one of a request's n sequences produced in one step."""

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs]
    finish_reason: str | None = None  # stop, length or abort, once finished
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (None: EOS, length)


@dataclass
class RequestOutput:
    request_id: str
    deltas: list[CompletionDelta]
    finished: bool  # every sequence of the request is finished
    num_prompt_tokens: int
    num_output_tokens: int  # over all sequences so far
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # with the first output only
    first_token_time: float | None = None
    embedding: list[float] | None = None  # a pooled request's vector, with its finished output


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | PoolingParams
    seqs: list[Sequence]
    decoders: list[IncrementalDecoder]
    stop_filters: list[StopStringFilter]
    emitted_logprobs: list[int] = field(default_factory=list)  # per sequence
    prompt_logprobs_sent: bool = False
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        # Checked before anything loads: a wrong config is a one-line error, not a slow start and then one.
        spec_config = parse_speculative_config(config.speculative_config)
        asked_runner = runner_asked(config.runner, config.task)
        if not config.enable_lora and (config.lora_modules or config.allow_runtime_lora):
            raise ConfigError("--lora-modules and --allow-runtime-lora need --enable-lora")
        if config.enable_lora and spec_config is not None:
            raise ConfigError("--speculative-config cannot be combined with --enable-lora yet (the draft does not "
                              "know the adapters); leave one of them out")
        self.cores = bind_compute_threads(config.cpu_threads, config.cpu_bind)
        loaded: LoadedModel = load_model(config.model, config.dtype, config.max_model_len, config.chat_template,
                                         progress=config.progress, kernel_backend=config.kernel_backend,
                                         lm_head_quant=config.lm_head_quant,
                                         activation_quant=config.activation_quant,
                                         gguf_weights=config.gguf_weights)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.dtype = loaded.dtype
        self.model_dir = loaded.model_dir
        self.weights_source = loaded.weights_source
        self.footprint = loaded.footprint
        # pooling: the model computes embeddings (LLM.embed, /v1/embeddings) and generates nothing, as in vLLM.
        self.runner_kind = resolve_runner(asked_runner, loaded.model_dir)
        self.pooler = None
        if self.runner_kind == "pooling":
            if "output" not in inspect.signature(loaded.model.forward).parameters:
                raise ConfigError(f"{type(loaded.model).__name__} cannot run as an embedding model (--runner pooling): "
                                  "its forward has no hidden-state output")
            if spec_config is not None:
                raise ConfigError("--speculative-config speeds up generation; an embedding model (--runner pooling) "
                                  "generates nothing, so leave it out")
            self.pooler = load_pooler(loaded.model_dir)
            self.embedding_size = loaded.config.hidden_size * len(self.pooler.modes)
        self.max_model_len = loaded.max_model_len
        self.kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype)
        self.kv_plan = loaded.plan_kv_cache(config.kv_cache_space, config.block_size, config.max_num_seqs,
                                            self.kv_dtype)
        self.block_manager = BlockManager(self.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.max_model_len, self.eos_ids)
        self.lora: LoRAManager | None = None  # before the runner records the forward: adapter slots are in it
        if config.enable_lora:
            self.lora = LoRAManager(loaded.model, config.max_loras, config.max_lora_rank)
            for name, path in config.lora_modules:
                self.lora.register(name, path)
            self.scheduler.lora = self.lora
        self.runner = ModelRunner(loaded.model, self.kv_plan.num_blocks, config.block_size, self.kv_dtype,
                                  config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
                                  compile=config.compiled_forward,
                                  output="hidden" if self.pooler is not None else "logits",
                                  lora=self.lora is not None)
        self.speculator = None
        if spec_config is not None:
            draft = None
            if spec_config.method == "draft_model":
                draft = DraftModel(spec_config.model, self.tokenizer.token_strings(), config.dtype, self.max_model_len,
                                   config.block_size, config.max_num_seqs, config.max_num_batched_tokens, self.kv_dtype,
                                   self.kv_plan.capacity_tokens, config.kernel_backend,
                                   config.compiled_forward, config.progress)
            self.speculator = Speculator(spec_config, draft)
        self.scheduler.speculator = self.speculator
        self.requests: dict[str, _Request] = {}

    # Requests -------------------------------------------------------------------------

    def check_request(self, prompt_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        """Raise ValueError (a client error) when the request can never be served."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if isinstance(params, PoolingParams) or self.pooler is not None:
            self._check_pooling_request(prompt_ids, params)
            return
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens but the maximum context length is "
                             f"{self.max_model_len} tokens (prompt plus output); shorten the prompt")
        if params.max_tokens is not None and len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"max_tokens={params.max_tokens} does not fit: the prompt has {len(prompt_ids)} tokens "
                             f"and the maximum context length is {self.max_model_len}; ask for at most "
                             f"{self.max_model_len - len(prompt_ids)} tokens")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def _check_pooling_request(self, prompt_ids: list[int], params: SamplingParams | PoolingParams) -> None:
        if self.pooler is None:
            raise ValueError("this server runs the model for generation; embeddings need it started as an embedding "
                             "model (--runner pooling, or --task embed)")
        if not isinstance(params, PoolingParams):
            raise ValueError("this model runs as an embedding model (--runner pooling): it computes embeddings "
                             "(/v1/embeddings, LLM.embed) and generates no text")
        if len(prompt_ids) > self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens but the maximum context length is "
                             f"{self.max_model_len} tokens; shorten the prompt")
        if params.dimensions is not None and params.dimensions != self.embedding_size:
            if not self.pooler.matryoshka:
                raise ValueError(f"dimensions {params.dimensions} cannot be served: this model's embeddings have "
                                 f"{self.embedding_size} dimensions and it is not a Matryoshka model (config.json "
                                 "has no is_matryoshka), so they cannot be shortened; leave dimensions out")
            if params.dimensions > self.embedding_size:
                raise ValueError(f"dimensions must be at most {self.embedding_size}, this model's embedding size")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")

    def lora_adapter(self, lora_request: LoRARequest | None):
        """The registered adapter a request runs with (registered from its path on first use), None for the base
        model; ValueError (a client error) when LoRA is off or the adapter cannot be served."""
        if lora_request is None:
            return None
        if self.lora is None:
            raise ValueError("this engine serves no LoRA adapters; start it with --enable-lora "
                             "(LLM(..., enable_lora=True))")
        try:
            return self.lora.for_request(lora_request)
        except ConfigError as error:
            raise ValueError(str(error)) from None

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams | PoolingParams,
                    lora_request: LoRARequest | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        self.check_request(prompt_ids, params)
        adapter = self.lora_adapter(lora_request)
        if isinstance(params, PoolingParams):
            seq = Sequence(request_id, 0, prompt_ids, SamplingParams(max_tokens=None), self.eos_ids)
            seq.lora = adapter
            seq.pooling = PoolingState(self.pooler, params)
            self.requests[request_id] = _Request(request_id, list(prompt_ids), params, [seq], [], [], [0])
            self.scheduler.add(seq)
            return
        seqs = [Sequence(request_id, i, prompt_ids, params, self.eos_ids) for i in range(params.n)]
        for seq in seqs:
            seq.lora = adapter
        self.requests[request_id] = _Request(
            request_id, list(prompt_ids), params, seqs,
            [IncrementalDecoder(self.tokenizer, params.skip_special_tokens) for _ in seqs],
            [StopStringFilter(params.stop, params.include_stop_str_in_output) for _ in seqs], [0] * len(seqs))
        for seq in seqs:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # Steps ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            if self.scheduler.waiting and not self.scheduler.running:
                raise RuntimeError("the scheduler cannot admit any waiting sequence although nothing runs")
            return []
        produced = self.scheduler.postprocess(batch, self.runner.step(batch))
        touched: dict[str, list[tuple[Sequence, str | None, int]]] = {}
        for seq, reason, num_new in produced:
            touched.setdefault(seq.request_id, []).append((seq, reason, num_new))
        return [self._collect(self.requests[rid], seqs) for rid, seqs in touched.items() if rid in self.requests]

    def _collect(self, request: _Request, seqs: list[tuple[Sequence, str | None, int]]) -> RequestOutput:
        now = time.monotonic()
        if request.first_token_time is None:
            request.first_token_time = now
        if isinstance(request.params, PoolingParams):  # finished: its one sequence has pooled the whole prompt
            del self.requests[request.request_id]
            return RequestOutput(request.request_id, [CompletionDelta(0, [], "", [], "stop")], True,
                                 len(request.prompt_ids), 0, first_token_time=now,
                                 embedding=request.seqs[0].pooling.vector())
        deltas = []
        for seq, reason, num_new in seqs:
            tokens = seq.output_ids[len(seq.output_ids) - num_new:]
            decoder, stop_filter = request.decoders[seq.index], request.stop_filters[seq.index]
            text, stop_reason = "", None
            params = request.params
            for i, token in enumerate(tokens):
                last = i == len(tokens) - 1
                ending = last and reason == "stop"
                if ending and token in params.stop_token_ids and token not in seq.sampling_row.eos_ids:
                    stop_reason = token
                # A stop or EOS token ends the text without being part of it (unless include_stop_str_in_output).
                piece = "" if ending and not params.include_stop_str_in_output else decoder.push(token)
                if last and reason is not None:
                    piece += decoder.flush()
                piece, hit_stop_string = stop_filter.push(piece)
                text += piece
                if hit_stop_string is not None:
                    stop_reason = hit_stop_string
                    # Tokens verified after the one completing the stop string are not output.
                    seq.drop_tokens_after(seq.num_tokens - (len(tokens) - 1 - i))
                    tokens = tokens[:i + 1]
                    reason = "stop"
                    self.scheduler.finish(seq, reason)
                    break
                if last and reason is not None:
                    text += stop_filter.flush()
            sent = request.emitted_logprobs[seq.index]
            logprobs = seq.output_logprobs[sent:]
            request.emitted_logprobs[seq.index] = len(seq.output_logprobs)
            deltas.append(CompletionDelta(seq.index, tokens, text, logprobs, reason, stop_reason))
        finished = all(s.is_finished for s in request.seqs)
        prompt_logprobs = None
        if request.params.prompt_logprobs is not None and not request.prompt_logprobs_sent:
            prompt_logprobs = request.seqs[0].prompt_logprobs
            request.prompt_logprobs_sent = True
        if finished:
            del self.requests[request.request_id]
        return RequestOutput(request.request_id, deltas, finished, len(request.prompt_ids),
                             sum(len(s.output_ids) for s in request.seqs), prompt_logprobs, request.first_token_time)

    # Offline use --------------------------------------------------------------------------

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[list[FinishedSequence]]:
        """Run prompts together to completion -> per prompt, its n finished sequences."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        ids = [f"offline-{next(_offline_ids)}" for _ in prompts]
        results: dict[str, list[FinishedSequence]] = {}
        for rid, prompt, p, lora in zip(ids, prompts, params_list, loras):
            self.add_request(rid, prompt, p, lora)
            results[rid] = [FinishedSequence() for _ in range(p.n)]
        while any(rid in self.requests for rid in ids):
            for out in self.step():
                for delta in out.deltas:
                    done = results[out.request_id][delta.index]
                    done.token_ids += delta.token_ids
                    done.text += delta.text
                    done.logprobs += delta.logprobs
                    done.finish_reason = delta.finish_reason
                if out.prompt_logprobs is not None:
                    results[out.request_id][0].prompt_logprobs = out.prompt_logprobs
        return [results[rid] for rid in ids]

    def embed(self, prompts: list[list[int]], params: PoolingParams | list[PoolingParams]) -> list[list[float]]:
        """Pool prompts together (batched like generation) -> one embedding per prompt, in order."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"offline-{next(_offline_ids)}" for _ in prompts]
        for prompt, p in zip(prompts, params_list):
            self.check_request(prompt, p)  # all or none: a bad prompt is refused before any runs
        for rid, prompt, p in zip(ids, prompts, params_list):
            self.add_request(rid, prompt, p)
        vectors: dict[str, list[float]] = {}
        while any(rid in self.requests for rid in ids):
            for out in self.step():
                vectors[out.request_id] = out.embedding
        return [vectors[rid] for rid in ids]


@dataclass
class FinishedSequence:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None


_offline_ids = itertools.count()
