"""Linear layers of a GGUF file run as the file stores them (the default for `shrike serve model.gguf`).

The make_linear of a model loaded from a GGUF file: a linear whose tensors are of a type in
convert.gguf_blocks.TYPES is built from the file's quant blocks, repacked losslessly, instead of being
converted to bf16: a grouped weight (kernels.GroupedWeight) of its type's bits (4: Q4_0, Q4_1, Q4_K; 6: Q5_x,
Q6_K; 8: Q8_0; IQ4_NL and IQ4_XS as 4-bit indices of their grid). A fused layer (q/k/v, gate/up) whose parts
pack differently is a kernels.GroupedParts: each run of alike parts one weight, writing its own columns.
Layers of other types (F16, BF16, F32, Q2_K, Q3_K, the other i-quants) are converted to bf16 as `shrike
convert` converts them, read from the file when the model asks for them (model.weights.GGUFTensors). The
lm_head (output.weight, or the tied token_embd.weight) runs from the file's blocks when its type has a kernel;
the embedding table is then read by rows from the same packed blocks (kernels.packed_table_args), dequantized
and rounded to bf16 as the conversion would hold them, so a tied table is held once and in the file's size.
Mixture-of-experts files merge each layer's experts into one tensor per projection (ffn_*_exps,
(experts, rows, row bytes)); each expert's linear is its slice of that tensor.
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np
import torch

from shrike.convert.gguf import GGUFModel
from shrike.convert.gguf_blocks import TYPES, GroupedBlocks, grouped_blocks
from shrike.convert.llama_weights import LAYER_NAMES, undo_rope_permutation
from shrike.kernels import GroupedParts, GroupedWeight
from shrike.layers.linear import DenseLinear
from shrike.layers.lm_head import LMHead
from shrike.ops import weight_for_op
from shrike.model.config import ModelConfig
from shrike.model.weights import CheckpointTensors
from shrike.platform.memory import FreedMemory
from shrike.quantization.loading import QuantizedLinear

_GGUF_PART = {hf: gguf for gguf, hf in LAYER_NAMES.items()}
_LAYER_PREFIX = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT_PREFIX = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)")
# Qwen3-MoE's and Mixtral's names of an expert's projections -> llama.cpp's merged tensor
_EXPERT_PART = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps", "w3": "ffn_up_exps",
                "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}
GGUF_WEIGHTS = ("native", "bf16")  # --gguf-weights


def native_activation_dtype(gguf: GGUFModel) -> torch.dtype:
    """--dtype auto for a file run natively: float32, as llama.cpp computes, when every matrix of the file is of a
    type with a kernel (only norms and activations then take the dtype, and a bf16 residual stream and KV cache
    move perplexity by about 1% from llama.cpp's); bfloat16 when some matrix loads from the conversion, which
    would double its memory in float32."""
    matrices = [t for t in gguf.reader.tensors if len(t.shape) >= 2]
    return torch.float32 if all(t.tensor_type in TYPES for t in matrices) else torch.bfloat16


def gguf_tensor_name(prefix: str) -> tuple[str, int | None] | None:
    """The GGUF name of a Hugging Face linear and, for an expert's, its index in the merged tensor
    (model.layers.3.mlp.down_proj -> blk.3.ffn_down.weight; model.layers.3.mlp.experts.7.up_proj ->
    blk.3.ffn_up_exps.weight, 7)."""
    expert = _EXPERT_PREFIX.fullmatch(prefix)
    if expert is not None:
        part = _EXPERT_PART.get(expert.group(3))
        return None if part is None else (f"blk.{expert.group(1)}.{part}.weight", int(expert.group(2)))
    match = _LAYER_PREFIX.fullmatch(prefix)
    if match is None or match.group(2) not in _GGUF_PART:
        return None
    return f"blk.{match.group(1)}.{_GGUF_PART[match.group(2)]}.weight", None


class GGUFLinearFactory:
    def __init__(self, gguf: GGUFModel, config: ModelConfig, dtype: torch.dtype, ops, native_head: bool = True):
        reader = gguf.reader
        self.tensors = {t.name: t for t in reader.tensors}
        # llama.cpp reorders the q and k rows of 'llama' files for its rotary layout (llama_weights.py)
        architecture = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
        self.rope_heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads} if architecture == "llama" else {}
        self.dtype, self.ops, self.native_head = dtype, ops, native_head
        self.native: dict[str, str] = {}  # GGUF tensor name -> its type, for tensors run from the file's blocks
        self.converted: dict[str, str] = {}  # the same for tensors converted to bf16
        self.description = "Repacking"
        self.head = "not the lm_head"  # whether embedding_and_head() gave a native head
        self.embedding = "the embedding table converted to bf16"
        self.freed = FreedMemory()  # the blocks' values as they are unpacked, returned to the OS as they add up

    def __call__(self, tensors: CheckpointTensors, prefixes: list[str], in_features: int, out_features: list[int],
                 bias: bool):
        names = [gguf_tensor_name(p) for p in prefixes]
        parts = [(self.tensors.get(name[0]), name[1]) if name else (None, None) for name in names]
        if bias or any(p is None or not _has_kernel(p) for p, _ in parts):
            for prefix, (p, _) in zip(prefixes, parts):
                if p is None:
                    self.converted[prefix] = "unnamed"
                else:
                    self.converted[p.name] = p.tensor_type.name
            return DenseLinear.load(tensors, prefixes, in_features, out_features, bias, self.dtype,
                                    self.ops.dense_linear)
        blocks = [self._blocks(p, n, expert) for (p, expert), n in zip(parts, out_features)]
        for p, _ in parts:
            self.native[p.name] = p.tensor_type.name
        weight, format = _weight(blocks)
        self.freed.freed(sum(b.values.nbytes * 2 for b in blocks))  # the values and their concatenation
        del blocks
        layer = QuantizedLinear(weight, None, format, sum(out_features))
        layer.checkpoint_parts, layer.in_features = tuple(zip(prefixes, out_features)), in_features  # for LoRA
        return layer

    def embedding_and_head(self, tensors: CheckpointTensors, c: ModelConfig, dtype: torch.dtype, tied: bool):
        """(embedding table, LMHead) for shrike.model.llama.embedding_and_head: each from the file's blocks when
        its type has a kernel (the table then as packed blocks for the embedding op; a tied table is the native
        head's weight), else converted to bf16 from the file; the head stays converted when native_head is off
        (--lm-head-quant int8 quantizes it). Nothing native is converted first."""
        shape = (c.vocab_size, c.hidden_size)
        head_tensor = self.tensors["token_embd.weight" if tied else "output.weight"]
        head = None
        if self.native_head and _has_kernel(head_tensor):
            weight, format = _weight([self._blocks(head_tensor, c.vocab_size)])
            head = LMHead(weight, c.vocab_size, f"{format}_linear")
            self.native[head_tensor.name] = head_tensor.tensor_type.name
            self.head = "the lm_head"
        table = self.native_table(c.vocab_size, head if tied else None)
        converted = None  # the bf16 table, when a tied head converted needs it too
        if table is None:
            table = converted = tensors.get("model.embed_tokens.weight", shape, dtype)
        if head is None:
            source = converted if tied and converted is not None else \
                tensors.get("model.embed_tokens.weight" if tied else "lm_head.weight", shape, dtype)
            head = LMHead(weight_for_op(source, self.ops.dense_linear), c.vocab_size)
        return table, head

    def native_table(self, vocab_size: int, tied_head: LMHead | None):
        """token_embd.weight as packed blocks for the embedding op (the weight of a native head tied to it), or
        None when its type has no kernel."""
        tensor = self.tensors["token_embd.weight"]
        if not _has_kernel(tensor):
            return None
        self.embedding = f"the embedding table from its {tensor.tensor_type.name} blocks"
        return tied_head.weight if tied_head is not None else _weight([self._blocks(tensor, vocab_size)])[0]

    def _blocks(self, tensor, rows: int, expert: int | None = None) -> GroupedBlocks:
        k = int(tensor.shape[0])  # GGUF lists the input dimension first
        data = tensor.data if expert is None else tensor.data[expert]  # merged experts: (experts, rows, row bytes)
        blocks = grouped_blocks(data, tensor.tensor_type, rows, k)
        heads = self.rope_heads.get(tensor.name.split(".")[-2])
        if heads:
            source_row = undo_rope_permutation(np.arange(rows)[:, None], heads)[:, 0]
            blocks = blocks.rows(source_row)
        return blocks

    def summary(self) -> str:
        """The start-up line: which tensors run from the file's blocks and which were converted."""
        def listed(types: dict[str, str]) -> str:
            return ", ".join(f"{n} {t}" for t, n in sorted(Counter(types.values()).items()))
        line = f"{len(self.native)} linear tensors run natively from the GGUF blocks ({listed(self.native) or 'none'}), " \
               f"{self.head} among them"
        if self.converted:
            line += f"; {len(self.converted)} converted to bf16 ({listed(self.converted)})"
        return f"{line}; {self.embedding}; computing in {str(self.dtype).removeprefix('torch.')}"


def _has_kernel(tensor) -> bool:
    """Whether a GGUF matrix can run from its blocks: a type with a kernel, and K a multiple of the activations'
    block of 32 (GGUF lists K first)."""
    return tensor.tensor_type in TYPES and int(tensor.shape[0]) % 32 == 0


def _weight(blocks: list[GroupedBlocks]) -> tuple[object, str]:
    """One weight for parts fused along the output, and its format: consecutive parts that pack alike as one
    GroupedWeight, and a GroupedParts of those runs where they differ, so every part keeps its file's bits
    (Q4_K_M's q and k Q4_K as one 4-bit run, its v Q6_K as a 6-bit one)."""
    runs: list[list[GroupedBlocks]] = []
    for b in blocks:
        if runs and _packing(runs[-1][-1]) == _packing(b):
            runs[-1].append(b)
        else:
            runs.append([b])
    weights = [_grouped_weight(run) for run in runs]
    return (weights[0] if len(weights) == 1 else GroupedParts(weights)), "grouped"


def _packing(b: GroupedBlocks) -> tuple:
    """What decides a packed weight's layout: group, value bits, mins, grid indices, superblock factors."""
    return b.group, b.bits, b.min is not None, b.codebook, b.d is not None


def _grouped_weight(blocks: list[GroupedBlocks]) -> GroupedWeight:
    def joined(field: str):
        arrays = [getattr(b, field) for b in blocks]
        return None if arrays[0] is None else torch.from_numpy(np.concatenate(arrays))
    first = blocks[0]
    return GroupedWeight.from_values(joined("values"), joined("scale"), joined("min"), first.group, first.bits,
                                     joined("d"), joined("dmin"), first.codebook)
