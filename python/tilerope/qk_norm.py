"""Qwen3's per-head RMSNorm of q and k (q_norm, k_norm) fused with RoPE: one pass, with autograd
for q, k and both weights."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C
from ._ops import as_bshd, check_same_shape, direct, dl, new_like, readable, token_rows

__all__ = ["qk_norm_rope"]

_ROUNDINGS = ("fp32_once", "hf_qwen3")


def _views(q, k, cos, sin, unsqueeze_dim):
    q4, k4 = as_bshd(q, unsqueeze_dim, "q"), as_bshd(k, unsqueeze_dim, "k")
    check_same_shape(cos, sin, "cos and sin")
    b, s = q4.shape[0], q4.shape[1]
    return q4, k4, token_rows(cos, b, s, "cos"), token_rows(sin, b, s, "sin")


def _forward(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor, sin: Tensor,
             eps: float, unsqueeze_dim: int, rounding: str) -> list[Tensor]:
    q4, k4, c, s = _views(q, k, cos, sin, unsqueeze_dim)
    q_out, k_out = new_like(q), new_like(k)
    _C.qk_norm_rope(
        "neox", dl(q4), dl(k4), dl(as_bshd(q_out, unsqueeze_dim, "q_out")),
        dl(as_bshd(k_out, unsqueeze_dim, "k_out")), _C.angles.rows(dl(c), dl(s)), dl(q_weight),
        dl(k_weight), eps, rounding, cos.shape[-1])
    return [q_out, k_out]


_op = torch.library.custom_op(
    "tilerope::qk_norm_rope",
    _forward,
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, "
    "float eps, int unsqueeze_dim, str rounding) -> Tensor[]",
)


@_op.register_fake
def _(q, k, q_weight, k_weight, cos, sin, eps, unsqueeze_dim, rounding):
    _views(q, k, cos, sin, unsqueeze_dim)
    return [torch.empty_like(q), torch.empty_like(k)]


def _backward(q: Tensor, k: Tensor, dq_out: Tensor, dk_out: Tensor, q_weight: Tensor,
              k_weight: Tensor, cos: Tensor, sin: Tensor, eps: float,
              unsqueeze_dim: int) -> list[Tensor]:
    q4, k4, c, s = _views(q, k, cos, sin, unsqueeze_dim)
    dq, dk = new_like(q), new_like(k)
    dq_weight = torch.empty(q_weight.shape, dtype=torch.float32)
    dk_weight = torch.empty(k_weight.shape, dtype=torch.float32)
    bshd = lambda t, name: dl(as_bshd(t, unsqueeze_dim, name))  # noqa: E731
    _C.qk_norm_rope_backward(
        "neox", dl(q4), dl(k4), bshd(dq_out, "dq_out"), bshd(dk_out, "dk_out"), bshd(dq, "dq"),
        bshd(dk, "dk"), dl(dq_weight), dl(dk_weight), _C.angles.rows(dl(c), dl(s)),
        dl(q_weight), dl(k_weight), eps, cos.shape[-1])
    return [dq, dk, dq_weight, dk_weight]


_backward_op = torch.library.custom_op(
    "tilerope::qk_norm_rope_backward",
    _backward,
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor dq_out, Tensor dk_out, Tensor q_weight, Tensor k_weight, "
    "Tensor cos, Tensor sin, float eps, int unsqueeze_dim) -> Tensor[]",
)


@_backward_op.register_fake
def _(q, k, dq_out, dk_out, q_weight, k_weight, cos, sin, eps, unsqueeze_dim):
    _views(q, k, cos, sin, unsqueeze_dim)
    return [torch.empty_like(q), torch.empty_like(k),
            q_weight.new_empty(q_weight.shape, dtype=torch.float32),
            k_weight.new_empty(k_weight.shape, dtype=torch.float32)]


def _setup_context(ctx, inputs, output):
    q, k, q_weight, k_weight, cos, sin, eps, unsqueeze_dim, _ = inputs
    if cos.requires_grad or sin.requires_grad:
        raise ValueError("tilerope.qk_norm_rope: cos and sin take no gradient; detach them")
    ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin)
    ctx.eps, ctx.unsqueeze_dim = eps, unsqueeze_dim


def _autograd(ctx, grads):
    q, k, q_weight, k_weight, cos, sin = ctx.saved_tensors
    dq, dk, dqw, dkw = _backward_op(q, k, readable(grads[0]), readable(grads[1]), q_weight,
                                    k_weight, cos, sin, ctx.eps, ctx.unsqueeze_dim)
    return dq, dk, dqw.to(q_weight.dtype), dkw.to(k_weight.dtype), None, None, None, None, None


_op.register_autograd(_autograd, setup_context=_setup_context)


def qk_norm_rope(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    cos: Tensor,
    sin: Tensor,
    eps: float = 1e-6,
    unsqueeze_dim: int = 1,
    *,
    rounding: str = "fp32_once",
) -> tuple[Tensor, Tensor]:
    """Qwen3's ``q_norm``/``k_norm`` (RMSNorm over each head, times its weight) then
    :func:`apply_rotary_pos_emb`, in one pass over q and k:

        h = x * rsqrt(mean(x^2) + eps) * weight;    y = h * cos + rotate_half(h) * sin

    q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` (``unsqueeze_dim=1``) or ``[B, S, H, D]`` (``2``);
    weights ``[D]``; cos and sin ``[B, S, D]`` (B may be 1) or ``[S, D]``. ``rounding``:
    ``"fp32_once"`` computes in fp32 and rounds once; ``"hf_qwen3"`` rounds where transformers'
    Qwen3 does in q's dtype (normalised x, times weight, both products, their sum). Both have
    the gradient of the fp32 computation (q, k and both weights). Returns new ``(q, k)``.
    """
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding ({rounding!r}) must be one of {', '.join(_ROUNDINGS)}")
    args = (q, k, q_weight, k_weight, cos, sin, float(eps), unsqueeze_dim, rounding)
    q_out, k_out = (_forward if direct(args) else _op)(*args)
    return q_out, k_out
