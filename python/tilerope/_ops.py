"""The torch.library ops of tilerope: kernels, fake (meta) implementations and autograd.

Each op maps the tensors of its public layout to the views the C++ API takes (transposes,
slices and expands: no copies), and writes into outputs made by ``torch.empty_like`` of its
inputs (``new_like``), so that its fake implementation allocates exactly the same. Every rotation op has a
``*_backward`` twin with the same schema, the output gradients in place of q and k, which applies
the inverse rotation; autograd calls it as an op, so ``torch.compile`` traces backward too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from . import _C

try:
    from torch.utils.dlpack import to_dlpack as _to_dlpack
except ImportError:  # a torch without it: the tensor's own __dlpack__, a few microseconds more
    _to_dlpack = None


def dl(x: Tensor):
    """x as a DLPack capsule for _C: zero-copy, and about 2 us cheaper than x.__dlpack__()."""
    if not x.is_cpu:
        raise ValueError(
            f"a tensor is on {x.device}: this build of tilerope runs on the CPU only (no CUDA "
            "backend); pass CPU tensors")
    return x if _to_dlpack is None else _to_dlpack(x)


CACHED_OUTPUT_BYTES = 1 << 22
_CACHED_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def new_like(x: Tensor) -> Tensor:
    """torch.empty_like(x). From 4 MiB up its memory comes from tilerope's output cache: fresh
    pages would cost a fault and zeroing each on the first write, more than the kernel
    (docs/python.md)."""
    name = _CACHED_DTYPES.get(x.dtype)
    if x.nbytes < CACHED_OUTPUT_BYTES or name is None or not x.is_cpu:
        return torch.empty_like(x)
    strides = torch.empty_like(x, device="meta").stride()
    return torch.from_dlpack(_C.cached_empty(list(x.shape), list(strides), name))


def direct(args) -> bool:
    """True when an op's kernel can be called without the dispatcher: eager mode, plain tensors
    (no subclass such as FakeTensor), no autograd. The dispatch alone costs about 10 us, more
    than a decode step's rotation."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    for x in args:
        if isinstance(x, Tensor) and (type(x) is not Tensor or (grad and x.requires_grad)):
            return False
    return True


# --- the public layouts as the C++ API's views ------------------------------------------------


def as_bshd(x: Tensor, unsqueeze_dim: int, name: str) -> Tensor:
    """transformers' q/k, [B, H, S, D] (unsqueeze_dim 1) or [B, S, H, D] (2), as [B, S, H, D]."""
    if x.dim() != 4:
        raise ValueError(
            f"{name} must have 4 dims, [B, H, S, D] (unsqueeze_dim=1) or [B, S, H, D] "
            f"(unsqueeze_dim=2); got shape {tuple(x.shape)}"
        )
    if unsqueeze_dim == 1:
        return x.transpose(1, 2)
    if unsqueeze_dim == 2:
        return x
    raise ValueError(f"unsqueeze_dim ({unsqueeze_dim}) must be 1 ([B, H, S, D]) or 2 ([B, S, H, D])")


def token_rows(cos: Tensor, batch: int, seq: int, name: str, planes: int = 0) -> Tensor:
    """cos for x [B, S, H, D]: [B, S, w] (B may be 1) or [S, w]; with planes, [A, B, S, w] or
    [A, S, w]. A batch of 1 is broadcast by a zero stride."""
    lead = (planes,) if planes else ()
    n = len(lead)
    if cos.dim() == n + 2 and tuple(cos.shape[: n + 1]) == lead + (seq,):
        return cos
    if cos.dim() == n + 3 and tuple(cos.shape[:n]) == lead and cos.shape[n + 1] == seq:
        if cos.shape[n] == batch:
            return cos
        if cos.shape[n] == 1:
            return cos.expand(*lead, batch, seq, cos.shape[-1])
    want = f"[{planes}, B, S, D] or [{planes}, S, D]" if planes else "[B, S, D] or [S, D]"
    raise ValueError(
        f"{name} must be {want} with B = {batch} (or 1) and S = {seq}; got shape "
        f"{tuple(cos.shape)}"
    )


def check_same_shape(a: Tensor, b: Tensor, names: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{names} must have the same shape; got {tuple(a.shape)} and {tuple(b.shape)}")


def mrope_axes(section: list[int], interleaved: bool, rotary_dim: int) -> list[int]:
    """The axis (0 T, 1 H, 2 W) of each of the rotary_dim/2 frequencies."""
    if len(section) != 3:
        raise ValueError(f"mrope_section ({list(section)}) must have 3 entries (T, H, W)")
    if sum(section) * 2 != rotary_dim:
        raise ValueError(
            f"mrope_section ({list(section)}) must sum to rotary_dim/2 = {rotary_dim // 2}; "
            f"it sums to {sum(section)}")
    return _C.mrope_axis_map(list(section), "interleaved" if interleaved else "chunked")


@dataclass
class Rotation:
    """One call of tilerope's rope: the C++ views of q and k, how outputs map to views, and
    where the angles come from (made only on real tensors)."""

    style: str
    q: Tensor
    k: Optional[Tensor]
    angles: Callable[[], "_C.angles"]
    rotary_dim: int
    out_view: Callable[[Tensor], Tensor]
    split_half: bool = False


def _run(r: Rotation, q_out: Optional[Tensor], k_out: Optional[Tensor], backward: bool) -> None:
    _C.rope(
        r.style,
        dl(r.q),
        None if r.k is None else dl(r.k),
        None if q_out is None else dl(r.out_view(q_out)),
        None if k_out is None else dl(r.out_view(k_out)),
        r.angles(),
        r.rotary_dim,
        backward,
        r.split_half,
    )


def readable(g: Tensor) -> Tensor:
    """An output gradient as the kernels read it: last dim contiguous (a gradient can be an
    expanded scalar, all strides 0)."""
    return g if g.stride(-1) == 1 else g.contiguous()


def rotation_op(
    name: str, schema: str, plan: Callable[..., Rotation], q_arg: int, k_arg: Optional[int]
):
    """tilerope::<name> and tilerope::<name>_backward from one `plan` of the op's arguments.
    Outputs are new_like(q) and new_like(k) (k absent or None: one output). Returns a
    function of the op's arguments that calls the kernel directly where `direct` allows, the
    forward op otherwise."""
    rotated = (q_arg,) if k_arg is None else (q_arg, k_arg)

    def present(args) -> list[int]:
        return [i for i in rotated if args[i] is not None]

    def kernel(backward: bool):
        def run(*args):
            r = plan(*args)
            outs = [new_like(args[i]) for i in present(args)]
            _run(r, outs[0], outs[1] if len(outs) > 1 else None, backward)
            return outs

        return run

    def fake(*args):
        plan(*args)  # the kernel's shape errors, at trace time too
        return [torch.empty_like(args[i]) for i in present(args)]

    ops = []
    for suffix, backward in (("", False), ("_backward", True)):
        op = torch.library.custom_op(
            f"tilerope::{name}{suffix}", kernel(backward), mutates_args=(), schema=schema
        )
        op.register_fake(fake)
        ops.append(op)
    forward, backward_op = ops

    def setup_context(ctx, inputs, output):
        angle_args = [
            i for i, x in enumerate(inputs) if isinstance(x, Tensor) and i not in rotated
        ]
        if any(inputs[i].requires_grad for i in angle_args):
            raise ValueError(
                f"tilerope.{name}: only the rotated tensors take a gradient; detach cos, sin "
                "and the cache (a rotary embedding computed from inv_freq has none)"
            )
        ctx.args = [None if isinstance(x, Tensor) else x for x in inputs]
        ctx.angle_args = angle_args
        ctx.present = present(inputs)
        ctx.save_for_backward(*(inputs[i] for i in angle_args))

    def backward(ctx, grads):
        args = list(ctx.args)
        for i, t in zip(ctx.angle_args, ctx.saved_tensors):
            args[i] = t
        for i, g in zip(ctx.present, grads):
            args[i] = readable(g)
        result: list[Optional[Tensor]] = [None] * len(args)
        for i, dx in zip(ctx.present, backward_op(*args)):
            result[i] = dx
        return tuple(result)

    forward.register_autograd(backward, setup_context=setup_context)
    run_forward = kernel(False)

    def call(*args):
        return run_forward(*args) if direct(args) else forward(*args)

    return call
