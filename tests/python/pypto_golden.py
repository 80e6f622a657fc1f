"""fp64 goldens and inputs of the pypto tests: the source material's formulas (seed digest §4),
computed in float64 from the rounded inputs, and the case files' seeded inputs."""

import json
import pathlib

import torch

CASES_DIR = pathlib.Path(__file__).resolve().parents[1] / "cases"


def cases(file_name: str, kernel: str) -> list:
    """The cases of one kernel in tests/cases/FILE."""
    suite = json.loads((CASES_DIR / file_name).read_text())
    return [c for c in suite["cases"] if c["kernel"] == kernel]


TORCH_DTYPE = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def normal(gen: torch.Generator, shape, dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def repeated_halves(gen: torch.Generator, shape, dtype) -> torch.Tensor:
    """Random rows whose two halves are equal, as real RoPE tables are (cat(freqs, freqs))."""
    half = normal(gen, list(shape[:-1]) + [shape[-1] // 2], dtype)
    return torch.cat([half, half], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, cos, sin):
    """x * cos + rotate_half(x) * sin in float64 (cos and sin broadcast)."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    return x * cos + rotate_half(x) * sin


def mrope_tables(table: torch.Tensor, section) -> torch.Tensor:
    """[3, B, S, D] planes -> [B, S, D]: chunk i of sizes section * 2 from plane i % 3."""
    chunks = table.split(list(section) * 2, dim=-1)
    return torch.cat([c[i % 3] for i, c in enumerate(chunks)], dim=-1)


def rms_norm(x, w, eps):
    x = x.double()
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w.double()


def interleave(x, cos, sin, split_half: bool):
    """Interleaved RoPE in float64: the split-half output with half-pair tables, or the
    interleaved output with positional tables."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    xe, xo = x[..., 0::2], x[..., 1::2]
    h = x.shape[-1] // 2
    if split_half:
        return torch.cat([xe * cos[..., :h] - xo * sin[..., :h],
                          xe * sin[..., h:] + xo * cos[..., h:]], dim=-1)
    y = torch.empty(x.shape, dtype=torch.float64)
    y[..., 0::2] = xe * cos[..., 0::2] - xo * sin[..., 0::2]
    y[..., 1::2] = xo * cos[..., 1::2] + xe * sin[..., 1::2]
    return y


def assert_close(got: torch.Tensor, golden: torch.Tensor, atol: float, rtol: float, what: str):
    """|got - golden| <= atol + rtol * |golden| everywhere, shapes equal, all finite."""
    assert got.shape == golden.shape, f"{what}: shape {tuple(got.shape)} != {tuple(golden.shape)}"
    g = got.double()
    assert bool(torch.isfinite(g).all()), f"{what}: non-finite values"
    diff = (g - golden).abs()
    excess = diff - (atol + rtol * golden.abs())
    assert bool((excess <= 0).all()), (
        f"{what}: {int((excess > 0).sum())} of {got.numel()} values outside atol {atol} + rtol "
        f"{rtol}; worst |diff| {diff.max().item():.3g}")


def max_error(got: torch.Tensor, golden: torch.Tensor) -> float:
    return (got.double() - golden).abs().max().item()
