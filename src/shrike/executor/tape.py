"""Recording a model's forward once into an op tape.

`record` runs the model's forward through a `RecordingStep`: activations are symbolic `Buffer`s,
step-dependent inputs are `StepInput`s, and every op call is appended to the tape with its
arguments (buffers, step inputs, weights, scalars) instead of running. The model's Python code is
the only definition of its forward; shrike.executor.compile turns the tape into the C++ executor's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

TOKENS, LOGITS = "tokens", "logits"  # the row counts a buffer can have in a step


@dataclass(frozen=True)
class Buffer:
    """An activation: `rows` (TOKENS or LOGITS) rows of `columns`, one buffer id per allocation."""

    id: int
    rows: str
    columns: tuple[int, ...]
    dtype: torch.dtype

    @property
    def width(self) -> int:
        return math.prod(self.columns)

    def view(self, rows: str, *columns: int) -> "Buffer":
        if rows != self.rows or math.prod(columns) != self.width:
            raise ValueError(f"cannot view ({self.rows}, {self.columns}) as ({rows}, {columns})")
        return Buffer(self.id, rows, tuple(columns), self.dtype)


@dataclass(frozen=True)
class StepInput:
    """Something the executor fills per step: token_ids, slot_mapping, block_tables, query_start,
    context_lens, lora_slots; or cos / sin of rotary table `rope`."""

    name: str
    rope: int = -1


@dataclass
class TapeEntry:
    op: str  # an op of the op table, or "gather_rows" (the step's own copy of the logits rows)
    args: tuple
    kwargs: dict


@dataclass
class Tape:
    entries: list[TapeEntry] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)  # by id, as allocated
    ropes: list = field(default_factory=list)  # the RotaryEmbedding of each rope index
    output: Buffer | None = None  # the (LOGITS, vocab) float32 logits, or (LOGITS, hidden) final hidden states


class RecordingOps:
    """Looks like the op table; each call is appended to the tape."""

    def __init__(self, tape: Tape, ops):
        self._tape, self.chosen = tape, ops.chosen

    def is_builtin(self, name: str) -> bool:
        return self.chosen[name].source.startswith("builtin")

    def __getattr__(self, name: str):
        if name not in self.chosen:
            raise AttributeError(f"no op {name!r} in the op table")

        def record(*args, **kwargs):
            self._tape.entries.append(TapeEntry(name, args, kwargs))
        return record


class RecordingStep:
    """The step interface of shrike.executor.step.EagerStep, producing a tape."""

    tokens, logits = TOKENS, LOGITS

    def __init__(self, ops, block_size: int):
        self.tape = Tape()
        self.ops = RecordingOps(self.tape, ops)
        self.block_size = block_size
        self.token_ids = StepInput("token_ids")
        self.slot_mapping = StepInput("slot_mapping")
        self.lora_slots = StepInput("lora_slots")
        self.attention = (StepInput("block_tables"), StepInput("query_start"), StepInput("context_lens"))

    def empty(self, rows: str, *columns: int, dtype: torch.dtype) -> Buffer:
        if rows not in (TOKENS, LOGITS):
            raise ValueError("rows must be step.tokens or step.logits")
        buffer = Buffer(len(self.tape.buffers), rows, tuple(columns), dtype)
        self.tape.buffers.append(buffer)
        return buffer

    def rope(self, rotary) -> tuple[StepInput, StepInput]:
        ropes = self.tape.ropes
        index = next((i for i, r in enumerate(ropes) if r is rotary), None)
        if index is None:
            ropes.append(rotary)
            index = len(ropes) - 1
        return StepInput("cos", index), StepInput("sin", index)

    def take_logits_rows(self, x: Buffer) -> Buffer:
        out = self.empty(LOGITS, *x.columns, dtype=x.dtype)
        self.tape.entries.append(TapeEntry("gather_rows", (x, out), {}))
        return out


def record(model, kv_caches: list, block_size: int, output: str = "logits") -> Tape:
    """The op tape of `model`'s forward: model.forward(step, kv_caches) -> logits, or with output="hidden"
    model.forward(step, kv_caches, output="hidden") -> the final normed hidden states (embeddings)."""
    step = RecordingStep(model.ops, block_size)
    if output == "logits":
        result = model.forward(step, kv_caches)
        if not isinstance(result, Buffer) or result.rows != LOGITS or result.dtype != torch.float32:
            raise TypeError(f"{type(model).__name__}.forward must return the (step.logits, vocab) float32 logits "
                            "it allocated")
    else:
        result = model.forward(step, kv_caches, output=output)
        if not isinstance(result, Buffer) or result.rows != LOGITS:
            raise TypeError(f"{type(model).__name__}.forward(output={output!r}) must return a (step.logits, width) "
                            "buffer it allocated")
    step.tape.output = result
    return step.tape
