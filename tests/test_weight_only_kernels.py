"""The weight-only linear op (W4A16 / W8A16, csrc/weight_only/): every compiled variant against dense_linear
on the dequantized float32 weight, bit for bit; act-order permutations; batch invariance; the torch reference.

Tolerance: none. The kernel dequantizes with one exact fma per weight (bf16/fp16 scales, integers below 2^9)
and then follows dense_linear's reduction order, so its result must equal dense_linear's scalar
reference on the float32 weight `WeightOnlyWeight.dequantize()` exactly, in every variant.
"""
from __future__ import annotations

import pytest
import torch

from shrike import _C
from shrike.kernels import WeightOnlyWeight
from shrike.ops import weight_only_linear_kernel, weight_only_linear_reference

VARIANTS = list(_C.available_isas())
# (m, n, k): decode rows, partial register blocks in N and M, K of 1 to 18 blocks.
SHAPES = [(1, 1, 32), (1, 37, 64), (2, 9, 96), (3, 40, 128), (5, 17, 256), (8, 64, 576), (17, 11, 192), (33, 8, 128)]


@pytest.fixture(autouse=True)
def restore_isa():
    before = _C.active_isa()
    yield
    _C.set_isa(before)


def weight(n: int, k: int, bits: int, group: int, asym: bool, act_order: bool, seed: int,
           scale_dtype: torch.dtype = torch.bfloat16) -> WeightOnlyWeight:
    gen = torch.Generator().manual_seed(seed)
    half = 1 << (bits - 1)
    values = torch.randint(-half, half, (n, k), dtype=torch.int8, generator=gen)
    scale = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.001).to(scale_dtype)
    zero = torch.randint(-half, half, (n, k // group), dtype=torch.int8, generator=gen) if asym else None
    perm = torch.randperm(k, generator=gen) if act_order else None
    return WeightOnlyWeight.from_int8(values, scale, zero, bits, group, perm)


def run(isa: str, x: torch.Tensor, w: WeightOnlyWeight, bias, out_dtype) -> torch.Tensor:
    _C.set_isa(isa)
    out = torch.empty(x.shape[0], w.n, dtype=out_dtype)
    weight_only_linear_kernel(x, w, bias, out)
    return out


def dense_on_dequantized(x: torch.Tensor, w: WeightOnlyWeight, bias, out_dtype) -> torch.Tensor:
    _C.set_isa("scalar")
    if w.perm is not None:
        x = x.index_select(1, w.perm.long()).contiguous()
    out = torch.empty(x.shape[0], w.n, dtype=out_dtype)
    _C.dense_linear(x, w.dequantize(), bias, out)
    return out


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("bits", [4, 8])
def test_variants_equal_dense_on_the_dequantized_weight(isa, bits):
    for i, (m, n, k) in enumerate(SHAPES):
        group = (32, 64, k)[i % 3] if k % 64 == 0 else 32
        w = weight(n, k, bits, group, asym=i % 2 == 1, act_order=i % 3 == 2, seed=i,
                   scale_dtype=(torch.bfloat16, torch.float16)[i % 4 // 2])
        gen = torch.Generator().manual_seed(100 + i)
        bias = torch.randn(n, generator=gen) if i % 2 else None
        for x_dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(m, k, generator=gen).to(x_dtype)
            for out_dtype in (torch.float32, torch.bfloat16):
                expected = dense_on_dequantized(x, w, bias, out_dtype)
                got = run(isa, x, w, bias, out_dtype)
                assert torch.equal(got, expected), f"{isa} bits={bits} M={m} N={n} K={k} G={group} x {x_dtype}"


def test_dequantize_is_the_checkpoint_weight():
    w = weight(16, 128, 4, 32, asym=True, act_order=False, seed=1)
    gen = torch.Generator().manual_seed(1)
    values = torch.randint(-8, 8, (16, 128), dtype=torch.int8, generator=gen)
    scale = (torch.rand(16, 4, generator=gen) * 0.02 + 0.001).bfloat16()
    zero = torch.randint(-8, 8, (16, 4), dtype=torch.int8, generator=gen)
    expected = (values.float().reshape(16, 4, 32) - zero.float()[..., None]) * scale.float()[..., None]
    assert torch.equal(w.dequantize(), expected.reshape(16, 128))


def test_batch_invariant_and_reference_matches():
    w = weight(48, 256, 4, 64, asym=True, act_order=True, seed=3)
    x = torch.randn(21, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    batch = run(_C.active_isa(), x, w, None, torch.float32)
    for r in (0, 7, 20):
        assert torch.equal(run(_C.active_isa(), x[r:r + 1].contiguous(), w, None, torch.float32), batch[r:r + 1])
    reference = torch.empty_like(batch)
    weight_only_linear_reference(x, w, None, reference)
    assert torch.equal(reference, batch)


def test_bad_arguments_are_value_errors():
    w = weight(8, 64, 4, 32, asym=False, act_order=False, seed=0)
    out = torch.empty(2, 8)
    with pytest.raises(ValueError, match="K must be a positive multiple of 32"):
        _C.weight_only_linear(torch.randn(2, 48), w.q, w.scale, w.offset, None, 4, 8, 32, None, out)
    with pytest.raises(ValueError, match="perm holds an index"):
        _C.weight_only_linear(torch.randn(2, 64), w.q, w.scale, w.offset, torch.full((64,), 64, dtype=torch.int32),
                              4, 8, 32, None, out)
