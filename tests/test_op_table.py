"""Every op of the table: its torch reference agrees with the built-in kernel, and
`--kernel-backend reference` resolves every op to its reference."""
from __future__ import annotations

import pytest
import torch

from shrike import kernels
from shrike.ops import OP_NAMES, register_builtin_ops
from shrike.registry import Registry


@pytest.fixture(scope="module")
def tables():
    registry = Registry()
    register_builtin_ops(registry)
    return registry.op_table("auto"), registry.op_table("reference")


def _both(tables, name, make_args, out_index, **tolerance):
    """Runs the op's kernel and reference on equal copies of the inputs; compares every output."""
    kernel, reference = tables
    assert kernel.is_builtin(name) and reference.chosen[name].source == "reference"
    args_k, args_r = make_args(), make_args()
    getattr(kernel, name)(*args_k)
    getattr(reference, name)(*args_r)
    for i in out_index:
        torch.testing.assert_close(args_r[i], args_k[i], **tolerance)


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_every_op_is_in_the_table(tables):
    kernel, reference = tables
    assert set(kernel.chosen) == set(OP_NAMES) == set(reference.chosen)
    assert all(kernel.is_builtin(name) for name in OP_NAMES)
    assert not any(reference.is_builtin(name) for name in OP_NAMES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_elementwise_ops(tables, dtype):
    ids = torch.tensor([3, 0, 7, 3])
    _both(tables, "embedding", lambda: (ids, _randn(10, 32, dtype=dtype), torch.empty(4, 32, dtype=dtype), 12.0), [2],
          atol=0, rtol=0)
    _both(tables, "add_rmsnorm", lambda: (_randn(4, 64, dtype=dtype), _randn(4, 64, dtype=dtype, seed=1),
                                          _randn(64, dtype=dtype, seed=2), torch.empty(4, 64, dtype=dtype), 1e-5),
          [1, 3])
    _both(tables, "silu_mul", lambda: (_randn(4, 64, dtype=dtype), torch.empty(4, 32, dtype=dtype)), [1])


def test_rope_and_attention(tables):
    tokens, heads, kv_heads, d, block = 5, 4, 2, 16, 4
    cos, sin = _randn(tokens, d, seed=1), _randn(tokens, d, seed=2)
    slots = torch.tensor([8, 9, 10, 11, 12])
    _both(tables, "rope_write_kv", lambda: (_randn(tokens, (heads + 2 * kv_heads) * d), cos, sin, slots,
                                            torch.empty(tokens, heads, d), torch.zeros(16, kv_heads, d),
                                            torch.zeros(16, kv_heads, d)), [4, 5, 6], atol=0, rtol=0)
    cache_k, cache_v = _randn(16, kv_heads, d, seed=3), _randn(16, kv_heads, d, seed=4)
    tables_arg = torch.tensor([[2, 3, 0, 0], [1, 0, 0, 0]], dtype=torch.int32)
    _both(tables, "paged_attention", lambda: (_randn(tokens, heads, d), cache_k, cache_v, tables_arg,
                                              torch.tensor([0, 3, 5], dtype=torch.int32),
                                              torch.tensor([7, 2], dtype=torch.int32), block, 0.25,
                                              torch.empty(tokens, heads, d)), [8], atol=1e-5, rtol=1e-4)


def test_linear_ops(tables):
    values = torch.randint(-8, 8, (48, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    w4 = kernels.W4A8Weight.from_int8(values, _randn(48, 2).abs() / 8, 32)
    w8 = kernels.W8A8Weight.from_int8(values * 9, _randn(48, 1).abs() / 64)
    bias = _randn(48, seed=5)
    x = _randn(3, 64, seed=6)
    # The reference GEMMs follow the kernels' arithmetic exactly.
    _both(tables, "w4a8_linear", lambda: (x, w4, bias, torch.empty(3, 48)), [3], atol=0, rtol=0)
    _both(tables, "w8a8_linear", lambda: (x, w8, bias, torch.empty(3, 48)), [3], atol=0, rtol=0)
    _both(tables, "dense_linear", lambda: (x, _randn(48, 64, seed=7), bias, torch.empty(3, 48)), [3],
          atol=1e-4, rtol=1e-4)
    wo = kernels.WeightOnlyWeight.from_int8(values, (_randn(48, 2).abs() / 8).bfloat16(), values[:, :2], 4, 32,
                                            torch.randperm(64, generator=torch.Generator().manual_seed(1)))
    _both(tables, "weight_only_linear", lambda: (x, wo, bias, torch.empty(3, 48)), [3], atol=0, rtol=0)
