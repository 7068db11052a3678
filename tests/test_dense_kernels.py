"""The unquantized linear op (_C.dense_linear, csrc/dense/): every compiled variant against the
scalar reference of its reduction order, batch invariance, the references against float64 math,
the AMX tile layout, and argument checking.

Tolerance: every variant follows one of the two reduction orders of csrc/dense/dense_kernels.h, so
each must equal the scalar reference of that order bit for bit: the lanes order for fp32 and bf16
weights and activations alike (vdpbf16ps adds a bf16 pair with exact products in the same order; it
would differ only on denormals, which these operands never produce), and for bf16 x bf16 at the amx
level the tile order, whose reference is written with tdpbf16ps's probed arithmetic
(csrc/common/amx_bf16_order.h). Both references are fp32 accumulation in a fixed order: their error
against float64 is bounded here by 2e-6 * sum(|x| |w|), plus half an output ulp for bf16 outputs.
"""
from __future__ import annotations

import pytest
import torch

from shrike import _C
from shrike.kernels import DenseTileWeight
from shrike.layers.linear import DenseLinear
from shrike.ops import weight_for_op
from shrike.executor.step import EagerStep
from shrike.ops import builtin_op_table, dense_linear_kernel, dense_linear_reference
from shrike.plugins import build_registry

VARIANTS = list(_C.available_isas())
SIMD = [isa for isa in VARIANTS if isa != "scalar"]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
needs_amx = pytest.mark.skipif("amx" not in VARIANTS, reason="amx: not runnable on this CPU or not in this build")
# (m, n, k): odd K (tails of every length class), odd N (partial register blocks), M 1..64.
SHAPES = [(1, 1, 1), (1, 33, 77), (2, 7, 31), (3, 40, 32), (4, 9, 33), (5, 64, 64), (7, 13, 100), (8, 17, 255),
          (9, 96, 576), (13, 5, 2048), (16, 31, 63), (17, 8, 129), (31, 23, 47), (33, 19, 96), (64, 70, 100)]


@pytest.fixture(autouse=True)
def restore_isa():
    before = _C.active_isa()
    yield
    _C.set_isa(before)


def dense(isa: str, x: torch.Tensor, w, bias: torch.Tensor | None, out_dtype=torch.float32):
    """w: (N, K) tensor or DenseTileWeight."""
    _C.set_isa(isa)
    tiles = isinstance(w, DenseTileWeight)
    out = torch.empty(x.shape[0], w.n if tiles else w.shape[0], dtype=out_dtype)
    if tiles:
        _C.dense_linear_tiles(x, w.tiles, w.n, bias, out)
    else:
        _C.dense_linear(x, w, bias, out)
    return out


def runs_tiles(isa: str, x_dtype: torch.dtype, w_dtype: torch.dtype) -> bool:
    _C.set_isa(isa)
    return _C.dense_variant(DTYPE_NAMES[x_dtype], DTYPE_NAMES[w_dtype]) == "amx"


def reference(isa: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out_dtype=torch.float32):
    """The scalar reference of the order `isa` runs for these dtypes: a tiles weight under the scalar
    level runs the tile order's reference, a rows weight the lanes order's."""
    order_weight = DenseTileWeight.from_dense(w) if runs_tiles(isa, x.dtype, w.dtype) else w
    return dense("scalar", x, order_weight, bias, out_dtype)


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
            expected = reference(isa, x, w, b, out_dtype)
            got = dense(isa, x, w, b, out_dtype)
            assert torch.equal(got, expected), f"{isa} M={m} N={n} K={k} x {x_name} w {w_name} out {out_dtype}"


# (m, n, k) for the amx kernel: M around the 16-row tile and the 32-row block (1, 15, 16, 17, 33, 512 and
# M past a 256-row task), N below one panel, odd, not a multiple of 16 or of the 32-output block, K below
# one 32-K tile and not a multiple of it, and the model shapes.
AMX_SHAPES = [(1, 1, 1), (1, 7, 31), (1, 16, 32), (1, 576, 576), (2, 33, 77), (15, 40, 32), (15, 17, 33),
              (16, 9, 33), (16, 48, 64), (17, 64, 64), (17, 31, 100), (31, 23, 47), (32, 32, 96), (33, 19, 96),
              (33, 80, 129), (64, 70, 100), (100, 5, 2048), (257, 47, 160), (512, 96, 576), (512, 17, 13),
              (600, 37, 255)]


@needs_amx
def test_amx_equals_the_tile_order_reference():
    """The amx kernel, on packed tiles and on (N, K) rows (packed per call), against the tile-order
    reference bit for bit, with and without bias, fp32 and bf16 outputs."""
    for i, (m, n, k) in enumerate(AMX_SHAPES):
        x, w, bias = operands(m, n, k, torch.bfloat16, torch.bfloat16, seed=200 + i)
        tiles = DenseTileWeight.from_dense(w)
        for out_dtype in (torch.float32, torch.bfloat16):
            for b in (None, bias):
                expected = dense("scalar", x, tiles, b, out_dtype)
                what = f"M={m} N={n} K={k} out {out_dtype} bias {b is not None}"
                assert torch.equal(dense("amx", x, tiles, b, out_dtype), expected), what
                assert torch.equal(dense("amx", x, w, b, out_dtype), expected), what + " rows"


@needs_amx
def test_amx_tile_order_is_not_the_lanes_order():
    """The two references differ (so the tests above could tell a kernel in the wrong order)."""
    x, w, bias = operands(64, 96, 576, torch.bfloat16, torch.bfloat16, seed=5)
    assert not torch.equal(dense("scalar", x, DenseTileWeight.from_dense(w), bias), dense("scalar", x, w, bias))


@needs_amx
def test_amx_rows_are_batch_invariant_up_to_300_rows():
    """A row alone (one-row tiles) equals the same row at any position of a 300-row batch (full and
    padded 16-row tiles, several row tasks and threads)."""
    n, k = 300, 600
    x, w, bias = operands(300, n, k, torch.bfloat16, torch.bfloat16, seed=11)
    tiles = DenseTileWeight.from_dense(w)
    batched = dense("amx", x, tiles, bias, torch.bfloat16)
    shifted = dense("amx", torch.cat([x[137:], x[:137]]), tiles, bias, torch.bfloat16)
    for r in list(range(0, 300, 23)) + [15, 16, 17, 31, 32, 33, 255, 256, 299]:
        alone = dense("amx", x[r:r + 1], tiles, bias, torch.bfloat16)
        assert torch.equal(batched[r:r + 1], alone), f"row {r}"
        assert torch.equal(shifted[(r - 137) % 300].unsqueeze(0), alone), f"row {r} shifted"
    for m in (2, 15, 16, 17, 33):
        assert torch.equal(dense("amx", x[:m], tiles, bias, torch.bfloat16), batched[:m]), f"M={m}"


def test_tiles_unpack_to_the_weight_and_below_amx_run_the_tile_reference():
    x, w, bias = operands(5, 37, 77, torch.bfloat16, torch.bfloat16, seed=9)
    tiles = DenseTileWeight.from_dense(w)
    assert tiles.tiles.numel() == 3 * 16 * 96  # 3 panels of 16 outputs, K padded to 96
    assert torch.equal(tiles.unpack(), w)
    expected = dense("scalar", x, tiles, bias)
    for isa in SIMD:  # every level: the amx kernel, or below it the reference of the tile order
        assert torch.equal(dense(isa, x, tiles, bias), expected), isa


@pytest.mark.parametrize("n, k", [(130560, 2048), (49152, 576)])
def test_lm_head_shapes_equal_reference(n, k):
    """The lm_head shapes through the thread pool; the (slow) scalar reference checks a sample of rows."""
    gen = torch.Generator().manual_seed(n)
    w = torch.empty(n, k, dtype=torch.bfloat16).normal_(0, 0.05, generator=gen)
    rows = torch.cat([torch.arange(0, 512), torch.randint(0, n, (512,), generator=gen), torch.arange(n - 37, n)])
    sample = w[rows].contiguous()
    for m, x_dtype in ((1, torch.bfloat16), (5, torch.float32), (8, torch.bfloat16)):
        x = torch.randn(m, k, generator=gen).to(x_dtype)
        for isa in SIMD:
            expected = reference(isa, x, sample, None)
            weight = weight_for_op(w, dense_linear_kernel) if isa == "amx" else w  # the engine's form
            assert torch.equal(dense(isa, x, weight, None)[:, rows], expected), f"{isa} M={m} x {x_dtype}"


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


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_tile_order_reference_against_float64(out_dtype):
    for i, (m, n, k) in enumerate(AMX_SHAPES[:12] + [(9, 96, 576), (13, 5, 2048)]):
        x, w, bias = operands(m, n, k, torch.bfloat16, torch.bfloat16, seed=300 + i)
        got = dense("scalar", x, DenseTileWeight.from_dense(w), bias, out_dtype).double()
        exact = x.double() @ w.double().T + bias.double()
        bound = 2e-6 * (x.double().abs() @ w.double().abs().T)
        if out_dtype == torch.bfloat16:
            bound = bound + exact.abs() * 2.0 ** -8
        assert ((got - exact).abs() <= bound + 1e-30).all(), f"M={m} N={n} K={k}"


def test_dense_linear_layer_and_the_registered_ops_agree():
    x, w, bias = operands(6, 50, 96, torch.bfloat16, torch.bfloat16, seed=3)
    ops = builtin_op_table()
    layer = DenseLinear(w, bias, ops.dense_linear)
    step = EagerStep.prefill(ops, torch.zeros(6, dtype=torch.int64), 16, torch.arange(6))
    y = layer(step, x, step.tokens)
    assert y.shape == (6, 50) and y.dtype == torch.bfloat16
    assert torch.equal(y, dense(_C.active_isa(), x, w, bias, torch.bfloat16))
    registry = build_registry()
    assert registry.op_table().chosen["dense_linear"].target is dense_linear_kernel  # _C.dense_linear, float32 bias
    reference = registry.op_table("reference").chosen["dense_linear"]
    assert reference.source == "reference" and reference.target is dense_linear_reference
    for x_dtype, w_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16), (torch.float32,) * 2):
        x, w, bias = operands(6, 50, 100, x_dtype, w_dtype, seed=4)
        out = torch.empty(6, 50)
        dense_linear_reference(x, w, bias, out)  # torch, in the order the active level runs
        assert torch.equal(out, dense(_C.active_isa(), x, w, bias)), (x_dtype, w_dtype)


@pytest.mark.parametrize("isa", SIMD)
def test_torch_reference_follows_the_order_of_the_active_level(isa):
    """With bf16 operands the torch reference gives the bits of the C++ reference of the order `isa` runs
    (the tile order at amx, the lanes order below), for K below, at and past one 32-K tile."""
    for i, (m, n, k) in enumerate([(1, 7, 31), (3, 33, 32), (17, 40, 77), (40, 20, 576)]):
        x, w, bias = operands(m, n, k, torch.bfloat16, torch.bfloat16, seed=400 + i)
        for out_dtype in (torch.float32, torch.bfloat16):
            _C.set_isa(isa)
            out = torch.empty(m, n, dtype=out_dtype)
            dense_linear_reference(x, w, bias, out)
            assert torch.equal(out, reference(isa, x, w, bias, out_dtype)), f"{isa} M={m} N={n} K={k} {out_dtype}"


def test_only_the_builtin_op_gets_tiles():
    """weight_for_op packs bf16 weights for the built-in kernel op when it runs the amx variant, and
    gives the reference (or a plugin's op) the (N, K) tensor; the layer's result is the op's either way."""
    x, w, bias = operands(6, 50, 96, torch.bfloat16, torch.bfloat16, seed=6)
    packs = _C.dense_variant("bfloat16", "bfloat16") == "amx"
    layer = DenseLinear(w, bias, dense_linear_kernel)
    assert isinstance(layer.weight, DenseTileWeight) == packs
    step = EagerStep.prefill(builtin_op_table(), torch.zeros(6, dtype=torch.int64), 16, torch.arange(6))
    assert torch.equal(layer(step, x, step.tokens), dense(_C.active_isa(), x, w, bias, torch.bfloat16))
    for op in (dense_linear_reference, _C.dense_linear):
        assert weight_for_op(w, op) is w
    assert weight_for_op(w.float(), dense_linear_kernel).dtype == torch.float32


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
    tiles = DenseTileWeight.from_dense(w.bfloat16())
    x = torch.randn(2, 16).bfloat16()
    cases = [
        ((x, tiles.tiles, 17, None, torch.empty(2, 17)), ValueError, "were not packed for N=17, K=16"),
        ((x.float(), tiles.tiles, 8, None, torch.empty(2, 8)), ValueError, "x must be bfloat16"),
        ((x, tiles.tiles[:-1], 8, None, torch.empty(2, 8)), ValueError, "were not packed for N=8, K=16"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            _C.dense_linear_tiles(*args)
    with pytest.raises(ValueError, match="weight must be a 2-D bfloat16 tensor"):
        DenseTileWeight.from_dense(w)
    with pytest.raises(ValueError, match="dense tiles must be bfloat16 packed by dense_pack_tiles for"):
        _C.TapeLinear("dense_tiles", tiles.tiles[:-1], None, 8, 16, 0)
