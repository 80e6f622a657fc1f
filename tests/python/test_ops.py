"""Every op through torch.library.opcheck, and torch.compile(fullgraph=True) of an attention
block that calls them (forward and backward), against eager."""

import pytest
import torch
import torch.nn.functional as F
from conftest import hf_cos_sin, randn

import tilerope

OPS = torch.ops.tilerope


def rows_args(gen, dtype=torch.float32):
    q = randn(2, 3, 5, 32, dtype=dtype, gen=gen).requires_grad_()
    k = randn(2, 1, 5, 32, dtype=dtype, gen=gen).requires_grad_()
    cos, sin = hf_cos_sin(torch.arange(5)[None], 32, dtype=dtype)
    return q, k, cos, sin


def samples(gen):
    """(op, args) for every op of the tilerope namespace."""
    q, k, cos, sin = rows_args(gen)
    pos3 = torch.randint(0, 9, (3, 2, 5), generator=gen)
    pc, ps = hf_cos_sin(pos3, 32)
    vq, vk = randn(7, 2, 16, gen=gen).requires_grad_(), randn(7, 2, 16, gen=gen).requires_grad_()
    vc, vs = hf_cos_sin(torch.arange(7), 16)
    x = randn(2, 3, 4, 64, gen=gen).requires_grad_()
    ic, is_ = randn(2, 1, 4, 64, gen=gen), randn(2, 1, 4, 64, gen=gen)
    inv, _ = tilerope.rope_parameters({"head_dim": 32})
    cache = tilerope.cos_sin_cache(inv, 16)
    pos = torch.randint(0, 16, (6,), generator=gen)
    mpos = torch.randint(0, 16, (3, 6), generator=gen)
    tq, tk = randn(6, 3 * 32, gen=gen).requires_grad_(), randn(6, 32, gen=gen).requires_grad_()
    wq, wk = (1 + 0.1 * randn(32, gen=gen)).requires_grad_(), (1 + 0.1 * randn(32, gen=gen))
    bq, bk = q.detach().transpose(1, 2).contiguous(), k.detach().transpose(1, 2).contiguous()
    rows = [(OPS.apply_rotary_pos_emb, (q, k, cos, sin, 1)),
            (OPS.apply_rotary_pos_emb, (bq, bk, cos, sin, 2)),
            (OPS.apply_rotary_pos_emb_vision, (vq, vk, vc, vs)),
            (OPS.apply_multimodal_rotary_pos_emb, (q, k, pc, ps, [4, 6, 6], 1, False)),
            (OPS.apply_multimodal_rotary_pos_emb, (q, k, pc, ps, [6, 5, 5], 1, True)),
            (OPS.interleave_rope, (x, ic, is_)),
            (OPS.apply_rope_with_cos_sin_cache, (pos, tq, tk, 32, cache, True, None, False)),
            (OPS.apply_rope_with_cos_sin_cache, (pos, tq, None, 32, cache, False, None, False)),
            (OPS.apply_rope_with_cos_sin_cache, (mpos, tq, tk, 32, cache, True, [4, 6, 6], True)),
            (OPS.qk_norm_rope, (q, k, wq, wk, cos, sin, 1e-6, 1, "fp32_once")),
            (OPS.qk_norm_rope, (q, k, wq, wk, cos, sin, 1e-6, 1, "hf_qwen3"))]
    backward = [(getattr(OPS, op._qualified_op_name.split("::")[1] + "_backward"), args)
                for op, args in rows if op is not OPS.qk_norm_rope]
    detached = lambda a: tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in a)  # noqa
    inplace = [(OPS.apply_rope_with_cos_sin_cache_inplace,
                (pos, tq.detach().clone(), tk.detach().clone(), 32, cache, True, None, False)),
               (OPS.qk_norm_rope_backward,
                detached((q, k, q, k, wq, wk, cos, sin, 1e-6, 1)))]
    return rows + [(op, detached(a)) for op, a in backward] + inplace


def test_every_op_is_sampled():
    names = {n for n in dir(OPS) if not n.startswith("_") and n not in ("name", "_dir")}
    sampled = {op._qualified_op_name.split("::")[1]
               for op, _ in samples(torch.Generator().manual_seed(0))}
    registered = {n for n in names if isinstance(getattr(OPS, n), torch._ops.OpOverloadPacket)}
    assert registered == sampled


@pytest.mark.parametrize("index", range(len(samples(torch.Generator().manual_seed(0)))))
def test_opcheck(index):
    op, args = samples(torch.Generator().manual_seed(0))[index]
    torch.library.opcheck(op, args)


class Attention(torch.nn.Module):
    """A small GQA attention block with Qwen3's q_norm/k_norm, RoPE by tilerope."""

    def __init__(self, hidden=64, heads=4, kv_heads=2, head_dim=16, fused=False):
        super().__init__()
        self.h, self.kv, self.d, self.fused = heads, kv_heads, head_dim, fused
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = torch.nn.Parameter(1 + 0.1 * torch.randn(head_dim))
        self.k_norm = torch.nn.Parameter(1 + 0.1 * torch.randn(head_dim))

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.h + 2 * self.kv, self.d)
        q = qkv[:, :, : self.h].transpose(1, 2)
        k = qkv[:, :, self.h : self.h + self.kv].transpose(1, 2)
        v = qkv[:, :, self.h + self.kv :].transpose(1, 2)
        if self.fused:
            q, k = tilerope.qk_norm_rope(q, k, self.q_norm, self.k_norm, cos, sin)
        else:
            q, k = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("fused", [False, True], ids=["rope", "qk_norm_rope"])
def test_compile_fullgraph_matches_eager(fused):
    torch.manual_seed(0)
    block = Attention(fused=fused)
    x = torch.randn(2, 9, 64)
    cos, sin = hf_cos_sin(torch.arange(9)[None], 16)
    compiled = torch.compile(block, fullgraph=True)

    eager = block(x, cos, sin)
    eager.square().sum().backward()
    eager_grads = [p.grad for p in block.parameters()]
    block.zero_grad(set_to_none=True)

    got = compiled(x, cos, sin)
    got.square().sum().backward()
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-6)
    for p, g in zip(block.parameters(), eager_grads):
        assert (p.grad is None) == (g is None)  # the unfused block leaves its norms unused
        if g is not None:
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
