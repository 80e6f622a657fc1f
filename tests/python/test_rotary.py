"""The transformers drop-ins against transformers' own functions and an fp64 golden."""

import pytest
import torch
from conftest import (
    DTYPES,
    assert_golden,
    assert_parity,
    assert_within_ulp,
    hf_cos_sin,
    randn,
    rotate_half,
)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLTextConfig, Qwen2VLRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import (
    Qwen3VLTextConfig,
    Qwen3VLTextRotaryEmbedding,
)

import tilerope

hf_apply_vision = modeling_qwen2_vl.apply_rotary_pos_emb_vision


def make_qk(layout, b, hq, hk, s, d, dtype, gen):
    """q [B, Hq, S, D] and k [B, Hk, S, D] (BSHD for layout "bshd") in the layout named."""
    if layout == "packed":  # views of one [B, S, Hq + 2 Hk, D] projection, as HF's attention
        qkv = randn(b, s, hq + 2 * hk, d, dtype=dtype, gen=gen)
        return qkv[:, :, :hq].transpose(1, 2), qkv[:, :, hq : hq + hk].transpose(1, 2)
    if layout == "bshd":
        return randn(b, s, hq, d, dtype=dtype, gen=gen), randn(b, s, hk, d, dtype=dtype, gen=gen)
    return randn(b, hq, s, d, dtype=dtype, gen=gen), randn(b, hk, s, d, dtype=dtype, gen=gen)


def golden_rows(x, cos, sin, unsqueeze_dim):
    """x * cos + rotate_half(x) * sin in fp64, from the rounded inputs."""
    c, s = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    return x.double() * c + rotate_half(x.double()) * s


def terms(x, cos, sin, unsqueeze_dim):
    c, s = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    return (x.double() * c).abs() + (rotate_half(x.double()) * s).abs()


# (layout, B, Hq, Hk, S, D, cos batch): prefill, decode, GQA, head dims of the models.
CASES = [
    ("bhsd", 2, 8, 2, 33, 128, "B"),
    ("bshd", 2, 8, 2, 33, 128, "B"),
    ("packed", 2, 8, 2, 33, 128, "B"),
    ("packed", 1, 4, 4, 17, 64, 1),
    ("bhsd", 3, 6, 2, 1, 128, "B"),  # decode, one token per sequence
    ("packed", 64, 4, 1, 1, 128, "B"),  # decode, batch 64
    ("bhsd", 1, 2, 1, 9, 80, 1),
    ("bshd", 2, 3, 3, 5, 256, 1),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_apply_rotary_pos_emb_matches_transformers(case, dtype, gen):
    layout, b, hq, hk, s, d, cos_batch = case
    q, k = make_qk(layout, b, hq, hk, s, d, dtype, gen)
    u = 2 if layout == "bshd" else 1
    nb = b if cos_batch == "B" else 1
    positions = torch.randint(0, 4096, (nb, s), generator=gen)
    cos, sin = hf_cos_sin(positions, d, dtype=dtype)
    q_before, k_before = q.clone(), k.clone()

    got_q, got_k = tilerope.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=u)
    hf_q, hf_k = hf_apply(q, k, cos, sin, unsqueeze_dim=u)

    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs written"
    assert got_q.stride() == torch.empty_like(q).stride()
    for got, theirs, x, name in ((got_q, hf_q, q, "q"), (got_k, hf_k, k, "k")):
        assert_parity(got, theirs, terms(x, cos, sin, u), dtype, name)
        assert_golden(got, golden_rows(x, cos, sin, u), dtype, name)


def test_apply_rotary_pos_emb_takes_shared_rows_and_promotes_like_torch(gen):
    q, k = make_qk("bhsd", 2, 4, 2, 7, 64, torch.bfloat16, gen)
    cos, sin = hf_cos_sin(torch.arange(7), 64)  # [S, D] float32: HF's math would promote
    got_q, got_k = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
    want_q = q.float() * cos + rotate_half(q.float()) * sin
    assert got_q.dtype == torch.float32 and got_k.dtype == torch.float32
    assert_golden(got_q, want_q.double(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_partial_rotary_as_models_slice_it(dtype, gen):
    """Partial rotary (Phi, GLM, Qwen3.5): models rotate q[..., :rd] and keep the rest; a cos
    of width rd < D does both in one call."""
    b, hq, hk, s, d, rd = 2, 4, 2, 9, 128, 32
    q, k = make_qk("packed", b, hq, hk, s, d, dtype, gen)
    cos, sin = hf_cos_sin(torch.arange(100, 100 + s)[None], rd, dtype=dtype)
    got_q, got_k = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
    rot_q, rot_k = hf_apply(q[..., :rd], k[..., :rd], cos, sin)
    for got, rot, x in ((got_q, rot_q, q), (got_k, rot_k, k)):
        assert torch.equal(got[..., rd:], x[..., rd:])
        assert_parity(got[..., :rd], rot, terms(x[..., :rd], cos, sin, 1), dtype)


def test_apply_rotary_pos_emb_gradients_match_autograd_through_transformers(gen):
    q, k = make_qk("packed", 2, 4, 2, 11, 64, torch.float32, gen)
    cos, sin = hf_cos_sin(torch.arange(11)[None] * 37, 64)
    gq, gk = randn(*q.shape, gen=gen), randn(*k.shape, gen=gen)

    def grads(f, dtype):
        qq = q.to(dtype).detach().requires_grad_()
        kk = k.to(dtype).detach().requires_grad_()
        oq, ok = f(qq, kk, cos.to(dtype), sin.to(dtype))
        ((oq * gq.to(dtype)).sum() + (ok * gk.to(dtype)).sum()).backward()
        return qq.grad, kk.grad

    want = grads(hf_apply, torch.float64)  # autograd through transformers' function, fp64
    for dtype in DTYPES:
        got = grads(tilerope.apply_rotary_pos_emb, dtype)
        for g, w in zip(got, want):
            assert g.dtype == dtype
            # the gradient is the inverse rotation of g, rounded once: the tolerance table
            # of g rounded to dtype (the test rounds g itself first)
            assert_golden(g, w, dtype, f"grad {dtype}")


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_gradcheck_in_float32(gen):
    """gradcheck's finite differences in float32 (the op takes no float64): the op is linear in
    q and k, so the only error is fp32 rounding over eps: 1e-3 with eps 1e-2."""
    q, k = make_qk("bhsd", 1, 2, 1, 3, 16, torch.float32, gen)
    cos, sin = hf_cos_sin(torch.arange(3)[None], 16)
    f = lambda q, k: tilerope.apply_rotary_pos_emb(q, k, cos, sin)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q.requires_grad_(), k.requires_grad_()), eps=1e-2,
                                    atol=1e-3, rtol=1e-3)


# --- vision -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("s,hq,hk,d", [(31, 16, 16, 128), (64, 4, 4, 80), (1, 2, 2, 64)])
def test_apply_rotary_pos_emb_vision_matches_transformers(s, hq, hk, d, dtype, gen):
    qkv = randn(s, 3, hq, d, dtype=dtype, gen=gen)  # the tower's qkv, split as it splits it
    q, k = qkv[:, 0], qkv[:, 1]
    grid = torch.stack(torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij"), -1)
    hw = grid.reshape(-1, 2)[:s]
    inv = 1.0 / (10000 ** (torch.arange(0, d // 2, 2).float() / (d // 2)))
    freqs = torch.cat((hw[:, :1] * inv, hw[:, 1:] * inv), -1).float()
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos(), emb.sin()  # [S, D] float32, as the tower passes them

    got_q, got_k = tilerope.apply_rotary_pos_emb_vision(q, k, cos, sin)
    hf_q, hf_k = hf_apply_vision(q, k, cos, sin)
    for got, theirs, x in ((got_q, hf_q, q), (got_k, hf_k, k)):
        assert got.dtype == dtype
        golden = x.double() * cos.double()[:, None] + rotate_half(x.double()) * sin.double()[:, None]
        assert_golden(got, golden, dtype)
        if dtype == torch.float32:  # the same fp32 arithmetic, rounded in another order
            terms = (x.double() * cos.double()[:, None]).abs() + (
                rotate_half(x.double()) * sin.double()[:, None]).abs()
            assert_parity(got, theirs, terms, dtype)
        else:
            assert_within_ulp(got, theirs)  # both round fp32 results once


# --- MRoPE ------------------------------------------------------------------------------------


def mrope_positions(b, s, gen):
    """[3, B, S] positions: text runs (all axes equal) around an image block."""
    t = torch.arange(s).expand(3, b, s).clone()
    t[1, :, 3:9] = torch.randint(0, 40, (b, 6), generator=gen)
    t[2, :, 3:9] = torch.randint(0, 40, (b, 6), generator=gen)
    return t


@pytest.mark.parametrize("interleaved", [False, True], ids=["chunked", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multimodal_matches_transformers_rotary_embedding(interleaved, dtype, gen):
    """transformers' Qwen2-VL (chunked) and Qwen3-VL (interleaved) rotary embeddings mix the
    sections into cos/sin; applying their output with transformers' apply_rotary_pos_emb is the
    reference for the planes-and-sections form."""
    b, hq, hk, s, d = 2, 8, 2, 16, 128
    section = [24, 20, 20] if interleaved else [16, 24, 24]
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": section}
    if interleaved:
        cfg = Qwen3VLTextConfig(hidden_size=1024, num_attention_heads=8, head_dim=d,
                                rope_parameters={**rope, "mrope_interleaved": True})
        rotary = Qwen3VLTextRotaryEmbedding(cfg)
    else:
        cfg = Qwen2VLTextConfig(hidden_size=1024, num_attention_heads=8, rope_parameters=rope)
        rotary = Qwen2VLRotaryEmbedding(cfg)
    pos = mrope_positions(b, s, gen)
    q, k = make_qk("packed", b, hq, hk, s, d, dtype, gen)
    mixed_cos, mixed_sin = rotary(q, pos)  # [B, S, D] in q's dtype
    planes_cos, planes_sin = hf_cos_sin(pos, d, theta=1e6, dtype=dtype)  # [3, B, S, D]

    got_q, got_k = tilerope.apply_multimodal_rotary_pos_emb(
        q, k, planes_cos, planes_sin, section, mrope_interleaved=interleaved)
    hf_q, hf_k = hf_apply(q, k, mixed_cos, mixed_sin)
    for got, theirs, x in ((got_q, hf_q, q), (got_k, hf_k, k)):
        assert_parity(got, theirs, terms(x, mixed_cos, mixed_sin, 1), dtype)
        assert_golden(got, golden_rows(x, mixed_cos, mixed_sin, 1), dtype)


def test_multimodal_gradients(gen):
    b, h, s, d = 1, 2, 10, 64
    section = [8, 12, 12]
    pos = mrope_positions(b, s, gen)
    cos, sin = hf_cos_sin(pos, d)
    # the 4.x formula: chunks of mrope_section * 2 over the full width, chunk i from plane i % 3
    mix = lambda t: torch.cat([c[i % 3] for i, c in enumerate(t.split(section * 2, -1))], -1)  # noqa
    q, k = make_qk("bhsd", b, h, h, s, d, torch.float32, gen)
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    out = tilerope.apply_multimodal_rotary_pos_emb(q1, k1, cos, sin, section)
    ref = hf_apply(q2, k2, mix(cos), mix(sin))
    g = [randn(*o.shape, gen=gen) for o in out]
    sum((o * w).sum() for o, w in zip(out, g)).backward()
    sum((o * w).sum() for o, w in zip(ref, g)).backward()
    torch.testing.assert_close(q1.grad, q2.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k1.grad, k2.grad, atol=1e-5, rtol=1e-5)


# --- interleave_rope --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,cos_s", [((1, 1, 64, 64), "S"), ((2, 8, 16, 64), 1),
                                         ((2, 3, 5, 128), "S")])
def test_interleave_rope_is_the_npu_formula(shape, cos_s, dtype, gen):
    b, n, s, d = shape
    x = randn(*shape, dtype=dtype, gen=gen)
    cs = s if cos_s == "S" else 1
    cos = randn(b, 1, cs, d, dtype=dtype, gen=gen).clamp(-1, 1)
    sin = randn(b, 1, cs, d, dtype=dtype, gen=gen).clamp(-1, 1)
    got = tilerope.interleave_rope(x, cos, sin)
    r = d // 2
    e, o = x.double()[..., 0::2], x.double()[..., 1::2]
    c, sn = cos.double(), sin.double()
    golden = torch.cat((e * c[..., :r] - o * sn[..., :r], o * c[..., r:] + e * sn[..., r:]), -1)
    assert got.dtype == dtype
    assert_golden(got, golden, dtype)
    # its gradient is the transpose: read back through autograd of the fp64 formula
    xg = x.double().requires_grad_()
    e, o = xg[..., 0::2], xg[..., 1::2]
    y = torch.cat((e * c[..., :r] - o * sn[..., :r], o * c[..., r:] + e * sn[..., r:]), -1)
    g = randn(*shape, gen=gen)
    (y * g.double()).sum().backward()
    xt = x.float().requires_grad_()
    (tilerope.interleave_rope(xt, cos.float(), sin.float()) * g).sum().backward()
    assert_golden(xt.grad, xg.grad, torch.float32)


def test_vision_gradients_match_autograd_through_transformers(gen):
    s, h, d = 16, 2, 64
    q, k = randn(s, h, d, gen=gen), randn(s, h, d, gen=gen)
    cos, sin = hf_cos_sin(torch.arange(s) * 3, d)
    g = randn(s, h, d, gen=gen)

    def grads(f, dtype):
        qq = q.to(dtype).detach().requires_grad_()
        kk = k.to(dtype).detach().requires_grad_()
        oq, ok = f(qq, kk, cos, sin)
        ((oq * g.to(dtype)).sum() + (ok * g.to(dtype)).sum()).backward()
        return qq.grad, kk.grad

    want = grads(hf_apply_vision, torch.float64)
    for dtype in DTYPES:
        for got, w in zip(grads(tilerope.apply_rotary_pos_emb_vision, dtype), want):
            assert got.dtype == dtype
            assert_golden(got, w, dtype)


@pytest.mark.parametrize("target", tilerope.supported_cpu_targets())
def test_every_simd_target(target, gen):
    """The drop-ins on each SIMD target this CPU runs (the kernels are one source compiled per
    target), against the golden, bfloat16 packed views with a partial rotary width."""
    q, k = make_qk("packed", 2, 4, 2, 19, 96, torch.bfloat16, gen)
    cos, sin = hf_cos_sin(torch.randint(0, 9999, (2, 19), generator=gen), 64, dtype=torch.bfloat16)
    w = (1 + 0.1 * randn(96, gen=gen)).bfloat16()
    try:
        tilerope.set_cpu_target(target)
        got_q, got_k = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        norm_q, _ = tilerope.qk_norm_rope(q[..., :64], k[..., :64], w[:64], w[:64], cos, sin)
    finally:
        tilerope.set_cpu_target("best")
    for got, x in ((got_q, q), (got_k, k)):
        assert torch.equal(got[..., 64:], x[..., 64:])
        assert_golden(got[..., :64], golden_rows(x[..., :64], cos, sin, 1), torch.bfloat16)
    x = q[..., :64].double()
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w[:64].double()
    assert_golden(norm_q, golden_rows(h, cos, sin, 1), torch.bfloat16)
