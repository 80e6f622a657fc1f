"""PyPTO's vector tile ops, with its names, argument order and defaults, over tilerope's tile
layer. Each op checks its rule when it is called (in the checking pass, before any data moves)
and raises TileError naming the op, the rule, the values and the kernel line."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .._C import tile as _tile
from ._core import (
    CastMode,
    DataType,
    SymInt,
    Tensor,
    TileError,
    Value,
    calls_tile,
    check_dtype,
    fail,
    ints,
    require_kernel,
    value_of,
    where,
)

_view_tensor = calls_tile(_tile.view_tensor)
_view_value = calls_tile(_tile.view_value)


def _scalar(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _wrap(v) -> Value:
    return Value(v)


def view(input, shape: Sequence[int], offsets: Sequence[int],
         valid_shape: Optional[Sequence[int]] = None) -> Value:
    """A window of a tensor or value: `shape` static, `offsets` where it starts; elements past
    `valid_shape` (default: shape) read as 0. No data moves."""
    require_kernel("view")
    shape = ints("view", "shape", shape)
    offsets = ints("view", "offsets", offsets)
    valid = None if valid_shape is None else ints("view", "valid_shape", valid_shape)
    if len(offsets) != len(shape) or (valid is not None and len(valid) != len(shape)):
        raise fail(f"view: shape {shape}, offsets {offsets} and valid_shape {valid} must have "
                   "one entry per dim")
    if isinstance(input, Tensor):
        h = input._require_bound("view")
        if len(shape) != len(h.shape):
            raise fail(f"view of '{h.name}': shape {shape} has rank {len(shape)}, the tensor "
                       f"{list(h.shape)} has rank {len(h.shape)}")
        return _wrap(_view_tensor(h, shape, offsets, valid))
    v = value_of("view", "input", input)
    if len(shape) != len(v.shape):
        raise fail(f"view of a {list(v.shape)} value: shape {shape} has rank {len(shape)}, "
                   f"the value has rank {len(v.shape)}")
    return _wrap(_view_value(v, shape, offsets, valid))


@calls_tile
def assemble(input, offsets: Sequence[int], out: Tensor) -> None:
    """Writes input's valid region into the kernel output `out` at `offsets`."""
    require_kernel("assemble")
    offsets = ints("assemble", "offsets", offsets)
    if not isinstance(out, Tensor):
        raise TypeError(f"assemble: out must be a kernel parameter (pypto.Tensor), got "
                        f"{type(out).__name__}" + where())
    h = out._require_bound("assemble")
    v = value_of("assemble", "input", input)
    if len(offsets) != len(h.shape) or len(v.shape) != len(h.shape):
        raise fail(f"assemble into '{h.name}': the value {list(v.shape)}, offsets {offsets} and "
                   f"the tensor {list(h.shape)} must have one rank")
    _tile.assemble(v, offsets, h)


@calls_tile
def neg(input) -> Value:
    """-input."""
    require_kernel("neg")
    return _wrap(_tile.neg(value_of("neg", "input", input)))


@calls_tile
def rsqrt(input) -> Value:
    """1 / sqrt(input)."""
    require_kernel("rsqrt")
    return _wrap(_tile.rsqrt(value_of("rsqrt", "input", input)))


def _binary(op: str, a, b, tensor_fn, scalar_fn, rscalar_fn=None) -> Value:
    require_kernel(op)
    if _scalar(b):
        return _wrap(scalar_fn(value_of(op, "input", a), float(b)))
    if _scalar(a):
        if rscalar_fn is None:
            raise TypeError(f"{op}: input must be a tensor or value, got {a!r}" + where())
        return _wrap(rscalar_fn(float(a), value_of(op, "other", b)))
    return _wrap(tensor_fn(value_of(op, "input", a), value_of(op, "other", b)))


@calls_tile
def add(input, other) -> Value:
    """input + other (a tensor, value or scalar; shapes broadcast as NumPy's)."""
    return _binary("add", input, other, _tile.add, _tile.add_scalar)


@calls_tile
def sub(input, other) -> Value:
    """input - other."""
    return _binary("sub", input, other, _tile.sub, _tile.sub_scalar)


@calls_tile
def mul(input, other) -> Value:
    """input * other."""
    return _binary("mul", input, other, _tile.mul, _tile.mul_scalar)


@calls_tile
def div(input, other) -> Value:
    """input / other (either may be a scalar)."""
    return _binary("div", input, other, _tile.div, _tile.div_scalar, _tile.rdiv_scalar)


def _dim(op: str, dim: Any) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}" + where())
    return int(dim)


@calls_tile
def sum(input, dim: int, keepdim: bool = False) -> Value:  # noqa: A001 (PyPTO's name)
    """Sum over dim; keepdim leaves it with size 1."""
    require_kernel("sum")
    return _wrap(_tile.sum(value_of("sum", "input", input), _dim("sum", dim), bool(keepdim)))


@calls_tile
def amax(input, dim: int, keepdim: bool = False) -> Value:
    """Largest element over dim (of the valid ones); keepdim leaves it with size 1."""
    require_kernel("amax")
    return _wrap(_tile.amax(value_of("amax", "input", input), _dim("amax", dim), bool(keepdim)))


@calls_tile
def cast(input, dtype: DataType, mode: CastMode = CastMode.CAST_NONE, satmode=None) -> Value:
    """input converted to dtype; f32 -> f16 / bf16 rounds by mode (CAST_NONE: CAST_RINT, nearest
    even); widening is exact."""
    require_kernel("cast")
    dtype = check_dtype("cast", dtype)
    if not isinstance(mode, CastMode):
        raise TypeError(f"cast: mode must be a pypto.CastMode, got {mode!r}" + where())
    if mode is CastMode.CAST_ODD:
        raise fail("cast: CastMode.CAST_ODD (round to odd) is not supported by tilerope's tile "
                   "layer; use CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL or CAST_TRUNC")
    if satmode is not None:
        raise fail(f"cast: satmode {satmode!r} is not supported (float casts saturate to inf)")
    m = "rint" if mode is CastMode.CAST_NONE else mode.value
    return _wrap(_tile.cast(value_of("cast", "input", input), dtype.value, m))


@calls_tile
def concat(tensors: Sequence[Any], dim: int = 0) -> Value:
    """tensors joined along dim (2..128 of one dtype and rank, other dims equal)."""
    require_kernel("concat")
    if isinstance(tensors, (Tensor, Value)) or not hasattr(tensors, "__iter__"):
        raise TypeError("concat: tensors must be a list of tensors or values" + where())
    vs = [value_of("concat", f"tensors[{i}]", t) for i, t in enumerate(tensors)]
    return _wrap(_tile.concat(vs, _dim("concat", dim)))


@calls_tile
def deinterleave(input):
    """(even, odd): out0[..., k] = input[..., 2k], out1[..., k] = input[..., 2k + 1]."""
    require_kernel("deinterleave")
    even, odd = _tile.deinterleave(value_of("deinterleave", "input", input))
    return _wrap(even), _wrap(odd)


@calls_tile
def interleave(even, odd) -> Value:
    """The inverse of deinterleave (tilerope's addition: the GPT-J output layout)."""
    require_kernel("interleave")
    return _wrap(_tile.interleave(value_of("interleave", "even", even),
                                  value_of("interleave", "odd", odd)))


@calls_tile
def gathermask(input, pattern_mode: int) -> Value:
    """pattern_mode 1: the even elements of the last dim; 2: the odd ones."""
    require_kernel("gathermask")
    if isinstance(pattern_mode, bool) or not isinstance(pattern_mode, int):
        raise TypeError(f"gathermask: pattern_mode must be 1 or 2, got {pattern_mode!r}" + where())
    return _wrap(_tile.gathermask(value_of("gathermask", "input", input), int(pattern_mode)))


@calls_tile
def expand_clone(input, shape: Sequence[int]) -> Value:
    """input broadcast to shape, materialised."""
    require_kernel("expand_clone")
    return _wrap(_tile.expand_clone(value_of("expand_clone", "input", input),
                                    ints("expand_clone", "shape", shape)))


@calls_tile
def reshape(input, shape: Sequence[int], inplace: bool = False) -> Value:
    """The same elements in a new shape; input is a whole tensor or a fully valid view of
    contiguous memory. (inplace is accepted: no data moves either way.)"""
    require_kernel("reshape")
    return _wrap(_tile.reshape(value_of("reshape", "input", input),
                               ints("reshape", "shape", shape)))


@calls_tile
def set_vec_tile_shapes(*dims: int) -> None:
    """The tile shape of the ops created after it (1..4 dims, each > 0)."""
    require_kernel("set_vec_tile_shapes")
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    _tile.set_vec_tile_shapes(ints("set_vec_tile_shapes", "dims", dims))


_loop_count = [0]


def loop(*args, name: Optional[str] = None, idx_name: Optional[str] = None,
         unroll_list: Optional[Sequence[int]] = None, submit_before_loop: bool = False):
    """``for i in pypto.loop(stop)`` / ``loop(start, stop, step=1)``: the indices in order, as
    SymInt. unroll_list gives the stretches (factors descending, 1 added); only the innermost
    loop may be unrolled."""
    require_kernel("loop")
    if not 1 <= len(args) <= 3:
        raise TypeError(f"loop takes (stop) or (start, stop[, step]), got {len(args)} arguments"
                        + where())
    bounds = ints("loop", "start, stop, step", args)
    start, stop, step = (0, bounds[0], 1) if len(bounds) == 1 else (bounds + [1])[:3]
    factors = [1] if unroll_list is None else ints("loop", "unroll_list", unroll_list)
    if name is None:
        name = f"loop_{_loop_count[0]}"
        _loop_count[0] += 1
    try:
        scope = _tile.LoopScope(start, stop, step, str(name), factors)
    except ValueError as e:
        raise fail(str(e)) from None
    return _iterate(scope, step)


def _iterate(scope, step: int):
    try:
        for k, (begin, end, _factor) in enumerate(scope.chunks):
            scope.begin_chunk(k)
            for i in range(begin, end, step):
                yield SymInt(i)
    finally:
        scope.close()


# ---- Python operators on tensors and values ------------------------------------------------


def _set_item(self: Tensor, key, value) -> None:
    """t[:] = value: the whole tensor written (assemble at offsets 0)."""
    if not (isinstance(key, slice) and key == slice(None)) and key is not Ellipsis:
        raise fail(f"tensor '{self.name}'[{key!r}] = ...: only t[:] = value (the whole "
                   "tensor) is supported; use pypto.assemble for a window")
    assemble(value, [0] * len(self.shape), self)


_OPERATORS = {
    "__add__": lambda a, b: add(a, b), "__radd__": lambda a, b: add(a, b),
    "__sub__": lambda a, b: sub(a, b), "__rsub__": lambda a, b: add(neg(a), b),
    "__mul__": lambda a, b: mul(a, b), "__rmul__": lambda a, b: mul(a, b),
    "__truediv__": lambda a, b: div(a, b), "__rtruediv__": lambda a, b: div(b, a),
    "__neg__": lambda a: neg(a),
}
for _cls in (Tensor, Value):
    for _name, _fn in _OPERATORS.items():
        setattr(_cls, _name, _fn)
Tensor.__setitem__ = _set_item

__all__ = [
    "view", "assemble", "neg", "rsqrt", "add", "sub", "mul", "div", "sum", "amax", "cast",
    "concat", "deinterleave", "interleave", "gathermask", "expand_clone", "reshape",
    "set_vec_tile_shapes", "loop", "TileError",
]
