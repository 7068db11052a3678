"""The PyTorch reference path is bit-identical to the compiled W4A8 / W8A8 kernels."""
import pytest
import torch

from shrike import kernels
from shrike.quantization import reference_kernels as ref


def _activations(dtype: torch.dtype, k: int = 256) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(13, k, generator=gen) * torch.logspace(-3, 2, 13)[:, None]  # rows of very different ranges
    x[0] = 0  # empty range
    x[1] = x[1].abs()  # all positive: zero point at the low end
    x[2] = -x[2].abs()  # all negative
    x[3, 7] = 300.0  # one outlier dominates the row's scale
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_quantization_matches_kernels(dtype):
    x = _activations(dtype)
    asym = kernels.quantize_activations(x, "w4a8", 64)
    q, scale, zero = ref.quantize_asym(x)
    assert torch.equal(q, asym["q"]) and torch.equal(scale, asym["scale"]) and torch.equal(zero, asym["zero"])
    sym = kernels.quantize_activations(x, "w8a8")
    q, scale = ref.quantize_sym(x)
    assert torch.equal(q, sym["q"]) and torch.equal(scale, sym["scale"])


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("with_bias", [False, True])
def test_w4a8_linear_matches_kernel_bit_for_bit(group_size, with_bias):
    gen = torch.Generator().manual_seed(group_size)
    values = torch.randint(-8, 8, (40, 256), dtype=torch.int8, generator=gen)  # N = 40: a partial last tile
    scale = (torch.rand(40, 256 // group_size, generator=gen) * 0.02).bfloat16()
    bias = torch.randn(40, generator=gen) if with_bias else None
    for dtype in (torch.float32, torch.bfloat16):
        x = _activations(dtype)
        expected = kernels.linear(x, kernels.W4A8Weight.from_int8(values, scale, group_size), bias)
        weight = ref.ReferenceW4A8Weight(values, scale.float(), group_size)
        assert torch.equal(ref.w4a8_linear(x, weight, bias).to(dtype), expected)


@pytest.mark.parametrize("with_bias", [False, True])
def test_w8a8_linear_matches_kernel_bit_for_bit(with_bias):
    gen = torch.Generator().manual_seed(8)
    values = torch.randint(-128, 128, (40, 1536), dtype=torch.int8, generator=gen)  # sums beyond float32's 2^24
    scale = torch.rand(40, 1, generator=gen) * 0.01
    bias = torch.randn(40, generator=gen) if with_bias else None
    for dtype in (torch.float32, torch.bfloat16):
        x = _activations(dtype, k=1536)
        expected = kernels.linear(x, kernels.W8A8Weight.from_int8(values, scale), bias)
        weight = ref.ReferenceW8A8Weight(values, scale.reshape(40))
        assert torch.equal(ref.w8a8_linear(x, weight, bias).to(dtype), expected)


def test_reference_is_close_to_float_math():
    """Guards against both sides sharing a bug: the result must approximate x @ W^T."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 256, generator=gen)
    values = torch.randint(-8, 8, (24, 256), dtype=torch.int8, generator=gen)
    scale = torch.rand(24, 4, generator=gen) * 0.1 + 0.01
    dense = values.float() * scale.repeat_interleave(64, dim=1)  # (N, K)
    out = ref.w4a8_linear(x, ref.ReferenceW4A8Weight(values, scale, 64))
    expected = x @ dense.t()
    assert (out - expected).abs().max() < 0.01 * expected.abs().max()
