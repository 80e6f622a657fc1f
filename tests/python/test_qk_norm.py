"""qk_norm_rope against transformers' Qwen3RMSNorm followed by its apply_rotary_pos_emb."""

import pytest
import torch
from conftest import DTYPES, assert_golden, hf_cos_sin, randn, rotate_half
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb as hf_apply

import tilerope


def hf_qwen3(q_bshd, k_bshd, wq, wk, cos, sin, eps):
    """Qwen3Attention's lines: norm on [B, S, H, D], transpose, RoPE."""
    qn, kn = Qwen3RMSNorm(wq.shape[0], eps), Qwen3RMSNorm(wk.shape[0], eps)
    del qn.weight, kn.weight  # the weights given, gradients and all
    qn.weight, kn.weight = wq, wk
    return hf_apply(qn(q_bshd).transpose(1, 2), kn(k_bshd).transpose(1, 2), cos, sin)


def golden(x_bhsd, w, cos, sin, eps):
    x = x_bhsd.double()
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    c, s = cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    return h * c + rotate_half(h) * s


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("b,s,hq,hk,d", [(1, 7, 16, 8, 128), (2, 1, 4, 2, 128), (1, 32, 2, 1, 64)])
def test_matches_transformers_qwen3(b, s, hq, hk, d, dtype, gen):
    eps = 1e-6
    qkv = randn(b, s, hq + 2 * hk, d, dtype=dtype, gen=gen)
    q, k = qkv[:, :, :hq], qkv[:, :, hq : hq + hk]  # [B, S, H, D] views, as the projections
    wq = (1 + 0.1 * randn(d, gen=gen)).to(dtype)
    wk = (1 + 0.1 * randn(d, gen=gen)).to(dtype)
    cos, sin = hf_cos_sin(torch.randint(0, 40960, (b, s), generator=gen), d, 1e6, dtype)

    with torch.no_grad():
        hf_q, hf_k = hf_qwen3(q, k, wq, wk, cos, sin, eps)
    for rounding in ("fp32_once", "hf_qwen3"):
        got_q, got_k = tilerope.qk_norm_rope(q.transpose(1, 2), k.transpose(1, 2), wq, wk, cos,
                                             sin, eps, rounding=rounding)
        for got, theirs, x, w in ((got_q, hf_q, q, wq), (got_k, hf_k, k, wk)):
            assert got.dtype == dtype and got.shape == theirs.shape
            if rounding == "fp32_once":
                assert_golden(got, golden(x.transpose(1, 2), w, cos, sin, eps), dtype)
            else:
                # The same roundings as transformers; only the order of the fp32 sum of squares
                # differs (qk_norm_rope.h): at most a few ulp, where x*cos and
                # rotate_half(x)*sin nearly cancel more.
                ulp = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
                h = golden(x.transpose(1, 2), w, torch.ones_like(cos), torch.zeros_like(sin), eps)
                torch.testing.assert_close(got.double(), theirs.double(), rtol=0,
                                           atol=4 * ulp * h.abs().max().item())


def test_gradients_match_autograd_through_transformers(gen):
    b, s, hq, hk, d, eps = 2, 5, 4, 2, 64, 1e-6
    q, k = randn(b, s, hq, d, gen=gen), randn(b, s, hk, d, gen=gen)
    wq, wk = 1 + 0.1 * randn(d, gen=gen), 1 + 0.1 * randn(d, gen=gen)
    cos, sin = hf_cos_sin(torch.arange(s)[None] * 5, d, 1e6)
    gq, gk = randn(b, hq, s, d, gen=gen), randn(b, hk, s, d, gen=gen)

    def grads(f, dtype):
        xs = [t.to(dtype).detach().requires_grad_() for t in (q, k, wq, wk)]
        oq, ok = f(*xs, cos.to(dtype), sin.to(dtype))
        ((oq * gq.to(dtype)).sum() + (ok * gk.to(dtype)).sum()).backward()
        return [x.grad for x in xs]

    want = grads(lambda q, k, wq, wk, c, s: hf_qwen3(q, k, wq, wk, c, s, eps), torch.float64)
    got = grads(lambda q, k, wq, wk, c, s: tilerope.qk_norm_rope(
        q.transpose(1, 2), k.transpose(1, 2), wq, wk, c, s, eps), torch.float32)
    for g, w, name in zip(got, want, ("dq", "dk", "dq_weight", "dk_weight")):
        # fp32 gradients of an fp64 reference; the weight gradients sum over 10 or 20 rows
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5 * w.abs().max().item(),
                                   msg=name)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_gradcheck_in_float32(gen):
    """gradcheck's finite differences in float32 (the op takes no float64): second-order
    terms over eps 1e-2 and fp32 rounding over eps bound the error at about 1e-2."""
    q, k = randn(1, 2, 3, 16, gen=gen), randn(1, 1, 3, 16, gen=gen)
    wq, wk = 1 + 0.1 * randn(16, gen=gen), 1 + 0.1 * randn(16, gen=gen)
    cos, sin = hf_cos_sin(torch.arange(3)[None], 16)
    f = lambda *a: tilerope.qk_norm_rope(*a, cos, sin)  # noqa: E731
    inputs = tuple(t.requires_grad_() for t in (q, k, wq, wk))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-2, atol=2e-2, rtol=2e-2)
