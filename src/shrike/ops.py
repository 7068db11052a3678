"""Shrike's kernel ops: every op a Llama-family step runs, registered into every registry.

Each op has the compiled kernel (dispatching to the active ISA inside ``shrike._C``) and a torch
reference with the same calling convention: inputs, a preallocated output, then scalars (the
``*_scalar`` and ``softcap`` ops work in place). A model's forward calls the op table resolved from
the registry at load (``Registry.op_table``); the op executor (shrike.executor) records those calls
once and replays the built-in ones in C++, so a plugin that replaces an op is still the one called.

Linear ops take the weight object their format's loader built: ``kernels.W4A8Weight`` /
``W8A8Weight`` / ``WeightOnlyWeight`` with the kernel backend, the ``reference_kernels`` weights with
``--kernel-backend reference``, and a (N, K) tensor for ``dense_linear``, except that the built-in
dense kernel takes bf16 weights packed as ``kernels.DenseTileWeight`` when it runs on AMX tiles
(``weight_for_op`` packs them only for it). Their bias is float32 for the
quantized formats and in the weight's dtype for dense layers.

``paged_attention`` takes an optional trailing ``sliding_window`` (0 = off); only Gemma 3's sliding
layers pass it, so a plugin's attention op without that parameter still serves every other model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from shrike import _C
from shrike.kernels import DenseTileWeight, GroupedParts, packed_table_args
from shrike import kv_int8
from shrike.registry import Registry

# The op names, in the order a decoder step runs them.
OP_NAMES = ("embedding", "rmsnorm", "add_rmsnorm", "head_rmsnorm", "w4a8_linear", "w8a8_linear", "weight_only_linear",
            "grouped_linear", "dense_linear", "rope_write_kv", "paged_attention", "silu_mul", "gelu_tanh_mul",
            "mul_scalar", "div_scalar", "softcap", "moe", "lora")


# References ---------------------------------------------------------------------------------

def embedding_reference(token_ids: torch.Tensor, table, out: torch.Tensor, scale: float) -> None:
    """out (T, hidden) = table[token_ids] (* scale, rounded to the table's dtype, when scale != 1). A packed
    table (kernels.GroupedWeight, a GGUF file's blocks) gives its rows as the bf16 conversion of
    the blocks holds them: each dequantized in float32 from the unpacked values, rounded to bf16."""
    if not isinstance(table, torch.Tensor):
        out.copy_(_packed_rows(table, token_ids).to(torch.bfloat16).to(out.dtype))
        if scale != 1.0:
            out.mul_(scale)
        return
    torch.index_select(table, 0, token_ids, out=out)
    if scale != 1.0:
        out.mul_(scale)


def _packed_rows(table, token_ids: torch.Tensor) -> torch.Tensor:
    """(T, K) float32 rows of a grouped table: value * scale (- min)."""
    values, scale, min = table.unpack()
    group = table.group_size
    rows = values[token_ids].reshape(len(token_ids), -1, group).float() * scale[token_ids][..., None]
    if min is not None:
        rows = rows - min[token_ids][..., None]
    return rows.reshape(len(token_ids), -1)


def embedding_kernel(token_ids: torch.Tensor, table, out: torch.Tensor, scale: float) -> None:
    if isinstance(table, torch.Tensor):
        _C.embedding(token_ids, table, out, scale)
    else:
        _C.packed_embedding(token_ids, *packed_table_args(table), out, scale)


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float) -> None:
    """out = weight * x / rms(x) over the last dimension, normalised in float32 then rounded to x's dtype."""
    x32 = x.float()
    normalized = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    out.copy_(weight * normalized)


def add_rmsnorm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                          eps: float) -> None:
    """residual += x; out = rmsnorm(residual) * weight."""
    residual += x
    rmsnorm_reference(residual, weight, out, eps)


def head_rmsnorm_reference(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, out: torch.Tensor,
                           num_heads: int, num_kv_heads: int, eps: float) -> None:
    """out = qkv (T, (H + 2*Hkv) * D) with each q head and each k head RMS-normalised (Qwen3, Gemma 3); v copied."""
    tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q_out, k_out = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype), torch.empty(tokens, num_kv_heads, head_dim,
                                                                                        dtype=qkv.dtype)
    rmsnorm_reference(q.reshape(tokens, num_heads, head_dim), q_weight, q_out, eps)
    rmsnorm_reference(k.reshape(tokens, num_kv_heads, head_dim), k_weight, k_out, eps)
    out.copy_(torch.cat((q_out.reshape(tokens, -1), k_out.reshape(tokens, -1), v), dim=-1))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, head_dim); cos/sin: (T, head_dim) fp32. Rotate-half convention."""
    cos = cos.to(x.dtype)[:, None, :]
    sin = sin.to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def read_cache(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache[slots] as values of `dtype`: int8 rows dequantized, float caches converted."""
    rows = cache[slots]
    return (kv_int8.dequantize(rows) if cache.dtype == torch.int8 else rows).to(dtype)


def visible_keys(q_len: int, context: int, sliding_window: int = 0) -> tuple[int, torch.Tensor]:
    """(first key position any query sees, (q_len, context - first) bool mask of what each sees).

    Query j sits at position context - q_len + j and sees keys up to it, and with a sliding window
    W > 0 only the last W of them. Keys before the first are never read (their blocks may be reused)."""
    first = max(0, context - q_len - sliding_window + 1) if sliding_window > 0 else 0
    q_pos = torch.arange(context - q_len, context)[:, None]
    keys = torch.arange(first, context)[None, :]
    mask = keys <= q_pos
    return first, (mask & (keys > q_pos - sliding_window) if sliding_window > 0 else mask)


def rope_write_kv_reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot_mapping: torch.Tensor,
                            q_out: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Rotate q and k of qkv (T, (H + 2*Hkv) * D); q to q_out (T, H, D), k and v into the caches
    (as int8 rows with their scales for an int8 cache)."""
    tokens, heads, head_dim = q_out.shape
    kv_heads = key_cache.shape[1]
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q_out.copy_(apply_rotary(q.reshape(tokens, heads, head_dim), cos, sin))
    k = apply_rotary(k.reshape(tokens, kv_heads, head_dim), cos, sin)
    v = v.reshape(tokens, kv_heads, head_dim)
    if key_cache.dtype == torch.int8:
        key_cache[slot_mapping], value_cache[slot_mapping] = kv_int8.quantize(k), kv_int8.quantize(v)
    else:
        key_cache[slot_mapping], value_cache[slot_mapping] = k.to(key_cache.dtype), v.to(value_cache.dtype)


def paged_attention_reference(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                              block_tables: torch.Tensor, query_start: torch.Tensor, context_lens: torch.Tensor,
                              block_size: int, scale: float, out: torch.Tensor, sliding_window: int = 0) -> None:
    """Causal attention of q (T, H, D) over the paged cache (int8 rows dequantized), with
    scaled_dot_product_attention. sliding_window W > 0 (Gemma 3's local layers): a query sees only its
    last W positions."""
    starts, contexts = query_start.tolist(), context_lens.tolist()
    for b, context in enumerate(contexts):
        begin, end = starts[b], starts[b + 1]
        first, mask = visible_keys(end - begin, context, sliding_window)  # mask: (q_len, keys)
        blocks = block_tables[b, :-(-context // block_size)].to(torch.int64)
        slots = (blocks[:, None] * block_size + torch.arange(block_size)[None, :]).reshape(-1)[first:context]
        k = read_cache(key_cache, slots, q.dtype).transpose(0, 1)  # (kv_heads, keys, D)
        v = read_cache(value_cache, slots, q.dtype).transpose(0, 1)
        qs = q[begin:end].transpose(0, 1)  # (heads, q_len, D)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[begin:end] = o.transpose(0, 1)


def silu_mul_reference(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    gate, up = gate_up.chunk(2, dim=-1)
    out.copy_(F.silu(gate) * up)


def gelu_tanh_mul_reference(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    gate, up = gate_up.chunk(2, dim=-1)
    out.copy_(F.gelu(gate, approximate="tanh") * up)


def mul_scalar_reference(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


def div_scalar_reference(x: torch.Tensor, divisor: float) -> None:
    x.div_(divisor)


def softcap_reference(x: torch.Tensor, cap: float) -> None:
    """x = tanh(x / cap) * cap (float32 logits; Gemma's final soft-capping)."""
    x.copy_(torch.tanh(x / cap) * cap)


def route_reference(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits (T, E) -> (experts (T, k) int64 best first, weights (T, k) float32): softmax in float32,
    the top_k by probability with ties to the lower expert index, renormalised over them when `normalize`."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    experts = torch.sort(router_logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = probs.gather(1, experts)
    return experts, weights / weights.sum(-1, keepdim=True) if normalize else weights


def moe_reference(x: torch.Tensor, router_logits: torch.Tensor, experts, out: torch.Tensor, top_k: int,
                  normalize: bool) -> None:
    """out (T, hidden) = sum over each row's top_k experts (shrike.weight_formats.ExpertWeights) of
    weight * down(silu(gate) * up)(x row), each expert run once over its rows by its format's reference
    linear (gate_up in x's dtype, down in float32), summed in float32 in ascending expert order; a shared
    expert (the last, with router_logits' last column as its gate) runs on every row, weighted by
    sigmoid(gate logit)."""
    routed = len(experts.down) - experts.shared
    chosen, weights = route_reference(router_logits[:, :routed], top_k, normalize)  # (T, k), (T, k)
    if experts.shared:
        chosen = torch.cat([chosen, torch.full_like(chosen[:, :1], routed)], dim=1)  # (T, k + 1)
        weights = torch.cat([weights, torch.sigmoid(router_logits[:, routed:].float())], dim=1)
    linear = _REFERENCE_LINEARS[experts.op]
    acc = torch.zeros(x.shape[0], out.shape[1])  # (T, hidden) float32
    for e in range(len(experts.down)):
        rows, rank = (chosen == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        inter = experts.intermediate if e < routed else experts.shared_intermediate
        gate_up = torch.empty(rows.numel(), 2 * inter, dtype=x.dtype)
        linear(x[rows], _unpacked(experts.gate_up[e]), None, gate_up)
        act = torch.empty(rows.numel(), inter, dtype=x.dtype)
        silu_mul_reference(gate_up, act)
        y = torch.empty(rows.numel(), out.shape[1])  # (rows, hidden) float32
        linear(act, _unpacked(experts.down[e]), None, y)
        acc[rows] += weights[rows, rank][:, None] * y
    out.copy_(acc)


def lora_reference(x: torch.Tensor, adapters, row_slots: torch.Tensor, out: torch.Tensor) -> None:
    """out (T, N) += each row's LoRA update from the adapter in its slot (row_slots (T,) int32, -1: none), in
    float32, out rounded once. adapters (shrike.layers.lora.LoRASlots): shrink (S, parts * R, K), expand
    (S, R, N) with the scaling folded in, ranks (S,), part_end (parts,)."""
    max_rank = adapters.expand.shape[1]
    for slot in sorted(set(row_slots.tolist()) - {-1}):
        rank = int(adapters.ranks[slot])
        if rank == 0:
            continue
        rows = (row_slots == slot).nonzero(as_tuple=True)[0]
        xs = x[rows].float()  # (m, K)
        delta = torch.empty(rows.numel(), out.shape[1])  # (m, N)
        begin = 0
        for part, end in enumerate(adapters.part_end.tolist()):
            shrink = adapters.shrink[slot, part * max_rank:part * max_rank + rank]  # (rank, K)
            delta[:, begin:end] = (xs @ shrink.T) @ adapters.expand[slot, :rank, begin:end]
            begin = end
        out[rows] = (out[rows].float() + delta).to(out.dtype)


def lora_kernel(x: torch.Tensor, adapters, row_slots: torch.Tensor, out: torch.Tensor) -> None:
    _C.lora(x, adapters.shrink, adapters.expand, adapters.ranks, adapters.part_end, row_slots, out)


def _unpacked(weight):
    """A reference linear's form of an expert weight: bf16 tiles of the AMX kernel back to (N, K)."""
    return weight.unpack() if isinstance(weight, DenseTileWeight) else weight


def moe_kernel(x: torch.Tensor, router_logits: torch.Tensor, experts, out: torch.Tensor, top_k: int,
               normalize: bool) -> None:
    linears = experts.tape_linears()
    if linears is None:
        raise TypeError("the built-in moe op needs expert weights packed for Shrike's kernels")
    _C.moe(x, router_logits, *linears, out, top_k, normalize, experts.shared)


def _reference_weight(weight):
    """The reference GEMMs' form of a weight; kernel-packed weights are unpacked once."""
    from shrike import kernels
    from shrike.quantization import reference_kernels as ref

    if not isinstance(weight, (kernels.W4A8Weight, kernels.W8A8Weight, kernels.WeightOnlyWeight)):
        return weight
    cached = getattr(weight, "_reference", None)
    if cached is None:
        if isinstance(weight, kernels.WeightOnlyWeight):
            perm = None if weight.perm is None else weight.perm.to(torch.int64)
            cached = ref.ReferenceWeightOnlyWeight(weight.dequantize(), perm)
        else:
            values, scale = weight.unpack()
            cached = ref.ReferenceW8A8Weight(values, scale.reshape(-1)) if isinstance(weight, kernels.W8A8Weight) \
                else ref.ReferenceW4A8Weight(values, scale, weight.group_size)
        weight._reference = cached
    return cached


def w4a8_linear_reference(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    from shrike.quantization import reference_kernels as ref
    out.copy_(ref.w4a8_linear(x, _reference_weight(weight), bias))


def w8a8_linear_reference(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    from shrike.quantization import reference_kernels as ref
    out.copy_(ref.w8a8_linear(x, _reference_weight(weight), bias))


def weight_only_linear_reference(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """The weight-only kernel's math: dense_linear on the dequantized weight, inputs in its column order."""
    weight = _reference_weight(weight)
    if weight.perm is not None:
        x = x.index_select(1, weight.perm)
    dense_linear_reference(x, weight.weight, None if bias is None else bias.float(), out)


def quantize_blocks_of_32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped linear's activations: x (M, K) -> (q (M, K) float32 integers in [-127, 127], scale (M, K/32)),
    x ~ q * scale per block of 32 K, q = round_half_even(x * (127 / max|x|)) (0 for an all-zero block)."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // 32, 32)
    amax = blocks.abs().amax(-1)  # (M, K/32)
    # a true division (127 / tensor would multiply by the reciprocal, rounding twice)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127).div(torch.where(amax > 0, amax, 1)), 0)
    q = torch.round(blocks * inverse[..., None]).clamp(-127, 127)
    return q.reshape(m, k), amax / 127


def _over_grouped_parts(op, x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> bool:
    """Runs op on each part of a kernels.GroupedParts into its columns of out (a view: the kernel writes rows
    out's row stride apart); False for a single weight."""
    if not isinstance(weight, GroupedParts):
        return False
    col = 0
    for part in weight.parts:
        op(x, part, None if bias is None else bias[col:col + part.n], out[:, col:col + part.n])
        col += part.n
    return True


def grouped_linear_reference(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """The grouped kernel's math (csrc/grouped_linear/grouped_linear.h) on a ``kernels.GroupedWeight``: x
    quantized to int8 per 32 K, exact integer sums per weight group, then the float steps in K order (each
    fma done in float64 and rounded, which could differ from a true fma by double rounding); a GroupedParts
    part by part."""
    if _over_grouped_parts(grouped_linear_reference, x, weight, bias, out):
        return
    parts = getattr(weight, "_reference", None)
    if parts is None:
        parts = weight._reference = weight.unpack()
    values, scale, mins = parts  # (N, K) int8, (N, K/G) float32, (N, K/G) float32 or None
    m, k = x.shape
    group, groups = weight.group_size, k // weight.group_size
    q, x_scale = quantize_blocks_of_32(x)
    q = q.reshape(m, groups, group)
    isum = torch.einsum("mgj,ngj->gmn", q.double(), values.reshape(-1, groups, group).double())  # exact integers
    block_scale = x_scale[:, torch.arange(groups) * group // 32]  # (m, groups)
    x_min = -q.sum(-1) * block_scale  # (m, groups) float32
    acc = torch.zeros(m, weight.n)
    for g in range(groups):
        step_scale = scale[None, :, g] * block_scale[:, g, None]  # (m, N) float32
        acc = (isum[g] * step_scale.double() + acc.double()).float()
        if mins is not None:
            acc = (x_min[:, g, None].double() * mins[None, :, g].double() + acc.double()).float()
    out.copy_(acc if bias is None else acc + bias)


def dense_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           out: torch.Tensor) -> None:
    """out (M, N) = x (M, K) . weight (N, K)^T (+ bias (N,) float32): F.linear's math in the reduction order
    the compiled kernel runs for these dtypes at the active level (csrc/dense/dense_kernels.h), so both give
    the same bits: the AMX tile order for bf16 x bf16 on the amx level, the lanes order otherwise."""
    if x.dtype == weight.dtype == torch.bfloat16 and _C.dense_variant("bfloat16", "bfloat16") == "amx":
        return _dense_tile_order(x, weight, bias, out)
    _dense_lanes_order(x, weight, bias, out)


def _dense_lanes_order(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """K is taken in blocks of 32 (zero-padded); lane j of 16 adds x*w of the block's element 2j+1, then 2j,
    with a fused multiply-add; the lanes are summed pairwise (j += j + 8, + 4, + 2, + 1), then bias added.
    bf16 x bf16 products are exact in fp32, so a plain add is the fma; otherwise the fma is emulated in
    float64, which could differ from a true fma by double rounding (about one operation in 2^28).
    """
    m, k = x.shape
    n = weight.shape[0]
    blocks = -(-k // 32)
    xs = F.pad(x.float(), (0, blocks * 32 - k)).reshape(m, 1, blocks, 16, 2)
    ws = F.pad(weight.float(), (0, blocks * 32 - k)).reshape(1, n, blocks, 16, 2)
    exact_products = x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16
    chunk = max(1, (1 << 22) // max(1, m * 16))  # outputs per pass: bounded temporaries
    for n0 in range(0, n, chunk):
        w = ws[:, n0:n0 + chunk]
        acc = torch.zeros(m, w.shape[1], 16)  # (M, chunk, lanes)
        for b in range(blocks):
            for element in (1, 0):
                a, c = xs[:, :, b, :, element], w[:, :, b, :, element]
                acc = acc + a * c if exact_products else (a.double() * c.double() + acc.double()).float()
        for half in (8, 4, 2, 1):
            acc = acc[..., :half] + acc[..., half:2 * half]
        y = acc[..., 0]
        out[:, n0:n0 + chunk] = y if bias is None else y + bias[n0:n0 + chunk]


def _dense_tile_order(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """bf16 x bf16 as tdpbf16ps adds it (common/amx_bf16_order.h): K in tiles of 32 (zero-padded), in order;
    per tile an fma chain from 0 over the even elements of its 16 pairs and one over the odd ones, then
    acc = acc + (even + odd); then bias added. The products are exact in fp32, so a plain add is the fma.
    Denormal inputs are read as zero as the tile unit reads them; denormal sums, which it flushes too, are
    kept (a difference only for partial sums below 2^-126 in magnitude)."""
    m, k = x.shape
    n = weight.shape[0]
    tiles = -(-k // 32)

    def padded(t: torch.Tensor, rows: int) -> torch.Tensor:
        t = F.pad(t.float(), (0, tiles * 32 - k))
        return torch.where(t.abs() < torch.finfo(torch.float32).tiny, t * 0, t).reshape(rows, tiles, 16, 2)

    xs, ws = padded(x, m)[:, None], padded(weight, n)[None]  # (M, 1, tiles, 16, 2), (1, N, tiles, 16, 2)
    chunk = max(1, (1 << 22) // max(1, m * tiles))  # outputs per pass: bounded temporaries
    for n0 in range(0, n, chunk):
        w = ws[:, n0:n0 + chunk]
        even, odd = (torch.zeros(m, w.shape[1], tiles) for _ in range(2))  # (M, chunk, tiles)
        for pair in range(16):
            even = even + xs[:, :, :, pair, 0] * w[:, :, :, pair, 0]
            odd = odd + xs[:, :, :, pair, 1] * w[:, :, :, pair, 1]
        steps = even + odd
        acc = torch.zeros(m, w.shape[1])  # (M, chunk)
        for t in range(tiles):
            acc = acc + steps[..., t]
        out[:, n0:n0 + chunk] = acc if bias is None else acc + bias[n0:n0 + chunk]


_REFERENCE_LINEARS = {"w4a8_linear": w4a8_linear_reference, "w8a8_linear": w8a8_linear_reference,
                      "weight_only_linear": weight_only_linear_reference, "grouped_linear": grouped_linear_reference,
                      "dense_linear": dense_linear_reference}


# Built-in kernels with the op calling convention ---------------------------------------------

def w4a8_linear_kernel(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    _C.w4a8_linear(x, weight.packed, weight.n, weight.group_size, bias, out)


def w8a8_linear_kernel(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    _C.w8a8_linear(x, weight.packed, weight.n, bias, out)


def weight_only_linear_kernel(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    _C.weight_only_linear(x, weight.q, weight.scale, weight.offset, weight.perm, weight.bits, weight.n,
                          weight.group_size, bias, out)


def grouped_linear_kernel(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    if _over_grouped_parts(grouped_linear_kernel, x, weight, bias, out):
        return
    _C.grouped_linear(x, weight.packed, weight.n, weight.group_size, weight.bits, weight.has_min, weight.codebook,
                      weight.params_code, bias, out)


def dense_linear_kernel(x: torch.Tensor, weight, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """weight: (N, K) tensor or kernels.DenseTileWeight."""
    if bias is not None and bias.dtype != torch.float32:
        bias = bias.float()  # exact; the kernel adds the bias in float32
    if isinstance(weight, DenseTileWeight):
        _C.dense_linear_tiles(x, weight.tiles, weight.n, bias, out)
    else:
        _C.dense_linear(x, weight, bias, out)


def weight_for_op(weight: torch.Tensor, op) -> torch.Tensor | DenseTileWeight:
    """`weight` (N, K) in the form `op` takes. The built-in kernel op takes bf16 weights packed once as
    AMX-BF16 tiles when the tile variant is what it runs for bf16 (the packed form replaces the tensor for a
    caller that keeps only what this returns); every other op (the reference, a plugin's), dtype or kernel
    level takes the tensor."""
    if op is dense_linear_kernel and weight.dtype == torch.bfloat16 and \
            _C.dense_variant("bfloat16", "bfloat16") == "amx":
        return DenseTileWeight.from_dense(weight)
    return weight


def register_builtin_ops(registry: Registry) -> None:
    builtin = f"builtin:{_C.active_isa()}"
    kernels = {
        "embedding": embedding_kernel,
        "rmsnorm": _C.rmsnorm,
        "add_rmsnorm": _C.add_rmsnorm,
        "head_rmsnorm": _C.head_rmsnorm,
        "w4a8_linear": w4a8_linear_kernel,
        "w8a8_linear": w8a8_linear_kernel,
        "weight_only_linear": weight_only_linear_kernel,
        "grouped_linear": grouped_linear_kernel,
        "dense_linear": dense_linear_kernel,
        "rope_write_kv": _C.rope_write_kv,
        "paged_attention": _C.paged_attention,
        "silu_mul": _C.silu_mul,
        "gelu_tanh_mul": _C.gelu_tanh_mul,
        "mul_scalar": _C.mul_scalar,
        "div_scalar": _C.div_scalar,
        "softcap": _C.softcap,
        "moe": moe_kernel,
        "lora": lora_kernel,
    }
    references = {
        "embedding": embedding_reference,
        "rmsnorm": rmsnorm_reference,
        "add_rmsnorm": add_rmsnorm_reference,
        "head_rmsnorm": head_rmsnorm_reference,
        "w4a8_linear": w4a8_linear_reference,
        "w8a8_linear": w8a8_linear_reference,
        "weight_only_linear": weight_only_linear_reference,
        "grouped_linear": grouped_linear_reference,
        "dense_linear": dense_linear_reference,
        "rope_write_kv": rope_write_kv_reference,
        "paged_attention": paged_attention_reference,
        "silu_mul": silu_mul_reference,
        "gelu_tanh_mul": gelu_tanh_mul_reference,
        "mul_scalar": mul_scalar_reference,
        "div_scalar": div_scalar_reference,
        "softcap": softcap_reference,
        "moe": moe_reference,
        "lora": lora_reference,
    }
    for name in OP_NAMES:
        if name in kernels:
            registry.register_op(name, kernels[name], source=builtin)
        registry.register_op(name, references[name], source="reference")


_BUILTIN_TABLE = None


def builtin_op_table():
    """Shrike's own ops without plugins (for models built outside the engine, e.g. in tests)."""
    global _BUILTIN_TABLE
    if _BUILTIN_TABLE is None:
        registry = Registry()
        register_builtin_ops(registry)
        _BUILTIN_TABLE = registry.op_table()
    return _BUILTIN_TABLE
