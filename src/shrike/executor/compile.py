"""An op tape lowered onto the C++ executor, and run for each engine step.

Every activation buffer and step input is a torch tensor allocated here once (max_tokens rows);
the executor points into them. Ops whose implementation is a built-in kernel become executor ops;
an op a plugin implements in Python splits the tape there: the executor runs up to it, the plugin's
function runs on torch views of the same buffers, and the executor goes on after it.

Rules applied while lowering (every architecture gets them): a norm or gated activation directly
followed by a quantized linear reading its output also quantizes each row it writes for that linear
(while the row is in L1), and the linear skips its own quantization; the bits are those of
quantizing afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shrike import _C
from shrike.kernels import packed_table_args
from shrike.executor.tape import LOGITS, TOKENS, Buffer, StepInput, Tape, TapeEntry
from shrike.weight_formats import LINEAR_OPS, tape_linear

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int8: "int8"}
# Ops that may quantize their output rows for the quantized linear right after them, and where their output is.
_OUTPUT_ARGUMENT = {"rmsnorm": 2, "add_rmsnorm": 3, "silu_mul": 1, "gelu_tanh_mul": 1}


@dataclass
class StepBuffers:
    """Step inputs the model runner writes in place before each step (numpy views share the memory)."""

    token_ids: torch.Tensor  # (max_tokens,) int64
    seqs: torch.Tensor  # (max_seqs, 3) int32: block-table row, tokens already cached, new tokens
    block_tables: torch.Tensor  # (max_seqs, max_blocks_per_seq) int32, one row per running sequence
    logits_rows: torch.Tensor  # (max_tokens,) int32: token rows whose logits are wanted
    lora_slots: torch.Tensor  # (max_tokens,) int32: each token's LoRA adapter slot, -1: none

    @classmethod
    def allocate(cls, max_tokens: int, max_seqs: int, max_blocks: int) -> "StepBuffers":
        return cls(torch.zeros(max_tokens, dtype=torch.int64), torch.zeros(max_seqs, 3, dtype=torch.int32),
                   torch.zeros(max_seqs, max_blocks, dtype=torch.int32), torch.zeros(max_tokens, dtype=torch.int32),
                   torch.full((max_tokens,), -1, dtype=torch.int32))


class CompiledTape:
    def __init__(self, tape: Tape, ops, inputs: StepBuffers, block_size: int, num_slots: int, vocab: int):
        max_tokens, max_seqs = inputs.token_ids.shape[0], inputs.seqs.shape[0]
        max_blocks = inputs.block_tables.shape[1]
        self.tape, self.ops, self.inputs, self.max_tokens = tape, ops, inputs, max_tokens
        self._keep: list = []  # tensors the executor points into, beyond the model and the buffers
        exe = _C.Executor(max_tokens, max_seqs, block_size, num_slots, vocab)
        self.derived = {  # per-step inputs the executor derives, as tensors a Python op can read
            "slot_mapping": torch.zeros(max_tokens, dtype=torch.int64),
            "query_start": torch.zeros(max_seqs + 1, dtype=torch.int32),
            "context_lens": torch.zeros(max_seqs, dtype=torch.int32),
            "block_tables": torch.zeros(max_seqs * max_blocks, dtype=torch.int32),
        }
        exe.set_inputs(inputs.token_ids, inputs.seqs, inputs.block_tables, inputs.logits_rows,
                       *(self.derived[k] for k in ("slot_mapping", "query_start", "context_lens", "block_tables")))
        lora = next((e.args[1] for e in tape.entries if e.op == "lora"), None)
        if lora is not None:
            exe.set_lora_slots(inputs.lora_slots, lora.shrink.shape[0])
        self.rope_rows = []  # (cos, sin) (max_tokens, head_dim) per rotary table
        for rotary in tape.ropes:
            long_table = getattr(rotary, "cos_sin_long", None)
            cos, sin = (torch.zeros(max_tokens, rotary.cos_sin.shape[2]) for _ in range(2))
            exe.add_rope(rotary.cos_sin, long_table, rotary.long_threshold if long_table is not None else -1, cos, sin)
            self.rope_rows.append((cos, sin))
        # Rows kept per storage: every token, or (for logits rows) as many as a step has asked for so far.
        self.logits_capacity = min(max_tokens, max_seqs)
        self.storage_of = share_storage(tape)  # buffer id -> storage index
        self.storages = [torch.empty(self._capacity(b), b.width * b.dtype.itemsize, dtype=torch.uint8)
                         for b in _first_buffer_of_each_storage(tape, self.storage_of)]
        for b in tape.buffers:
            exe.add_buffer(self.storages[self.storage_of[b.id]])
        self.exe = exe
        self.segments = self._lower()  # ("tape", begin, end) or ("python", entry)

    def _capacity(self, b: Buffer) -> int:
        return self.max_tokens if b.rows == TOKENS else self.logits_capacity

    # Lowering ---------------------------------------------------------------------------------

    def _lower(self) -> list[tuple]:
        segments: list[tuple] = []
        entries = self.tape.entries
        quantize_for: dict[int, object] = {}  # entry index -> the linear it quantizes rows for
        prequantized: set[int] = set()
        linears = {i: self._linear(e) for i, e in enumerate(entries) if e.op in LINEAR_OPS}
        for i, entry in enumerate(entries[:-1]):
            following, linear = entries[i + 1], linears.get(i + 1)
            if entry.op in _OUTPUT_ARGUMENT and self._builtin(entry.op) and linear is not None and linear.quantized_input \
                    and self._builtin(following.op) and following.args[0].id == _output_of(entry).id:
                quantize_for[i], prequantized = linear, prequantized | {i + 1}
        begin = len(self.exe)
        for i, entry in enumerate(entries):
            # A linear (or a moe block) whose weights the kernels cannot take runs as a Python op.
            kernel_weights = linears[i] if entry.op in LINEAR_OPS else \
                entry.args[2].tape_linears() if entry.op == "moe" else True
            if entry.op == "gather_rows" or (self._builtin(entry.op) and kernel_weights):
                self._emit(entry, quantize_for.get(i), i in prequantized, linears.get(i))
                continue
            if len(self.exe) > begin:
                segments.append(("tape", begin, len(self.exe)))
            segments.append(("python", entry))
            begin = len(self.exe)
        if len(self.exe) > begin:
            segments.append(("tape", begin, len(self.exe)))
        return segments

    def _builtin(self, op: str) -> bool:
        return self.ops.is_builtin(op)

    def _linear(self, entry: TapeEntry):
        x, weight, bias, out = entry.args
        described = tape_linear(entry.op, weight, bias)
        if described is None:
            return None
        linear, kept_bias = described
        self._keep.append(kept_bias)
        return linear

    def _emit(self, entry: TapeEntry, quantize_for, prequantized: bool, linear) -> None:
        exe, a, op = self.exe, entry.args, entry.op
        if op == "embedding":
            token_ids, table, out, scale = a
            if isinstance(table, torch.Tensor):
                exe.embedding(out.id, table, scale)
            else:  # a GGUF file's blocks (kernels.GroupedWeight)
                exe.packed_embedding(out.id, *packed_table_args(table), scale, _DTYPE_NAMES[out.dtype])
        elif op == "rmsnorm":
            x, weight, out, eps = a
            exe.rmsnorm(x.id, x.rows, weight, out.id, eps, quantize_for)
        elif op == "add_rmsnorm":
            x, residual, weight, out, eps = a
            exe.add_rmsnorm(x.id, x.rows, residual.id, weight, out.id, eps, quantize_for)
        elif op == "head_rmsnorm":
            qkv, q_weight, k_weight, out, num_heads, num_kv_heads, eps = a
            exe.head_rmsnorm(qkv.id, q_weight, k_weight, out.id, num_heads, num_kv_heads, eps)
        elif op in LINEAR_OPS:
            x, _, _, out = a
            exe.linear(linear, x.id, x.rows, out.id, _DTYPE_NAMES[x.dtype], _DTYPE_NAMES[out.dtype], prequantized)
        elif op == "rope_write_kv":
            qkv, cos, _, _, q_out, key_cache, value_cache = a
            exe.rope_write_kv(qkv.id, cos.rope, q_out.id, key_cache, value_cache, q_out.columns[0],
                              _DTYPE_NAMES[qkv.dtype])
        elif op == "paged_attention":
            q, key_cache, value_cache, _, _, _, _, scale, out = a[:9]
            window = a[9] if len(a) > 9 else entry.kwargs.get("sliding_window", 0)
            heads, head_dim = q.columns
            exe.paged_attention(q.id, key_cache, value_cache, out.id, heads, head_dim, scale, window,
                                _DTYPE_NAMES[q.dtype])
        elif op in ("silu_mul", "gelu_tanh_mul"):
            gate_up, out = a
            getattr(exe, op)(gate_up.id, out.id, out.width, _DTYPE_NAMES[out.dtype], quantize_for)
        elif op in ("mul_scalar", "div_scalar"):
            x, factor = a
            exe.scale(x.id, x.rows, x.width, factor, op == "div_scalar", _DTYPE_NAMES[x.dtype])
        elif op == "softcap":
            x, cap = a
            exe.softcap(x.id, x.rows, x.width, cap)
        elif op == "moe":
            x, router_logits, experts, out, top_k, normalize = a
            exe.moe(x.id, router_logits.id, *experts.tape_linears(), out.id, top_k, normalize, _DTYPE_NAMES[x.dtype],
                    experts.shared)
        elif op == "lora":
            x, adapters, _, out = a
            if x.rows != TOKENS:
                raise ValueError("LoRA adapters apply to token rows only")
            exe.lora(x.id, out.id, adapters.shrink, adapters.expand, adapters.ranks, adapters.part_end,
                     _DTYPE_NAMES[x.dtype], _DTYPE_NAMES[out.dtype])
        elif op == "gather_rows":
            x, out = a
            exe.gather_rows(x.id, out.id, x.width * x.dtype.itemsize)
        else:
            raise NotImplementedError(f"the executor has no lowering for op {op!r}")

    # Running ----------------------------------------------------------------------------------

    def run(self, num_seqs: int, num_tokens: int, num_logits: int) -> torch.Tensor:
        """One step over the inputs' first num_seqs sequences -> (num_logits, vocab) fp32 logits (a view
        of the executor's buffer, valid until the next step)."""
        if num_logits > self.logits_capacity:
            self._grow_logits_rows(num_logits)
        width = self.exe.prepare(num_seqs, num_tokens, num_logits)
        shape = (num_seqs, num_tokens, num_logits, width)
        for segment in self.segments:
            if segment[0] == "tape":
                self.exe.run(segment[1], segment[2])
            else:
                entry = segment[1]
                resolve = lambda v: self._view(v, shape)  # noqa: E731
                getattr(self.ops, entry.op)(*map(resolve, entry.args), **{k: resolve(v) for k, v in entry.kwargs.items()})
        return self._tensor(self.tape.output, num_logits)

    def _grow_logits_rows(self, rows: int) -> None:
        self.logits_capacity = min(self.max_tokens, max(rows, 2 * self.logits_capacity))
        for index, storage in enumerate(self.storages):
            buffers = [b for b in self.tape.buffers if self.storage_of[b.id] == index]
            if buffers[0].rows == LOGITS:
                self.storages[index] = torch.empty(self.logits_capacity, storage.shape[1], dtype=torch.uint8)
                for b in buffers:
                    self.exe.bind_buffer(b.id, self.storages[index])

    def _view(self, value, shape):
        """A tape argument as the torch value a Python op gets this step."""
        num_seqs, num_tokens, num_logits, width = shape
        if isinstance(value, Buffer):
            rows = num_tokens if value.rows == TOKENS else num_logits
            return self._tensor(value, rows)
        if not isinstance(value, StepInput):
            return value
        if value.rope >= 0:
            cos, sin = self.rope_rows[value.rope]
            return (cos if value.name == "cos" else sin)[:num_tokens]
        if value.name == "token_ids":
            return self.inputs.token_ids[:num_tokens]
        if value.name == "slot_mapping":
            return self.derived["slot_mapping"][:num_tokens]
        if value.name == "lora_slots":
            return self.inputs.lora_slots[:num_tokens]
        if value.name == "query_start":
            return self.derived["query_start"][:num_seqs + 1]
        if value.name == "context_lens":
            return self.derived["context_lens"][:num_seqs]
        if value.name == "block_tables":
            return self.derived["block_tables"][:num_seqs * width].view(num_seqs, width)
        raise ValueError(f"unknown step input {value.name!r}")

    def _tensor(self, b: Buffer, rows: int) -> torch.Tensor:
        """The first `rows` rows of buffer `b` as a (rows, *columns) tensor of its dtype."""
        storage = self.storages[self.storage_of[b.id]][:rows, :b.width * b.dtype.itemsize]
        return storage.view(b.dtype).view(rows, *b.columns)

    def describe(self) -> dict:
        """What runs where: the executor's ops, and the Python ops that split the tape."""
        python_ops = [s[1].op for s in self.segments if s[0] == "python"]
        return {"executor_ops": len(self.exe), "segments": len(self.segments), "python_ops": python_ops}


def share_storage(tape: Tape) -> dict[int, int]:
    """Buffer id -> storage index, buffers whose lifetimes do not overlap sharing storage (first write to
    last read, in tape order), so that a step's activations stay in cache the way a hand-written forward's
    few reused workspaces do. Storage is shared only between buffers of one row kind and row size."""
    first_use: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, entry in enumerate(tape.entries):
        for value in (*entry.args, *entry.kwargs.values()):
            if isinstance(value, Buffer):
                first_use.setdefault(value.id, i)
                last_use[value.id] = i
    last_use[tape.output.id] = len(tape.entries)  # read after the step
    storage_of: dict[int, int] = {}
    free: dict[tuple, list[int]] = {}  # (rows, row bytes) -> storages free for reuse
    releases: dict[int, list[Buffer]] = {}
    count = 0
    by_first_use = sorted(tape.buffers, key=lambda b: first_use.get(b.id, -1))
    starts: dict[int, list[Buffer]] = {}
    for b in by_first_use:
        starts.setdefault(first_use.get(b.id, -1), []).append(b)
    for i in range(-1, len(tape.entries) + 1):
        for b in starts.get(i, []):
            key = (b.rows, b.width * b.dtype.itemsize)
            if free.get(key):
                storage_of[b.id] = free[key].pop()
            else:
                storage_of[b.id], count = count, count + 1
            releases.setdefault(last_use.get(b.id, i), []).append(b)
        for b in releases.pop(i, []):  # free after the op that reads it last
            free.setdefault((b.rows, b.width * b.dtype.itemsize), []).append(storage_of[b.id])
    return storage_of


def _first_buffer_of_each_storage(tape: Tape, storage_of: dict[int, int]) -> list[Buffer]:
    first: dict[int, Buffer] = {}
    for b in tape.buffers:
        first.setdefault(storage_of[b.id], b)
    return [first[i] for i in range(len(first))]


def _output_of(entry: TapeEntry) -> Buffer:
    """The buffer a producer op writes (its `out` argument)."""
    return entry.args[_OUTPUT_ARGUMENT[entry.op]]
