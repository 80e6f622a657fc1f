"""The serving engines' interface (vLLM, SGLang, FlashInfer): positions index a cos/sin cache."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from . import _C
from ._ops import Rotation, direct, dl, mrope_axes, rotation_op

__all__ = ["apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace"]

_SCHEMA_ARGS = (
    "Tensor positions, Tensor{q} query, Tensor{k}? key, int head_size, Tensor cos_sin_cache, "
    "bool is_neox, int[]? mrope_section, bool mrope_interleaved"
)


def _heads(x: Tensor, head_size: int, name: str) -> Tensor:
    """[T, H * head_size] or [T, H, head_size] as [T, H, head_size] (a view)."""
    if x.dim() == 3 and x.shape[-1] == head_size:
        return x
    if x.dim() == 2 and head_size > 0 and x.shape[-1] % head_size == 0 and x.stride(-1) == 1:
        return x.view(x.shape[0], x.shape[1] // head_size, head_size)
    raise ValueError(
        f"{name} must be [T, H * head_size] (last dim contiguous) or [T, H, head_size] with "
        f"head_size = {head_size}; got shape {tuple(x.shape)}, strides {tuple(x.stride())}"
    )


def _plan(
    positions: Tensor,
    query: Tensor,
    key: Optional[Tensor],
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool,
    mrope_section: Optional[list[int]],
    mrope_interleaved: bool,
) -> Rotation:
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[-1] % 2 != 0:
        raise ValueError(
            "cos_sin_cache must be [max_position, rotary_dim] (cos then sin, rotary_dim even); "
            f"got shape {tuple(cos_sin_cache.shape)}"
        )
    rotary_dim = cos_sin_cache.shape[-1]
    cos = cos_sin_cache[:, : rotary_dim // 2]  # (max_position, rotary_dim/2)
    sin = cos_sin_cache[:, rotary_dim // 2 :]  # (max_position, rotary_dim/2)
    axes: list[int] = []
    if mrope_section is not None:
        axes = mrope_axes(mrope_section, mrope_interleaved, rotary_dim)
        if positions.dim() != 2:
            raise ValueError(f"with mrope_section, positions must be [3, T]; got shape {tuple(positions.shape)}")
    elif positions.dim() != 1:
        raise ValueError(
            f"positions must be [T] ([3, T] takes mrope_section); got shape {tuple(positions.shape)}"
        )
    return Rotation(
        "neox" if is_neox else "gptj",
        _heads(query, head_size, "query"),
        None if key is None else _heads(key, head_size, "key"),
        lambda: _C.angles.table(dl(cos), dl(sin), dl(positions), 0, axes),
        rotary_dim,
        lambda t: _heads(t, head_size, "output"),
    )


_apply = rotation_op(
    "apply_rope_with_cos_sin_cache",
    f"({_SCHEMA_ARGS.format(q='', k='')}) -> Tensor[]",
    _plan, q_arg=1, k_arg=2)


def _rotate_inplace(*args) -> None:
    r = _plan(*args)
    _C.rope(r.style, dl(r.q), None if r.k is None else dl(r.k), None, None, r.angles(),
            r.rotary_dim)


_apply_inplace = torch.library.custom_op(
    "tilerope::apply_rope_with_cos_sin_cache_inplace",
    _rotate_inplace,
    mutates_args=("query", "key"),
    schema=f"({_SCHEMA_ARGS.format(q='(a!)', k='(b!)')}) -> ()",
)


@_apply_inplace.register_fake
def _(*args) -> None:
    _plan(*args)  # the kernel's shape errors, at trace time too


def _section(mrope_section: Optional[Sequence[int]]) -> Optional[list[int]]:
    return None if mrope_section is None else [int(s) for s in mrope_section]


def apply_rope_with_cos_sin_cache(
    positions: Tensor,
    query: Tensor,
    key: Optional[Tensor],
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    *,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> tuple[Tensor, Optional[Tensor]]:
    """FlashInfer's ``apply_rope_with_cos_sin_cache`` (vLLM's ``RotaryEmbedding.forward``).

    positions ``[T]`` int32/int64; query ``[T, Hq * head_size]`` or ``[T, Hq, head_size]``, key
    the same with its own head count, or None; ``cos_sin_cache [max_position, rotary_dim]``,
    cos in the first half, sin in the second, float32, float16 or bfloat16. Dims past
    rotary_dim pass through. ``is_neox=False`` rotates adjacent pairs (GPT-J). With
    ``mrope_section`` (vLLM's MRoPE), positions are ``[3, T]`` and frequency i reads the row of
    its axis, chunked or (``mrope_interleaved``) T H W T H W... Returns new
    ``(query_out, key_out)`` shaped as the inputs (key_out None when key is).
    """
    outs = _apply(positions, query, key, head_size, cos_sin_cache, is_neox,
                  _section(mrope_section), mrope_interleaved)
    return outs[0], (outs[1] if key is not None else None)


ArrayLike = Union[Tensor, np.ndarray]


def apply_rope_with_cos_sin_cache_inplace(
    positions: ArrayLike,
    query: ArrayLike,
    key: Optional[ArrayLike],
    head_size: int,
    cos_sin_cache: ArrayLike,
    is_neox: bool = True,
    *,
    mrope_section: Optional[Sequence[int]] = None,
    mrope_interleaved: bool = False,
) -> None:
    """:func:`apply_rope_with_cos_sin_cache` written over query and key. Takes numpy arrays as
    well as tensors (shared, not copied)."""
    args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a
            for a in (positions, query, key, head_size, cos_sin_cache)]
    args += [is_neox, _section(mrope_section), mrope_interleaved]
    (_rotate_inplace if direct(args) else _apply_inplace)(*args)
