"""Fused decoder-layer steps against the unfused PyTorch code they replace (bit-exact in bf16,
where every intermediate rounding is part of the result)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shrike import _C, kernels
from shrike.ops import apply_rotary

DTYPES = [torch.float32, torch.bfloat16]


def _exact_or_close(actual, expected, dtype, atol_f32=1e-6):
    if dtype == torch.bfloat16:
        # exp differs in the last float bit between libm and torch's SIMD exp: allow one bf16 ulp.
        torch.testing.assert_close(actual.float(), expected.float(), atol=0, rtol=2 ** -7)
    else:
        torch.testing.assert_close(actual, expected, atol=atol_f32, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 2048), (3, 36)])
def test_add_rmsnorm(dtype, rows, dim):
    x, residual, weight = torch.randn(rows, dim, dtype=dtype), torch.randn(rows, dim, dtype=dtype), torch.randn(dim, dtype=dtype)
    expected_residual = residual + x
    r32 = expected_residual.float()
    expected = weight * (r32 * torch.rsqrt(r32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    out = torch.empty_like(x)
    _C.add_rmsnorm(x, residual, weight, out, 1e-5)
    assert torch.equal(residual, expected_residual)
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-5 if dtype == torch.float32 else 0.02, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gate_up = torch.randn(5, 2 * 1536, dtype=dtype) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.empty(5, 1536, dtype=dtype)
    _C.silu_mul(gate_up, out)
    _exact_or_close(out, F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("isa", ["avx2", "avx512vnni"])
def test_silu_mul_simd_variant_matches_portable_loop(dtype, isa):
    """Its own exp against libm's: within a float ulp before rounding, for ordinary and extreme
    gates, NaN, and a width that leaves a partial vector."""
    if isa not in kernels.available_isas():
        pytest.skip(f"{isa}: not runnable on this CPU or not in this build")
    gate_up = torch.randn(7, 2 * 1541) * 4
    gate_up[0, :9] = torch.tensor([-200.0, -104.5, -88.0, -20.0, 0.0, 20.0, 88.0, 200.0, float("nan")])
    gate_up = gate_up.to(dtype)
    outs, before = {}, kernels.active_isa()
    try:
        for level in ("scalar", isa):
            kernels.set_isa(level)
            outs[level] = torch.empty(7, 1541, dtype=dtype)
            _C.silu_mul(gate_up, outs[level])
    finally:
        kernels.set_isa(before)
    assert torch.isnan(outs[isa][0, 8]) and torch.isnan(outs["scalar"][0, 8])
    rtol = 2 ** -7 if dtype == torch.bfloat16 else 6e-7
    torch.testing.assert_close(outs[isa].float(), outs["scalar"].float(), atol=0, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("act_dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (16, 2, 128)])
def test_rope_write_kv(act_dtype, cache_dtype, heads, kv_heads, head_dim):
    tokens, slots = 6, 40
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=act_dtype)
    angles = torch.rand(tokens, head_dim // 2) * 50
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    slot_mapping = torch.tensor([3, 17, 4, 39, 0, 22])
    key_cache = torch.zeros(slots, kv_heads, head_dim, dtype=cache_dtype)
    value_cache = torch.zeros_like(key_cache)
    q_out = torch.empty(tokens, heads, head_dim, dtype=act_dtype)
    _C.rope_write_kv(qkv, cos, sin, slot_mapping, q_out, key_cache, value_cache)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    assert torch.equal(q_out, apply_rotary(q.reshape(tokens, heads, head_dim), cos, sin))
    assert torch.equal(key_cache[slot_mapping], apply_rotary(k.reshape(tokens, kv_heads, head_dim), cos, sin).to(cache_dtype))
    assert torch.equal(value_cache[slot_mapping], v.reshape(tokens, kv_heads, head_dim).to(cache_dtype))
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[slot_mapping] = False
    assert not key_cache[untouched].any()


def test_rope_write_kv_rejects_a_slot_outside_the_cache():
    qkv = torch.randn(1, (2 + 2) * 8)
    cache = torch.zeros(4, 1, 8)
    with pytest.raises(ValueError, match="slot out of the cache's range"):
        _C.rope_write_kv(qkv, torch.ones(1, 8), torch.zeros(1, 8), torch.tensor([4]), torch.empty(1, 2, 8), cache,
                         cache.clone())


def test_outputs_are_never_silently_copied():
    """A non-contiguous output would be converted into a temporary copy and the result lost: refuse it."""
    x, weight = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(TypeError):
        _C.rmsnorm(x, weight, torch.empty(8, 4).t(), 1e-5)
    with pytest.raises(TypeError):
        _C.add_rmsnorm(x, torch.empty(8, 4).t(), weight, torch.empty_like(x), 1e-5)
