"""Serves many asyncio clients from one engine thread.

The LLMEngine is not thread-safe, so one dedicated thread owns it: clients hand it commands
(submit, abort, stop) through a queue it drains between steps, and it hands each step's outputs
back to the event loop in one callback. When nothing is running it blocks on the queue, so an
idle server uses no CPU.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from shrike.engine.llm_engine import LLMEngine, RequestOutput
from shrike.engine.lora import LoRARequest
from shrike.sampling.params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(Exception):
    """More sequences are in flight than the engine runs at once plus the allowed queue."""


class EngineStepError(Exception):
    """The engine failed while computing a request; the request is over, the server keeps serving."""


class EngineStoppedError(Exception):
    """The server is shutting down and no longer computes requests."""


@dataclass(frozen=True)
class EngineLoad:
    """What the engine is doing, published after every step and command."""

    running_requests: int = 0
    waiting_requests: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found cached
    num_blocks: int = 0  # the KV pool's size
    num_free_blocks: int = 0  # held by no sequence (cached prefixes count as free); all of them when idle
    num_steps: int = 0  # loop iterations that had work
    longest_step_seconds: float = 0.0  # the longest such iteration: commands, step, hand-over
    sequences_in_flight: int = 0  # admitted and not yet released by their client's handler; 0 when idle
    spec_drafts: int = 0  # speculative decoding: sequence steps that verified proposals
    spec_proposed_tokens: int = 0  # proposed tokens
    spec_accepted_tokens: int = 0  # of those, accepted
    spec_emitted_tokens: int = 0  # tokens the verifying steps produced (accepted + the target's own)


class GenerationObserver:
    """Hooks for the server's metrics; all are called on the event loop."""

    def on_admitted(self, num_prompt_tokens: int) -> None:
        pass

    def on_tokens(self, num_tokens: int, first_token_latency: float | None, inter_token_latency: float | None) -> None:
        pass

    def on_finished(self, finish_reason: str, e2e_latency: float) -> None:
        pass


@dataclass
class _Submit:
    generation: "Generation"


@dataclass
class _Abort:
    request_ids: list[str]


@dataclass
class _Call:
    function: Callable[[LLMEngine], object]
    done: Future = field(default_factory=Future)


class _Stop:
    pass


_generation_counter = itertools.count()

# How long a request needing several sequences (n > 1, or a list of prompts) may wait for room. Under steady
# overload single-sequence requests take every slot as it frees, so without a reservation such a request
# would never find n slots free at once; with it, freed slots are held for it and singles get 503 instead.
MULTI_SEQUENCE_WAIT_SECONDS = 30.0


@dataclass(eq=False)
class Generation:
    """One client call: one engine request per prompt, read as a single stream of outputs.

    Iterate it for the outputs; close() it when done reading (early: a client that went away),
    which aborts whatever is still running. Errors arrive in the stream as exceptions.
    """

    prompts: list[list[int]]
    params: SamplingParams
    release: Callable[["Generation"], None]
    lora: LoRARequest | None = None  # the LoRA adapter its prompts run with (None: the base model)
    arrival_time: float = field(default_factory=time.monotonic)
    admitted: Future = field(default_factory=Future)
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    request_ids: list[str] = field(init=False)
    # Sequences the engine has not finished, as far as the event loop has heard.
    unfinished_sequences: set[tuple[str, int]] = field(init=False)
    unread_sequences: set[tuple[str, int]] = field(init=False)
    last_output_time: dict[str, float] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self):
        base = next(_generation_counter)
        self.request_ids = [f"req-{base}-{i}" for i in range(len(self.prompts))]
        self.unfinished_sequences = {(rid, i) for rid in self.request_ids for i in range(self.params.n)}
        self.unread_sequences = set(self.unfinished_sequences)

    @property
    def num_sequences(self) -> int:
        return len(self.prompts) * self.params.n

    def prompt_index(self, request_id: str) -> int:
        return self.request_ids.index(request_id)

    def __aiter__(self) -> "Generation":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.unread_sequences:
            raise StopAsyncIteration
        item = await self.outputs.get()
        if isinstance(item, Exception):
            self.unread_sequences.clear()
            raise item
        self.unread_sequences -= {(item.request_id, d.index) for d in item.deltas if d.finish_reason is not None}
        return item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.release(self)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue_len: int, observer: GenerationObserver | None = None):
        self.engine = engine
        self.capacity = engine.scheduler.max_num_seqs + max_queue_len  # sequences in flight at most
        self.observer = observer or GenerationObserver()
        self._engine_load = EngineLoad()  # as of the engine's last step
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Touched on the event loop only.
        self._generations: dict[str, Generation] = {}
        self._sequences_in_flight = 0
        self._reservation: tuple[int, asyncio.Future] | None = None  # (sequences, room_ready) of the one waiter
        self._stopped = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Touched on the engine thread only.
        self._num_steps = 0
        self._longest_step_seconds = 0.0

    # Event-loop side -------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="shrike-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._commands.put(_Stop())
        await asyncio.to_thread(self._thread.join)

    @property
    def load(self) -> EngineLoad:
        return dataclasses.replace(self._engine_load, sequences_in_flight=self._sequences_in_flight)

    @property
    def is_running(self) -> bool:
        return not self._stopped and self._thread is not None and self._thread.is_alive()

    async def submit(self, prompts: list[list[int]], params: SamplingParams, lora: LoRARequest | None = None
                     ) -> Generation:
        """Admit every prompt or none.

        Raises ValueError when a prompt can never be served (a client error), QueueFullError when
        the server is busy, EngineStoppedError when it is shutting down.
        """
        if not self.is_running:
            raise EngineStoppedError("the server is shutting down")
        # A request that can never be served is the client's to fix (400), even when the server is busy:
        # a 503 would only invite retrying it. check_request reads fixed limits, safe off the engine thread.
        for prompt in prompts:
            self.engine.check_request(prompt, params)
        generation = Generation(prompts, params, self._release, lora)
        if generation.num_sequences > self.capacity:
            raise ValueError(f"this request needs {generation.num_sequences} sequences (prompts times n) but the "
                             f"server holds at most {self.capacity} at once; split it")
        if not self._has_room(generation.num_sequences, self._reserved_sequences()):
            await self._wait_for_room(generation.num_sequences)
        for rid in generation.request_ids:
            self._generations[rid] = generation
        self._sequences_in_flight += generation.num_sequences
        self._commands.put(_Submit(generation))
        try:
            await asyncio.wrap_future(generation.admitted)
        except ValueError:
            generation.unfinished_sequences.clear()  # refused: nothing to abort or count
            generation.close()
            raise
        except BaseException:
            generation.close()
            raise
        self.observer.on_admitted(sum(len(p) for p in prompts))
        return generation

    async def call(self, function: Callable[[LLMEngine], Any]) -> Any:
        """function(engine) on the engine thread between two steps (loading and unloading LoRA adapters) ->
        its result, or what it raised."""
        if not self.is_running:
            raise EngineStoppedError("the server is shutting down")
        call = _Call(function)
        self._commands.put(call)
        return await asyncio.wrap_future(call.done)

    def _has_room(self, num_sequences: int, reserved: int = 0) -> bool:
        return self._sequences_in_flight + num_sequences + reserved <= self.capacity

    async def _wait_for_room(self, num_sequences: int) -> None:
        busy = QueueFullError(f"the server is busy: {self._sequences_in_flight} sequences are in flight and "
                              f"at most {self.capacity} may be; retry shortly")
        if num_sequences == 1 or self._reservation is not None:
            raise busy
        room_ready = self._loop.create_future()
        self._reservation = (num_sequences, room_ready)
        try:
            await asyncio.wait_for(room_ready, MULTI_SEQUENCE_WAIT_SECONDS)
        except asyncio.TimeoutError:
            raise busy from None
        finally:
            self._reservation = None
        if not self.is_running:
            raise EngineStoppedError("the server is shutting down")

    def _reserved_sequences(self) -> int:
        return 0 if self._reservation is None else self._reservation[0]

    def _release(self, generation: Generation) -> None:
        for rid in generation.request_ids:
            self._generations.pop(rid, None)
        self._sequences_in_flight -= generation.num_sequences
        if self._reservation is not None:
            needed, room_ready = self._reservation
            if not room_ready.done() and self._has_room(needed):
                room_ready.set_result(None)
        if generation.unfinished_sequences:
            self._commands.put(_Abort(list(generation.request_ids)))
            self._finish_all(generation, "abort")

    def _finish_all(self, generation: Generation, reason: str) -> None:
        latency = time.monotonic() - generation.arrival_time
        for _ in generation.unfinished_sequences:
            self.observer.on_finished(reason, latency)
        generation.unfinished_sequences.clear()

    def _deliver(self, outputs: list[RequestOutput], failures: list[tuple[str, Exception]], load: EngineLoad) -> None:
        self._engine_load = load
        now = time.monotonic()
        for output in outputs:
            generation = self._generations.get(output.request_id)
            if generation is None:
                continue  # its client left; the abort is on its way to the engine
            previous = generation.last_output_time.get(output.request_id)
            generation.last_output_time[output.request_id] = now
            self.observer.on_tokens(sum(len(d.token_ids) for d in output.deltas),
                                    now - generation.arrival_time if previous is None else None,
                                    None if previous is None else now - previous)
            for delta in output.deltas:
                if delta.finish_reason is not None:
                    generation.unfinished_sequences.discard((output.request_id, delta.index))
                    self.observer.on_finished(delta.finish_reason, now - generation.arrival_time)
            generation.outputs.put_nowait(output)
        for request_id, error in failures:
            generation = self._generations.get(request_id)
            if generation is not None:
                self._finish_all(generation, "error")
                generation.outputs.put_nowait(error)

    def _fail_everything(self, error: Exception) -> None:
        """The engine thread has ended: nothing in flight will get another output."""
        self._stopped = True
        if self._reservation is not None and not self._reservation[1].done():
            self._reservation[1].set_result(None)  # the waiter sees the engine stopped
        for generation in set(self._generations.values()):
            if not generation.admitted.done():
                generation.admitted.set_exception(error)
            self._finish_all(generation, "abort")
            generation.outputs.put_nowait(error)

    # Engine-thread side ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve_commands()
            error = EngineStoppedError("the server shut down before this request finished")
        except BaseException as e:  # noqa: BLE001 - reported to every waiting client below
            logger.exception("the engine loop crashed")
            # Clients see the kind of failure only: its text may carry paths; the log has it all.
            error = EngineStoppedError(f"the engine loop crashed ({type(e).__name__})")
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
        self._call_loop(self._fail_everything, error)

    def _serve_commands(self) -> None:
        engine = self.engine
        while True:
            # Block only when idle: that is what keeps an idle server off the CPU.
            commands = [] if engine.has_unfinished() else [self._commands.get()]
            started = time.monotonic()
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if isinstance(command, _Stop):
                    return
                self._apply(command)
            outputs: list[RequestOutput] = []
            failures: list[tuple[str, Exception]] = []
            if engine.has_unfinished():
                try:
                    outputs = engine.step()
                except Exception as e:  # noqa: BLE001 - one failed step must not take the server down
                    logger.exception("an engine step failed; failing the requests it was computing")
                    failures = self._fail_running(e)
                self._num_steps += 1
                self._longest_step_seconds = max(self._longest_step_seconds, time.monotonic() - started)
            self._call_loop(self._deliver, outputs, failures, self._measure_load())

    def _apply(self, command: _Submit | _Abort | _Call) -> None:
        engine = self.engine
        if isinstance(command, _Call):
            try:
                command.done.set_result(command.function(engine))
            except Exception as e:  # noqa: BLE001 - handed to the caller
                command.done.set_exception(e)
            return
        if isinstance(command, _Abort):
            for rid in command.request_ids:
                engine.abort(rid)
            return
        generation = command.generation
        try:
            for prompt in generation.prompts:
                engine.check_request(prompt, generation.params)
            for rid, prompt in zip(generation.request_ids, generation.prompts):
                engine.add_request(rid, prompt, generation.params, generation.lora)
        except Exception as e:  # noqa: BLE001 - handed to the client: ValueError is its mistake, others ours
            for rid in generation.request_ids:
                engine.abort(rid)
            generation.admitted.set_exception(e)
            return
        generation.admitted.set_result(None)

    def _fail_running(self, error: Exception) -> list[tuple[str, Exception]]:
        # Sequences that were computed in the failed step are in `running`; their KV state is now
        # unknown. Waiting ones were not touched and stay queued.
        affected = sorted({seq.request_id for seq in self.engine.scheduler.running})
        for rid in affected:
            self.engine.abort(rid)
        failure = EngineStepError(f"the engine failed while computing this request ({type(error).__name__}); "
                                  "the server is still serving")
        return [(rid, failure) for rid in affected]

    def _measure_load(self) -> EngineLoad:
        scheduler, blocks = self.engine.scheduler, self.engine.block_manager
        running = {seq.request_id for seq in scheduler.running}
        waiting = {seq.request_id for seq in scheduler.waiting} - running
        spec = self.engine.speculator.stats if self.engine.speculator is not None else None
        return EngineLoad(len(running), len(waiting), blocks.usage, scheduler.num_preemptions,
                          blocks.prefix_queries, blocks.prefix_hits, blocks.num_blocks, blocks.num_free_blocks,
                          self._num_steps, self._longest_step_seconds,
                          **({} if spec is None else {"spec_drafts": spec.num_drafts,
                                                      "spec_proposed_tokens": spec.num_proposed,
                                                      "spec_accepted_tokens": spec.num_accepted,
                                                      "spec_emitted_tokens": spec.num_emitted}))

    def _call_loop(self, callback, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the event loop is closed: nobody is left to tell
