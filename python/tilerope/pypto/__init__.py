"""tilerope.pypto: PyPTO's Python tile API over tilerope's CPU tile executor.

``import tilerope.pypto as pypto`` and a kernel written for PyPTO (``@pypto.frontend.jit``,
``pypto.Tensor`` annotations, ``pypto.loop``, ``view``, ``set_vec_tile_shapes``, the vector ops,
``assemble``) runs on any CPU: a checking pass enforces PyPTO's rules and the unified-buffer
budget before any data moves, then the executing pass computes tile by tile. docs/tile-layer.md
has the supported subset and what is not supported.
"""

from . import frontend
from ._core import (
    DT_BF16,
    DT_FP16,
    DT_FP32,
    DYN,
    DYNAMIC,
    CastMode,
    DataType,
    RunMode,
    SymInt,
    Tensor,
    TileError,
    Value,
    bytes_of,
)
from .frontend import jit
from .ops import (
    add,
    amax,
    assemble,
    cast,
    concat,
    deinterleave,
    div,
    expand_clone,
    gathermask,
    interleave,
    loop,
    mul,
    neg,
    reshape,
    rsqrt,
    set_vec_tile_shapes,
    sub,
    sum,
    view,
)

__all__ = [
    "frontend", "jit", "Tensor", "Value", "SymInt", "DataType", "DT_FP32", "DT_FP16", "DT_BF16",
    "DYNAMIC", "DYN", "CastMode", "RunMode", "TileError", "bytes_of",
    "view", "assemble", "neg", "add", "sub", "mul", "div", "rsqrt", "sum", "amax", "cast",
    "concat", "deinterleave", "interleave", "gathermask", "expand_clone", "reshape",
    "set_vec_tile_shapes", "loop",
]
