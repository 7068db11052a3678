"""Low-bit linear kernels: every compiled variant against the scalar reference (bit for bit),
the scalar reference against float64 PyTorch math on the same quantized values, repacking
round trips, and argument checking.

Tolerance: variants must equal the scalar reference exactly (integer sums are exact and every
variant performs the same float operations in the same order, see csrc/linear/linear.h). The
reference itself is compared with float64 math on the dequantized operands; its only error is
fp32 rounding of the per-group partial sums, bounded here by 2e-6 * sum(|x| |w|) + 1e-6.
"""

import platform

import numpy as np
import pytest
import torch

from shrike import kernels

MINICPM = {"qkv": (2560, 2048), "o": (2048, 2048), "gate_up": (12288, 2048), "down": (2048, 6144)}
SMOLLM = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
ODD = {"odd13": (13, 128), "odd37": (37, 256), "odd1": (1, 64)}
ALL_M = (1, 2, 3, 4, 5, 8, 17, 64, 129, 512)
SIMD = [isa for isa in kernels.available_isas() if isa != "scalar"]


@pytest.fixture(autouse=True)
def restore_isa():
    before = kernels.active_isa()
    yield
    kernels.set_isa(before)


def activations(m, k, gen):
    # A per-row offset moves the asymmetric zero point; row 1 all zero and row 2 all positive
    # hit the edge cases of the range rule.
    x = torch.randn(m, k, generator=gen) + (torch.rand(m, 1, generator=gen) * 3 - 1.5)
    if m > 1:
        x[1] = 0
    if m > 2:
        x[2] = x[2].abs() + 0.25
    return x


def w4a8_weight(n, k, group, gen):
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, k // group, generator=gen) * 0.02 + 0.001
    return q, scale, kernels.W4A8Weight.from_int8(q, scale, group)


def w8a8_weight(n, k, gen):
    q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, 1, generator=gen) * 0.02 + 0.001
    return q, scale, kernels.W8A8Weight.from_int8(q, scale)


def run(isa, x, weight, bias, out_dtype):
    kernels.set_isa(isa)
    return kernels.linear(x, weight, bias, out_dtype=out_dtype)


def consistency_cases():
    cases = []
    for name, (n, k) in {**SMOLLM, **ODD}.items():
        for m in ALL_M if name in SMOLLM else (1, 3, 17):
            cases.append((f"smol-{name}" if name in SMOLLM else name, m, n, k))
    for name, (n, k) in MINICPM.items():
        for m in (1, 5, 17):
            cases.append((f"minicpm-{name}", m, n, k))
    return cases


@pytest.mark.skipif(not SIMD, reason="no SIMD variant available on this CPU/build")
@pytest.mark.parametrize("name,m,n,k", consistency_cases())
def test_w4a8_variants_match_reference(name, m, n, k):
    gen = torch.Generator().manual_seed(m * 7919 + n * 31 + k)
    x = activations(m, k, gen)
    groups = [g for g in (32, 64, 128) if k % g == 0]
    if m > 64:  # prefill sizes: one group size keeps the scalar reference affordable
        groups = groups[-1:]
    for i, group in enumerate(groups):
        _, _, weight = w4a8_weight(n, k, group, gen)
        bias = torch.randn(n, generator=gen) if i % 2 == 0 else None
        x_in = x.bfloat16() if i == 1 else x
        out_dtype = torch.bfloat16 if i == 2 or m == 3 else torch.float32
        want = run("scalar", x_in, weight, bias, out_dtype)
        for isa in SIMD:
            got = run(isa, x_in, weight, bias, out_dtype)
            assert torch.equal(got, want), f"{isa} differs from scalar: group {group}, max abs diff " \
                f"{(got.float() - want.float()).abs().max().item()}"


@pytest.mark.skipif(not SIMD, reason="no SIMD variant available on this CPU/build")
@pytest.mark.parametrize("name,m,n,k", consistency_cases())
def test_w8a8_variants_match_reference(name, m, n, k):
    if k % 16:
        pytest.skip("W8A8 needs K % 16 == 0")
    gen = torch.Generator().manual_seed(m * 104729 + n * 17 + k)
    x = activations(m, k, gen)
    _, _, weight = w8a8_weight(n, k, gen)
    for bias, x_in, out_dtype in ((torch.randn(n, generator=gen), x, torch.float32), (None, x.bfloat16(), torch.bfloat16)):
        want = run("scalar", x_in, weight, bias, out_dtype)
        for isa in SIMD:
            got = run(isa, x_in, weight, bias, out_dtype)
            assert torch.equal(got, want), f"{isa} differs from scalar"


ARCH_VARIANTS = ["avx2", "avxvnni", "avx512vnni", "avx512bf16", "amx"] if platform.machine() in ("x86_64", "AMD64") \
    else ["dotprod", "i8mm", "sve2"]


@pytest.mark.parametrize("isa", ARCH_VARIANTS)
def test_each_variant_matches_reference_over_row_blocks(isa):
    """Per variant, so one this CPU cannot run shows up as skipped by name. Row counts hit every
    remainder of the register blocks (up to 8 rows) and the tile-pair edges (odd N)."""
    if isa not in kernels.available_isas():
        pytest.skip(f"{isa}: not runnable on this CPU or not in this build")
    gen = torch.Generator().manual_seed(11)
    for n, k in ((37, 256), (13, 128), (576, 576)):
        for m in (1, 2, 3, 6, 7, 9, 15, 33, 129):
            x = activations(m, k, gen)
            for group in (g for g in (32, 64, 128) if k % g == 0):
                _, _, w4 = w4a8_weight(n, k, group, gen)
                want = run("scalar", x, w4, None, torch.float32)
                assert torch.equal(run(isa, x, w4, None, torch.float32), want), f"w4a8 M={m} N={n} K={k} G={group}"
            _, _, w8 = w8a8_weight(n, k, gen)
            bias = torch.randn(n, generator=gen)
            want = run("scalar", x.bfloat16(), w8, bias, torch.bfloat16)
            assert torch.equal(run(isa, x.bfloat16(), w8, bias, torch.bfloat16), want), f"w8a8 M={m} N={n} K={k}"


@pytest.mark.skipif(not SIMD, reason="no SIMD variant available on this CPU/build")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [64, 576, 2048])
def test_activation_quantization_variants_match_reference(dtype, k):
    gen = torch.Generator().manual_seed(k)
    x = activations(9, k, gen).to(dtype)
    x[3, 5] = 0.5 / (255 / (x[3].float().max() - x[3].float().min().clamp(max=0)))  # near a rounding tie
    for scheme in ("w4a8", "w8a8"):
        kernels.set_isa("scalar")
        want = kernels.quantize_activations(x, scheme, group_size=64 if k % 64 == 0 else 32)
        for isa in SIMD:
            kernels.set_isa(isa)
            got = kernels.quantize_activations(x, scheme, group_size=64 if k % 64 == 0 else 32)
            for key in want:
                assert torch.equal(got[key], want[key]), f"{isa} {scheme} {key}"


def round_half_away(v):
    t = torch.trunc(v)
    return t + torch.trunc(2 * (v - t))  # exact in float32, like std::round


def kleidiai_reference(x):
    """qai8dxp per-row rule written out with float32 numpy scalars."""
    f = np.float32
    qs, scales, zeros = [], [], []
    for row in x.float():
        lo, hi = min(f(0), f(row.min().item())), max(f(0), f(row.max().item()))
        inv = f(1) if lo == hi else f(255) / (hi - lo)
        lo_s, hi_s = lo * inv, hi * inv
        zero = f(-128) - lo_s if (f(-128) + lo_s) + (f(127) + hi_s) > 0 else f(127) - hi_s
        zero = int(np.rint(min(max(zero, f(-128)), f(127))))
        q = (round_half_away(row * torch.tensor(inv)) + zero).clamp(-128, 127).to(torch.int8)
        qs.append(q)
        scales.append(f(1) / inv)
        zeros.append(zero)
    return torch.stack(qs), torch.tensor(np.array(scales, dtype=np.float32)), torch.tensor(zeros, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_activation_quantization_rules(dtype):
    kernels.set_isa("scalar")
    gen = torch.Generator().manual_seed(5)
    x = activations(6, 256, gen).to(dtype)
    got = kernels.quantize_activations(x, "w4a8", group_size=64)
    q, scale, zero = kleidiai_reference(x)
    assert torch.equal(got["q"], q) and torch.equal(got["scale"], scale) and torch.equal(got["zero"], zero)
    assert torch.equal(got["group_sum"], q.int().reshape(6, 4, 64).sum(-1))
    # Dequantized values stay within half a step of the input (the range includes every x).
    err = ((got["q"].float() - got["zero"][:, None]) * got["scale"][:, None] - x.float()).abs()
    assert (err <= got["scale"][:, None] * 0.5 + 1e-6).all()

    sym = kernels.quantize_activations(x, "w8a8")
    amax = x.float().abs().amax(1)
    assert torch.equal(sym["scale"], amax / 127)
    inv = torch.where(amax > 0, 1 / (amax / 127), torch.zeros_like(amax))
    assert torch.equal(sym["q"], torch.round(x.float() * inv[:, None]).clamp(-127, 127).to(torch.int8))


def test_reference_linear_matches_float_math():
    kernels.set_isa("scalar")
    gen = torch.Generator().manual_seed(11)
    for n, k, group, m in ((960, 576, 64, 5), (37, 256, 32, 3), (576, 1536, 128, 2)):
        x = activations(m, k, gen)
        q, scale, weight = w4a8_weight(n, k, group, gen)
        bias = torch.randn(n, generator=gen)
        a = kernels.quantize_activations(x, "w4a8", group)
        xd = (a["q"].double() - a["zero"][:, None]) * a["scale"][:, None].double()
        wd = (q.double().reshape(n, -1, group) * scale.double()[:, :, None]).reshape(n, k)
        want = xd @ wd.T + bias.double()
        got = kernels.linear(x, weight, bias)
        bound = 2e-6 * (xd.abs() @ wd.abs().T) + 1e-6
        assert ((got.double() - want).abs() <= bound).all()

        q8, scale8, weight8 = w8a8_weight(n, k, gen)
        a8 = kernels.quantize_activations(x, "w8a8")
        xd8 = a8["q"].double() * a8["scale"][:, None].double()
        wd8 = q8.double() * scale8.double()
        got8 = kernels.linear(x, weight8)
        assert ((got8.double() - xd8 @ wd8.T).abs() <= 2e-6 * (xd8.abs() @ wd8.abs().T) + 1e-6).all()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_w4a8_round_trips(group, tmp_path):
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(group)
    n, k = 37, 512
    q, scale, weight = w4a8_weight(n, k, group, gen)
    back_q, back_scale = weight.unpack()
    assert torch.equal(back_q, q) and torch.equal(back_scale, scale)

    # compressed-tensors pack-quantized: element i of a word at bits 4i, stored as value + 8.
    nibbles = (q.int() + 8).reshape(n, k // 8, 8)
    words = sum((nibbles[:, :, i] << (4 * i)) for i in range(8)).to(torch.int64)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    from_words = kernels.W4A8Weight.from_packed_int32(words, scale.bfloat16(), group)
    assert torch.equal(from_words.unpack()[0], q)
    assert torch.equal(from_words.unpack()[1], scale.bfloat16().float())

    save_file(weight.tensors(), tmp_path / "w.safetensors")
    loaded = kernels.W4A8Weight.from_tensors(load_file(tmp_path / "w.safetensors"))
    assert torch.equal(loaded.packed, weight.packed) and (loaded.n, loaded.k, loaded.group_size) == (n, k, group)
    x = torch.randn(3, k, generator=gen)
    assert torch.equal(kernels.linear(x, loaded), kernels.linear(x, weight))


def test_w8a8_round_trip(tmp_path):
    from safetensors.torch import load_file, save_file

    gen = torch.Generator().manual_seed(8)
    q, scale, weight = w8a8_weight(21, 96, gen)
    back_q, back_scale = weight.unpack()
    assert torch.equal(back_q, q) and torch.equal(back_scale, scale)
    save_file(weight.tensors(), tmp_path / "w.safetensors")
    loaded = kernels.W8A8Weight.from_tensors(load_file(tmp_path / "w.safetensors"))
    assert torch.equal(loaded.packed, weight.packed)


def test_bad_arguments_raise():
    gen = torch.Generator().manual_seed(0)
    _, _, weight = w4a8_weight(16, 128, 64, gen)
    x = torch.randn(2, 128)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        kernels.linear(x.half(), weight)
    with pytest.raises(ValueError, match=r"shape \(M, 128\)"):
        kernels.linear(torch.randn(2, 64), weight)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.linear(torch.randn(128, 2).T, weight)
    with pytest.raises(ValueError, match="bias"):
        kernels.linear(x, weight, bias=torch.randn(3))
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        kernels.W4A8Weight.from_int8(torch.zeros(4, 96, dtype=torch.int8), torch.ones(4, 1), 64)
    with pytest.raises(ValueError, match="group_size must be one of"):
        kernels.W4A8Weight.from_int8(torch.zeros(4, 96, dtype=torch.int8), torch.ones(4, 6), 16)
    with pytest.raises(ValueError, match=r"outside the int4 range"):
        kernels.W4A8Weight.from_int8(torch.full((4, 64), 9, dtype=torch.int8), torch.ones(4, 2), 32)
    with pytest.raises(TypeError, match="weight must be int8"):
        kernels.W4A8Weight.from_int8(torch.zeros(4, 64, dtype=torch.int32), torch.ones(4, 2), 32)
    with pytest.raises(ValueError, match="scale has shape"):
        kernels.W4A8Weight.from_int8(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 3), 32)
    with pytest.raises(ValueError, match="packed must be"):
        kernels.W4A8Weight(torch.zeros(10, dtype=torch.uint8), 16, 128, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        kernels.W8A8Weight.from_int8(torch.zeros(4, 40, dtype=torch.int8), torch.ones(4, 1))
    with pytest.raises(ValueError, match="available"):
        kernels.set_isa("not-an-isa")


def test_threads_give_identical_results():
    gen = torch.Generator().manual_seed(3)
    _, _, weight = w4a8_weight(2048, 2048, 128, gen)
    x = torch.randn(7, 2048, generator=gen)
    default = kernels.get_threads()
    want = kernels.linear(x, weight)
    try:
        kernels.set_threads(1)
        assert kernels.get_threads() == 1
        assert torch.equal(kernels.linear(x, weight), want)
        kernels.set_threads(2, cpu_bind=",".join(str(c) for c in sorted(__import__("os").sched_getaffinity(0))[:2]))
        assert kernels.get_threads() == 2
        assert torch.equal(kernels.linear(x, weight), want)
        with pytest.raises(ValueError, match="invalid CPU list"):
            kernels.set_threads(2, cpu_bind="3-1")
    finally:
        kernels.set_threads(default)
