"""Shared helpers of the Python tests: the tolerance table, fp64 goldens and transformers'
parity bound."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests build their models from configs

import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# The project's tolerance table (README, "Tolerances"): |y - golden| <= atol + rtol * |golden|.
TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
}

# Unit roundoff (half an ulp, relative) of each dtype.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def assert_golden(got: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype, what: str = ""):
    """got (any dtype) within the tolerance table of an fp64 golden."""
    atol, rtol = TOLERANCE[dtype]
    diff = (got.double() - golden).abs()
    excess = diff - (atol + rtol * golden.abs())
    assert got.shape == golden.shape, f"{what}: shape {tuple(got.shape)} != {tuple(golden.shape)}"
    assert bool((excess <= 0).all()), (
        f"{what}: {int((excess > 0).sum())} values outside atol {atol} + rtol {rtol}; "
        f"worst |diff| {diff.max().item():.3g}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def assert_parity(got: torch.Tensor, theirs: torch.Tensor, terms: torch.Tensor, dtype, what=""):
    """tilerope (fp32, rounded once) against transformers' function, which rounds q*cos,
    rotate_half(q)*sin and their sum each to the dtype: every rounding moves a value by at most
    the unit roundoff u of its magnitude, so the two differ by at most about
    3u * (|q cos| + |rotate_half(q) sin|) (`terms`, fp64), plus subnormal steps for float16.
    The bound used is 5u * terms + 3 * 2^-24."""
    u = UNIT_ROUNDOFF[dtype]
    diff = (got.double() - theirs.double()).abs()
    bound = 5 * u * terms + 3 * 2.0**-24
    assert got.shape == theirs.shape and got.dtype == theirs.dtype, what
    assert bool((diff <= bound).all()), (
        f"{what}: {int((diff > bound).sum())} values past 5u*terms; worst |diff| "
        f"{diff.max().item():.3g}, worst ratio {(diff / bound).max().item():.3g}")


def assert_within_ulp(got: torch.Tensor, theirs: torch.Tensor, what: str = ""):
    """got and theirs (same dtype) at most one ulp of theirs apart: both rounded once from fp32
    values that differ in their last fp32 bits."""
    a = theirs.abs()
    ulp = torch.nextafter(a, torch.full_like(a, float("inf"))) - a
    diff = (got.double() - theirs.double()).abs()
    assert got.dtype == theirs.dtype and bool((diff <= ulp.double()).all()), (
        f"{what}: {int((diff > ulp.double()).sum())} values more than an ulp apart")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def randn(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def hf_cos_sin(positions: torch.Tensor, dim: int, theta: float = 10000.0, dtype=torch.float32):
    """cos and sin [*positions.shape, dim] as transformers' rotary embedding makes them
    (fp32 inv_freq and angles, the frequencies twice), cast to dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
