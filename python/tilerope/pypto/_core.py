"""The objects of a tilerope.pypto kernel: dtypes, symbolic integers, tensors and values, and the
error that points at the kernel's line."""

from __future__ import annotations

import enum
import linecache
import operator
import os
import sys
import threading
from typing import Any, Optional, Sequence

from .._C import tile as _tile

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class TileError(ValueError):
    """A tile program broke a PyPTO rule (or an op got values it cannot take). The message
    names the op, the rule and the values, and the kernel line that called the op."""


TileError.__module__ = "tilerope.pypto"


def _user_frame():
    """The innermost frame outside this package: the kernel line that called into it."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PACKAGE_DIR:
        f = f.f_back
    return f


def where() -> str:
    f = _user_frame()
    if f is None:
        return ""
    code = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f'\n  at {f.f_code.co_filename}:{f.f_lineno}, in {f.f_code.co_name}: {code}'


def fail(message: str) -> TileError:
    """A TileError with the calling kernel line appended."""
    return TileError(message + where())


def calls_tile(fn):
    """Runs fn, turning the tile layer's ValueError into a TileError at the kernel's line."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TileError:
            raise
        except ValueError as e:
            raise fail(str(e)) from None

    wrapped.__name__ = fn.__name__
    wrapped.__qualname__ = fn.__qualname__
    wrapped.__doc__ = fn.__doc__
    wrapped.__wrapped__ = fn
    return wrapped


# ---- dtypes ----------------------------------------------------------------------------------


class DataType(enum.Enum):
    """PyPTO's element types that the tile layer holds (f32, f16, bf16)."""

    DT_FP32 = "f32"
    DT_FP16 = "f16"
    DT_BF16 = "bf16"

    def __repr__(self) -> str:
        return f"pypto.{self.name}"

    __str__ = __repr__

    @property
    def bytes(self) -> int:
        return 4 if self is DataType.DT_FP32 else 2


DT_FP32 = DataType.DT_FP32
DT_FP16 = DataType.DT_FP16
DT_BF16 = DataType.DT_BF16


def _dtype_of_code(code: str) -> DataType:
    return DataType(code)


def bytes_of(dtype: DataType) -> int:
    """Bytes of one element of dtype."""
    return check_dtype("bytes_of", dtype).bytes


def check_dtype(op: str, dtype: Any) -> DataType:
    if not isinstance(dtype, DataType):
        raise TypeError(f"{op}: dtype must be pypto.DT_FP32, DT_FP16 or DT_BF16, got {dtype!r}"
                        + where())
    return dtype


class CastMode(enum.Enum):
    """Rounding of cast (PyPTO's CastMode). CAST_NONE picks the default, CAST_RINT."""

    CAST_NONE = "none"
    CAST_RINT = "rint"
    CAST_ROUND = "round"
    CAST_FLOOR = "floor"
    CAST_CEIL = "ceil"
    CAST_TRUNC = "trunc"
    CAST_ODD = "odd"

    def __repr__(self) -> str:
        return f"pypto.CastMode.{self.name}"


class RunMode(enum.IntEnum):
    """PyPTO's run modes. Every mode runs on the CPU tile executor here; CPU names it."""

    NPU = 0
    SIM = 1
    CPU = 2


# ---- symbolic integers -----------------------------------------------------------------------


def _sym(v):
    return SymInt(v) if isinstance(v, int) and not isinstance(v, bool) else v


class SymInt(int):
    """A loop index or a tensor extent: an int that also has PyPTO's .min() and .max(), and
    keeps being one through integer arithmetic."""

    def min(self, other) -> "SymInt":
        return SymInt(min(int(self), int(other)))

    def max(self, other) -> "SymInt":
        return SymInt(max(int(self), int(other)))

    def __neg__(self):
        return SymInt(-int(self))


def _closed(name: str):
    base = getattr(int, name)

    def op(self, o):
        return _sym(base(self, o)) if isinstance(o, int) else NotImplemented

    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"):
    setattr(SymInt, _name, _closed(_name))


def _index(x: Any):
    """x as an int if it is an integer (int, SymInt, numpy or torch integer scalars), else None."""
    if isinstance(x, bool) or isinstance(x, float):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def ints(op: str, arg: str, xs: Any) -> list:
    """A list of plain ints from a shape or offsets argument, or a TypeError naming it."""
    if _index(xs) is not None:
        xs = [xs]
    try:
        items = list(xs)
    except TypeError:
        raise TypeError(f"{op}: {arg} must be a list of ints, got {xs!r}" + where()) from None
    out = []
    for x in items:
        v = _index(x)
        if v is None:
            raise TypeError(f"{op}: {arg} must be a list of ints, got {items!r}" + where())
        out.append(v)
    return out


# ---- tensors and values ----------------------------------------------------------------------


class _Dynamic:
    """A dimension whose extent is given by the tensor passed at the call."""

    def __init__(self, name: Optional[str] = None):
        self.name = name

    def __repr__(self) -> str:
        return "pypto.DYNAMIC" if self.name is None else f"pypto.frontend.dynamic({self.name!r})"


DYNAMIC = _Dynamic()
DYN = DYNAMIC


class Tensor:
    """PyPTO's Tensor. As an annotation, ``pypto.Tensor(shape, dtype)`` states what a kernel
    parameter must be (a dim may be ``pypto.DYNAMIC`` or ``pypto.frontend.dynamic(name)``; both
    may be left out). Inside a running kernel, a parameter is a Tensor bound to the array passed:
    it can be viewed, assembled into, written whole with ``t[:] = value``, and used as an
    operand (the whole tensor). (Its operators and ``t[:] =`` are installed by ops.py.)"""

    def __init__(self, shape: Optional[Sequence[Any]] = None, dtype: Optional[DataType] = None,
                 name: Optional[str] = None):
        if shape is not None:
            shape = list(shape)
            for d in shape:
                if not isinstance(d, _Dynamic) and (isinstance(d, bool) or not isinstance(d, int)
                                                    or d < 0):
                    raise TypeError(f"pypto.Tensor: shape entries must be ints >= 0 or "
                                    f"pypto.DYNAMIC, got {shape!r}")
        if dtype is not None:
            check_dtype("pypto.Tensor", dtype)
        self._spec_shape = shape
        self._spec_dtype = dtype
        self.name = name
        self._handle = None  # the _C.tile.Tensor while bound

    @classmethod
    def _bound(cls, name: str, handle) -> "Tensor":
        t = cls(name=name)
        t._handle = handle
        return t

    def _require_bound(self, op: str):
        if self._handle is None:
            raise fail(f"{op}: pypto.Tensor{self._describe()} is an annotation, not a kernel "
                       "parameter; pass arrays to a @pypto.frontend.jit kernel")
        return self._handle

    def _describe(self) -> str:
        return f"({self._spec_shape!r}, {self._spec_dtype!r})"

    @property
    def shape(self) -> list:
        if self._handle is None:
            return list(self._spec_shape or [])
        return [SymInt(d) for d in self._handle.shape]

    @property
    def dtype(self) -> Optional[DataType]:
        if self._handle is None:
            return self._spec_dtype
        return _dtype_of_code(self._handle.dtype)

    def dim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        if self._handle is None:
            return f"pypto.Tensor{self._describe()}"
        return f"pypto.Tensor('{self.name}', {list(self._handle.shape)}, {self.dtype!r})"


class Value:
    """A tile-program value (a view, or the result of ops): lazy, it holds no data."""

    __slots__ = ("_v",)

    def __init__(self, v):
        self._v = v

    @property
    def shape(self) -> list:
        return [SymInt(d) for d in self._v.shape]

    @property
    def valid_shape(self) -> list:
        return [SymInt(d) for d in self._v.valid_shape]

    @property
    def dtype(self) -> DataType:
        return _dtype_of_code(self._v.dtype)

    def dim(self) -> int:
        return len(self._v.shape)

    def __repr__(self) -> str:
        return f"pypto value {list(self._v.shape)} valid {list(self._v.valid_shape)} {self.dtype!r}"


def value_of(op: str, arg: str, x: Any):
    """The _C.tile.Value behind an op's operand: a Value, or a bound Tensor seen whole."""
    if isinstance(x, Value):
        return x._v
    if isinstance(x, Tensor):
        h = x._require_bound(op)
        return calls_tile(_tile.view_tensor)(h, list(h.shape), [0] * len(h.shape), None)
    raise TypeError(f"{op}: {arg} must be a pypto Tensor or value, got {type(x).__name__}"
                    + where())


# ---- the kernel being run --------------------------------------------------------------------

class _Running(threading.local):
    """The kernels running on this thread (at most one: kernels do not nest), as the tile
    layer's kernel state is per thread."""

    def __init__(self):
        self.names: list = []


_running = _Running()


def require_kernel(op: str) -> None:
    if not _running.names:
        raise fail(f"pypto.{op} called outside a kernel: call it in the body of a "
                   "@pypto.frontend.jit function")
