"""The unquantized linear op (_C.dense_linear, csrc/dense/): every compiled variant against the
scalar reference, batch invariance, the reference against float64 math, and argument checking.

Tolerance: every variant follows the reduction order of csrc/dense/dense_kernels.h, so each must
equal the scalar reference bit for bit, for fp32 and bf16 weights and activations alike (vdpbf16ps
adds a bf16 pair with exact products in the same order; it would differ only on denormals, which
these operands never produce). The reference itself is fp32 accumulation in a fixed order: its
error against float64 is bounded here by 2e-6 * sum(|x| |w|), plus half an output ulp for bf16 outputs.
"""
from __future__ import annotations

import pytest
import torch

from shrike import _C
from shrike.layers.linear import DenseLinear
from shrike.ops import dense_linear_kernel, dense_linear_reference
from shrike.plugins import build_registry

VARIANTS = list(_C.available_isas())
SIMD = [isa for isa in VARIANTS if isa != "scalar"]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# (m, n, k): odd K (tails of every length class), odd N (partial register blocks), M 1..64.
SHAPES = [(1, 1, 1), (1, 33, 77), (2, 7, 31), (3, 40, 32), (4, 9, 33), (5, 64, 64), (7, 13, 100), (8, 17, 255),
          (9, 96, 576), (13, 5, 2048), (16, 31, 63), (17, 8, 129), (31, 23, 47), (33, 19, 96), (64, 70, 100)]


@pytest.fixture(autouse=True)
def restore_isa():
    before = _C.active_isa()
    yield
    _C.set_isa(before)


def dense(isa: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out_dtype=torch.float32):
    _C.set_isa(isa)
    out = torch.empty(x.shape[0], w.shape[0], dtype=out_dtype)
    _C.dense_linear(x, w, bias, out)
    return out


def operands(m, n, k, x_dtype, w_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(x_dtype)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(w_dtype)
    bias = torch.randn(n, generator=gen)
    return x, w, bias


@pytest.mark.parametrize("isa", SIMD)
@pytest.mark.parametrize("x_name", DTYPES)
@pytest.mark.parametrize("w_name", DTYPES)
def test_variant_equals_reference(isa, x_name, w_name):
    for i, (m, n, k) in enumerate(SHAPES):
        x, w, bias = operands(m, n, k, DTYPES[x_name], DTYPES[w_name], seed=i)
        for out_dtype in (torch.float32, torch.bfloat16):
            b = bias if i % 2 else None
            expected = dense("scalar", x, w, b, out_dtype)
            got = dense(isa, x, w, b, out_dtype)
            assert torch.equal(got, expected), f"{isa} M={m} N={n} K={k} x {x_name} w {w_name} out {out_dtype}"


@pytest.mark.parametrize("n, k", [(130560, 2048), (49152, 576)])
def test_lm_head_shapes_equal_reference(n, k):
    """The lm_head shapes through the thread pool; the (slow) scalar reference checks a sample of rows."""
    gen = torch.Generator().manual_seed(n)
    w = torch.empty(n, k, dtype=torch.bfloat16).normal_(0, 0.05, generator=gen)
    rows = torch.cat([torch.arange(0, 512), torch.randint(0, n, (512,), generator=gen), torch.arange(n - 37, n)])
    sample = w[rows].contiguous()
    for m, x_dtype in ((1, torch.bfloat16), (5, torch.float32)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        expected = dense("scalar", x, sample, None)
        for isa in SIMD:
            assert torch.equal(dense(isa, x, w, None)[:, rows], expected), f"{isa} M={m} x {x_dtype}"


@pytest.mark.parametrize("isa", VARIANTS)
@pytest.mark.parametrize("w_name", DTYPES)
def test_rows_are_batch_invariant(isa, w_name):
    """Row r of a batched call is the same row computed alone, bit for bit, for every batch size.
    N * K is above the size the dispatcher runs without threads, so the splits over rows, outputs
    and threads all change with M."""
    n, k = (257, 1100) if isa != "scalar" else (40, 300)
    x, w, bias = operands(16, n, k, torch.bfloat16, DTYPES[w_name], seed=7)
    alone = torch.cat([dense(isa, x[r:r + 1], w, bias) for r in range(16)])
    for m in range(1, 17):
        batched = dense(isa, x[:m].contiguous(), w, bias)
        assert torch.equal(batched, alone[:m]), f"{isa} M={m}"
        # The same rows at another position of a larger batch.
        shifted = dense(isa, torch.cat([x[m:], x[:m]]), w, bias)
        assert torch.equal(shifted[16 - m:], alone[:m]), f"{isa} M={m} shifted"


@pytest.mark.parametrize("x_name", DTYPES)
@pytest.mark.parametrize("w_name", DTYPES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_reference_against_float64(x_name, w_name, out_dtype):
    for i, (m, n, k) in enumerate(SHAPES[:10]):
        x, w, bias = operands(m, n, k, DTYPES[x_name], DTYPES[w_name], seed=100 + i)
        got = dense("scalar", x, w, bias, out_dtype).double()
        exact = x.double() @ w.double().T + bias.double()
        bound = 2e-6 * (x.double().abs() @ w.double().abs().T)
        if out_dtype == torch.bfloat16:
            bound = bound + exact.abs() * 2.0 ** -8
        assert ((got - exact).abs() <= bound + 1e-30).all(), f"M={m} N={n} K={k}"


def test_dense_linear_layer_and_the_registered_ops_agree():
    x, w, bias = operands(6, 50, 96, torch.bfloat16, torch.bfloat16, seed=3)
    layer = DenseLinear(w, bias)
    y = layer(x.reshape(2, 3, 96))
    assert y.shape == (2, 3, 50) and y.dtype == torch.bfloat16
    assert torch.equal(y.reshape(6, 50), dense(_C.active_isa(), x, w, bias, torch.bfloat16))
    registry = build_registry()
    assert registry.resolve_op("dense_linear").target is dense_linear_kernel  # _C.dense_linear, float32 bias
    reference = registry.resolve_op("dense_linear", "reference")
    assert reference.source == "reference" and reference.target is dense_linear_reference
    for x_dtype, w_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16), (torch.float32,) * 2):
        x, w, bias = operands(6, 50, 100, x_dtype, w_dtype, seed=4)
        out = torch.empty(6, 50)
        dense_linear_reference(x, w, bias, out)  # torch, in the kernels' reduction order
        assert torch.equal(out, dense(_C.active_isa(), x, w, bias)), (x_dtype, w_dtype)


def test_empty_rows_and_bad_arguments():
    w = torch.randn(8, 16)
    _C.dense_linear(torch.empty(0, 16), w, None, torch.empty(0, 8))
    cases = [
        ((torch.randn(2, 15), w, None, torch.empty(2, 8)), ValueError, "weight has shape (8, 16) but x has K=15"),
        ((torch.randn(2, 16), w, None, torch.empty(2, 9)), ValueError, "out has shape (2, 9), expected (2, 8)"),
        ((torch.randn(2, 16), w, torch.randn(7), torch.empty(2, 8)), ValueError, "bias has shape (7,)"),
        ((torch.randn(2, 16), w, torch.randn(8).bfloat16(), torch.empty(2, 8)), ValueError, "bias must be float32"),
        ((torch.randn(2, 16).half(), w, None, torch.empty(2, 8)), TypeError, "x must be float32 or bfloat16"),
        ((torch.randn(16, 2).T, w, None, torch.empty(2, 8)), ValueError, "x must be contiguous"),
        ((torch.randn(16), w, None, torch.empty(2, 8)), ValueError, "x must be 2-D"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            _C.dense_linear(*args)
