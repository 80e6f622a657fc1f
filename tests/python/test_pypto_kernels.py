"""The source material's production RoPE kernels in the pypto dialect (vision, MRoPE, Qwen3 QK
RMSNorm + RoPE, interleaved) on its case files (tests/cases/*.json): each case's shapes, dtype,
tolerance and seed, against the fp64 golden at the case's tolerance and against tilerope's
production kernel on the same inputs."""

import pytest
import torch

import tilerope
from tilerope import _C
from tilerope.pypto.examples import kernels

from pypto_golden import (
    TORCH_DTYPE,
    assert_close,
    cases,
    interleave,
    mrope_tables,
    normal,
    repeated_halves,
    rms_norm,
    rope,
)

U = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def agree(ours: torch.Tensor, production: torch.Tensor, golden: torch.Tensor, dtype, what):
    """Both round fp32 math once to the dtype: at most one rounding step apart, plus the fp32
    differences of their op orders (relative 2^-20 of the golden's terms)."""
    diff = (ours.double() - production.double()).abs()
    bound = 2 * U[dtype] * golden.abs() + 2.0**-20 * (1 + golden.abs())
    assert bool((diff <= bound).all()), (
        f"{what}: tile kernel and production differ by up to {diff.max().item():.3g}")


def ids(cs):
    return [c["name"] for c in cs]


VISION = cases("spatial_rope_newer.json", "vision")
MROPE = cases("spatial_rope_newer.json", "mrope") + cases("spatial_rope_older.json", "mrope")
QK_NORM = cases("qwen3_qk_norm_rope.json", "qk-norm-rope")
INTERLEAVE = cases("interleave_rope.json", "interleave")


@pytest.mark.parametrize("case", VISION, ids=ids(VISION))
def test_vision(case):
    dtype = TORCH_DTYPE[case["dtype"]]
    S, N, K, D = case["seq"], case["heads"], case["k_heads"], case["head_dim"]
    gen = torch.Generator().manual_seed(case["seed"])
    q, k = normal(gen, [S, N, D], dtype), normal(gen, [S, K, D], dtype)
    cos, sin = repeated_halves(gen, [S, D], dtype), repeated_halves(gen, [S, D], dtype)
    q_out, k_out = kernels.vision_rope(q, k, cos, sin)
    q_prod, k_prod = tilerope.apply_rotary_pos_emb_vision(q, k, cos, sin)
    for ours, prod, x in ((q_out, q_prod, q), (k_out, k_prod, k)):
        golden = rope(x, cos.unsqueeze(1), sin.unsqueeze(1))
        assert_close(ours, golden, case["atol"], case["rtol"], case["name"])
        agree(ours, prod, golden, dtype, case["name"])


@pytest.mark.parametrize("case", MROPE, ids=ids(MROPE))
def test_mrope(case):
    dtype = TORCH_DTYPE[case["dtype"]]
    B, S, N, K, D = case["batch"], case["seq"], case["heads"], case["k_heads"], case["head_dim"]
    section = case.get("section", [16, 24, 24])  # the case loader's default
    gen = torch.Generator().manual_seed(case["seed"])
    q, k = normal(gen, [B, N, S, D], dtype), normal(gen, [B, K, S, D], dtype)
    cos, sin = repeated_halves(gen, [3, B, S, D], dtype), repeated_halves(gen, [3, B, S, D], dtype)
    q_out, k_out = kernels.mrope(q, k, cos, sin, section)
    q_prod, k_prod = tilerope.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
    c, s = mrope_tables(cos, section).unsqueeze(1), mrope_tables(sin, section).unsqueeze(1)
    for ours, prod, x in ((q_out, q_prod, q), (k_out, k_prod, k)):
        golden = rope(x, c, s)
        assert_close(ours, golden, case["atol"], case["rtol"], case["name"])
        agree(ours, prod, golden, dtype, case["name"])


@pytest.mark.parametrize("case", QK_NORM, ids=ids(QK_NORM))
def test_qk_norm_rope(case):
    dtype = TORCH_DTYPE[case["dtype"]]
    S, N, D, eps = case["seq"], case["heads"], case["head_dim"], case["eps"]
    gen = torch.Generator().manual_seed(case["seed"])
    x, w = normal(gen, [S, N, D], dtype), normal(gen, [D], dtype)
    cos, sin = repeated_halves(gen, [S, D], dtype), repeated_halves(gen, [S, D], dtype)
    out = kernels.qk_norm_rope(x, w, cos, sin, eps)
    golden = rope(rms_norm(x, w, eps), cos.unsqueeze(1), sin.unsqueeze(1))
    assert_close(out, golden, case["atol"], case["rtol"], case["name"])
    # production: q alone ([1, S, N, D]) with the same weight and rows
    prod = tilerope.qk_norm_rope(x.unsqueeze(0), x.unsqueeze(0), w, w, cos.unsqueeze(0),
                                 sin.unsqueeze(0), eps=eps, unsqueeze_dim=2)[0][0]
    agree(out, prod, golden, dtype, case["name"])


def interleave_production(x, cos, sin, split_half: bool):
    """tilerope's production kernel: x [B, N, S, D] seen as [B, S, N, D], one table row per
    (b, s) (stride 0 over S for a single row)."""
    if split_half:
        return tilerope.interleave_rope(x, cos, sin)
    B, N, S, D = x.shape
    out = torch.empty_like(x)
    rows_cos = cos[:, 0].expand(B, S, D)
    rows_sin = sin[:, 0].expand(B, S, D)
    _C.rope("gptj", x.transpose(1, 2), None, out.transpose(1, 2), None,
            _C.angles.rows(rows_cos, rows_sin))
    return out


@pytest.mark.parametrize("case", INTERLEAVE, ids=ids(INTERLEAVE))
def test_interleave(case):
    dtype = TORCH_DTYPE[case["dtype"]]
    B, N, S, D = case["batch"], case["heads"], case["seq"], case["head_dim"]
    TS = 1 if case["table_seq1"] else S
    split = case["output"] == "split-half"
    gen = torch.Generator().manual_seed(case["seed"])
    x = normal(gen, [B, N, S, D], dtype)
    cos = normal(gen, [B, 1, TS, D], dtype).clamp(-1, 1)
    sin = normal(gen, [B, 1, TS, D], dtype).clamp(-1, 1)
    out = kernels.interleave_rope(x, cos, sin, case["output"], case["path"])
    prod = interleave_production(x, cos, sin, split)
    for b in range(B):  # the golden a batch at a time: the largest cases hold 2^28 elements
        golden = interleave(x[b], cos[b], sin[b], split)
        assert_close(out[b], golden, case["atol"], case["rtol"], f"{case['name']} batch {b}")
        agree(out[b], prod[b], golden, dtype, f"{case['name']} batch {b}")
