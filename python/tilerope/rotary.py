"""Drop-ins for transformers' RoPE functions, and the NPU's interleaved RoPE.

Each function has the name, arguments, defaults and return values of the one it replaces, and
runs one tilerope kernel over q and k together: fp32 arithmetic, rounded once to the output
dtype. Each is the torch.library op of the same name in the ``tilerope`` namespace.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from . import _C
from ._ops import Rotation, as_bshd, check_same_shape, dl, mrope_axes, rotation_op, token_rows

__all__ = [
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_vision",
    "apply_multimodal_rotary_pos_emb",
    "interleave_rope",
]


def _common_dtype(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """q and k in the dtype torch's promotion gives `q * cos + rotate_half(q) * sin`."""
    dt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.promote_types(cos.dtype, sin.dtype))
    return (q if q.dtype == dt else q.to(dt)), (k if k.dtype == dt else k.to(dt))


def _rows_of(cos: Tensor, sin: Tensor, axes: Sequence[int] = ()):
    return lambda: _C.angles.rows(dl(cos), dl(sin), list(axes))


# --- apply_rotary_pos_emb --------------------------------------------------------------------


def _plan_hf(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int) -> Rotation:
    q4, k4 = as_bshd(q, unsqueeze_dim, "q"), as_bshd(k, unsqueeze_dim, "k")
    check_same_shape(cos, sin, "cos and sin")
    b, s = q4.shape[0], q4.shape[1]
    c, n = token_rows(cos, b, s, "cos"), token_rows(sin, b, s, "sin")
    return Rotation("neox", q4, k4, _rows_of(c, n), cos.shape[-1],
                    lambda t: as_bshd(t, unsqueeze_dim, "output"))


_apply_rotary_pos_emb = rotation_op(
    "apply_rotary_pos_emb",
    "(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim) -> Tensor[]",
    _plan_hf, q_arg=0, k_arg=1)


def apply_rotary_pos_emb(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """transformers' ``apply_rotary_pos_emb`` (Llama, Mistral, Qwen2, Qwen3, Qwen2-VL and
    Qwen3-VL text attention): ``q * cos + rotate_half(q) * sin``, and the same for k.

    q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` (``unsqueeze_dim=1``), or ``[B, S, H, D]``
    (``unsqueeze_dim=2``), any strides with the last dim contiguous; cos and sin ``[B, S, w]``
    (B may be 1) or ``[S, w]``, with ``w = D`` (a narrower ``w`` rotates the first ``w`` dims and
    passes the rest through). Returns new tensors ``(q_embed, k_embed)`` shaped and strided as
    q and k, in the dtype torch's promotion of q, k, cos and sin gives.
    """
    q, k = _common_dtype(q, k, cos, sin)
    q_embed, k_embed = _apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    return q_embed, k_embed


# --- apply_rotary_pos_emb_vision -------------------------------------------------------------


def _plan_vision(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> Rotation:
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be [S, H, D]; got shape {tuple(x.shape)}")
    check_same_shape(cos, sin, "cos and sin")
    if cos.dim() != 2:
        raise ValueError(f"cos must be [S, D]; got shape {tuple(cos.shape)}")
    return Rotation("neox", q, k, _rows_of(cos, sin), cos.shape[-1], lambda t: t)


_apply_rotary_pos_emb_vision = rotation_op(
    "apply_rotary_pos_emb_vision",
    "(Tensor q, Tensor k, Tensor cos, Tensor sin) -> Tensor[]",
    _plan_vision, q_arg=0, k_arg=1)


def apply_rotary_pos_emb_vision(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """The Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision tower's ``apply_rotary_pos_emb_vision``.

    q ``[S, Hq, D]``, k ``[S, Hk, D]``; cos and sin ``[S, D]`` (any float dtype, as the tower's
    float32 ones). Computed in fp32; returns ``(q_embed, k_embed)`` in q's and k's dtypes.
    """
    if q.dtype != k.dtype:
        raise TypeError(f"q ({q.dtype}) and k ({k.dtype}) must have the same dtype")
    q_embed, k_embed = _apply_rotary_pos_emb_vision(q, k, cos, sin)
    return q_embed, k_embed


# --- apply_multimodal_rotary_pos_emb ---------------------------------------------------------


def _plan_mrope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, mrope_section: list[int],
                unsqueeze_dim: int, mrope_interleaved: bool) -> Rotation:
    q4, k4 = as_bshd(q, unsqueeze_dim, "q"), as_bshd(k, unsqueeze_dim, "k")
    check_same_shape(cos, sin, "cos and sin")
    b, s = q4.shape[0], q4.shape[1]
    c, n = token_rows(cos, b, s, "cos", planes=3), token_rows(sin, b, s, "sin", planes=3)
    axes = mrope_axes(mrope_section, mrope_interleaved, cos.shape[-1])
    return Rotation("neox", q4, k4, _rows_of(c, n, axes), cos.shape[-1],
                    lambda t: as_bshd(t, unsqueeze_dim, "output"))


_apply_multimodal_rotary_pos_emb = rotation_op(
    "apply_multimodal_rotary_pos_emb",
    "(Tensor q, Tensor k, Tensor cos, Tensor sin, int[] mrope_section, int unsqueeze_dim, "
    "bool mrope_interleaved) -> Tensor[]",
    _plan_mrope, q_arg=0, k_arg=1)


def apply_multimodal_rotary_pos_emb(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    mrope_section: Sequence[int],
    unsqueeze_dim: int = 1,
    *,
    mrope_interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """MRoPE (Qwen2-VL, Qwen2.5-VL; Qwen3-VL with ``mrope_interleaved=True``) in the form
    transformers 4.x and Liger take: cos and sin are planes ``[3, B, S, D]`` (temporal, height,
    width positions; B may be 1) and ``mrope_section`` (3 entries summing to D/2) says which
    plane each frequency reads: chunked ``[T..T H..H W..W]``, or interleaved ``T H W T H W ...``.
    q and k as in :func:`apply_rotary_pos_emb`. Returns new ``(q_embed, k_embed)``.
    """
    q, k = _common_dtype(q, k, cos, sin)
    q_embed, k_embed = _apply_multimodal_rotary_pos_emb(
        q, k, cos, sin, [int(s) for s in mrope_section], unsqueeze_dim, mrope_interleaved)
    return q_embed, k_embed


# --- interleave_rope -------------------------------------------------------------------------


def _plan_interleave(x: Tensor, cos: Tensor, sin: Tensor) -> Rotation:
    if x.dim() != 4:
        raise ValueError(f"x must be [B, N, S, D]; got shape {tuple(x.shape)}")
    check_same_shape(cos, sin, "cos and sin")
    b, _, s, d = x.shape
    if cos.dim() != 4 or cos.shape[1] != 1 or cos.shape[0] not in (1, b) or cos.shape[2] not in (1, s):
        raise ValueError(
            f"cos must be [B, 1, S, D] with B = {b} (or 1) and S = {s} (or 1); got shape "
            f"{tuple(cos.shape)}")
    c = cos[:, 0].expand(b, s, cos.shape[-1])  # (B, S, D)
    n = sin[:, 0].expand(b, s, sin.shape[-1])  # (B, S, D)
    return Rotation("gptj", x.transpose(1, 2), None, _rows_of(c, n), cos.shape[-1],
                    lambda t: t.transpose(1, 2), split_half=True)


_interleave_rope = rotation_op(
    "interleave_rope", "(Tensor x, Tensor cos, Tensor sin) -> Tensor[]", _plan_interleave,
    q_arg=0, k_arg=None)


def interleave_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The source material's NPU interleaved RoPE (``torch_npu.npu_interleave_rope``): adjacent
    pairs in, halves out. With ``r = D/2``, ``e = x[..., 0::2]`` and ``o = x[..., 1::2]``:

        y[..., :r] = e * cos[..., :r] - o * sin[..., :r]
        y[..., r:] = o * cos[..., r:] + e * sin[..., r:]

    x ``[B, N, S, D]``; cos and sin ``[B, 1, S, D]`` (B and S may be 1). Returns a new tensor
    shaped and strided as x. Apply it to q and k alike: both leave in the split-half layout.
    """
    return _interleave_rope(x, cos, sin)[0]
