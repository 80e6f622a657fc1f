"""pypto.frontend: the jit decorator that runs a kernel on tilerope's CPU tile executor, and
dynamic dims for its annotations."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional

from .._C import tile as _tile
from . import _core
from ._core import RunMode, Tensor, TileError, _Dynamic

DEFAULT_UB_BYTES = 192 * 1024


def dynamic(name: str) -> _Dynamic:
    """A named dynamic dim for pypto.Tensor annotations: its extent comes from the array passed,
    and every dim of one name must have one extent in a call."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"pypto.frontend.dynamic: name must be a non-empty str, got {name!r}")
    return _Dynamic(name)


def _options(what: str, options: Any) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"pypto.frontend.jit: {what} must be a dict, got {type(options).__name__}")
    return dict(options)


def _array_facts(name: str, arg: Any):
    """(shape, dtype name) of an array argument, or a TypeError naming the parameter."""
    if not hasattr(arg, "__dlpack__"):
        raise TypeError(f"kernel parameter '{name}' is annotated pypto.Tensor but got "
                        f"{type(arg).__name__}; pass a torch tensor or numpy array")
    return tuple(int(d) for d in arg.shape), str(arg.dtype)


_DTYPE_NAMES = {
    _core.DT_FP32: ("torch.float32", "float32"),
    _core.DT_FP16: ("torch.float16", "float16"),
    _core.DT_BF16: ("torch.bfloat16", "bfloat16"),
}


def _resolved_signature(fn: Callable, scope: dict) -> inspect.Signature:
    """fn's signature with string annotations (``from __future__ import annotations``) evaluated
    where the kernel was defined: its globals, its closure, and the decorating scope."""
    sig = inspect.signature(fn)
    if not any(isinstance(p.annotation, str) for p in sig.parameters.values()):
        return sig
    names = dict(fn.__globals__)
    names.update(scope)
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            names[var] = cell.cell_contents
        except ValueError:
            pass
    params = []
    for p in sig.parameters.values():
        ann = p.annotation
        if isinstance(ann, str):
            try:
                ann = eval(ann, names)  # noqa: S307 (the kernel's own annotation text)
            except Exception as e:
                raise TypeError(f"pypto.frontend.jit: annotation {p.annotation!r} of parameter "
                                f"'{p.name}' of '{fn.__name__}' cannot be evaluated: {e}") from None
        params.append(p.replace(annotation=ann))
    return sig.replace(parameters=params)


class JitKernel:
    """A kernel made by @pypto.frontend.jit: called with arrays (torch tensors or numpy arrays,
    on the CPU) for its pypto.Tensor parameters and any other values for the rest. It runs the
    body twice on tilerope's tile executor, a checking pass that moves no data and then the
    executing pass, and returns None: outputs are written through assemble or ``out[:] = ...``.
    The last run's report (UB peak, tiles, loop stretches) is ``kernel.last_report``."""

    def __init__(self, fn: Callable, runtime_options: dict, pass_options: dict,
                 host_options: dict, codegen_options: dict, ub_bytes: int,
                 scope: Optional[dict] = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.runtime_options = runtime_options
        self.pass_options = pass_options
        self.host_options = host_options
        self.codegen_options = codegen_options
        self.ub_bytes = ub_bytes
        self.last_report: Optional[dict] = None
        self.signature = _resolved_signature(fn, scope or {})
        self.tensor_params = [
            p.name for p in self.signature.parameters.values()
            if p.annotation is Tensor or isinstance(p.annotation, Tensor)
        ]
        if any(p.kind is p.VAR_POSITIONAL for p in self.signature.parameters.values()):
            raise TypeError(f"pypto.frontend.jit: kernel '{fn.__name__}' has a *args parameter; "
                            "name each tensor parameter")
        mode = runtime_options.get("run_mode", RunMode.NPU)
        if not isinstance(mode, RunMode):
            raise TypeError(f"pypto.frontend.jit: run_mode must be a pypto.RunMode, got {mode!r}")

    def _check(self, name: str, spec: Any, arg: Any, extents: dict) -> None:
        shape, dtype = _array_facts(name, arg)
        if not isinstance(spec, Tensor):
            return
        if spec._spec_dtype is not None and dtype not in _DTYPE_NAMES[spec._spec_dtype]:
            raise TypeError(f"kernel '{self.__name__}': parameter '{name}' is annotated "
                            f"{spec._spec_dtype!r} but got dtype {dtype}")
        if spec._spec_shape is None:
            return
        want = spec._spec_shape
        if len(want) != len(shape):
            raise ValueError(f"kernel '{self.__name__}': parameter '{name}' is annotated with "
                             f"shape {want} (rank {len(want)}) but got shape {list(shape)}")
        for i, (w, got) in enumerate(zip(want, shape)):
            if isinstance(w, _Dynamic):
                if w.name is not None:
                    first = extents.setdefault(w.name, (got, name, i))
                    if first[0] != got:
                        raise ValueError(
                            f"kernel '{self.__name__}': dynamic dim '{w.name}' is {first[0]} in "
                            f"'{first[1]}' (dim {first[2]}) but {got} in '{name}' (dim {i})")
            elif w != got:
                raise ValueError(f"kernel '{self.__name__}': parameter '{name}' is annotated "
                                 f"with shape {want} but got shape {list(shape)} (dim {i})")

    def __call__(self, *args, **kwargs) -> None:
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"kernel '{self.__name__}': {e}") from None
        bound.apply_defaults()
        extents: dict = {}
        handles = []
        for name in self.tensor_params:
            if name not in bound.arguments:
                continue
            arg = bound.arguments[name]
            self._check(name, self.signature.parameters[name].annotation, arg, extents)
            handle = _tile.Tensor(name, arg)
            handles.append(handle)
            bound.arguments[name] = Tensor._bound(name, handle)  # what the body sees

        def body():
            if self.fn(*bound.args, **bound.kwargs) is not None:
                code = self.fn.__code__
                raise TileError(f"kernel '{self.__name__}' returned a value: a kernel returns "
                                "nothing and writes its outputs with pypto.assemble or "
                                f"out[:] = value ({code.co_filename}:{code.co_firstlineno})")

        running = _core._running.names
        if running:
            raise TileError(f"kernel '{self.__name__}' called inside kernel "
                            f"'{running[-1]}': kernels do not nest" + _core.where())
        running.append(self.__name__)
        try:
            self.last_report = _tile.run_kernel(self.__name__, handles, body, self.ub_bytes)
        except TileError:
            raise
        except ValueError as e:
            code = self.fn.__code__
            raise TileError(f"{e}\n  in kernel '{self.__name__}' "
                            f"({code.co_filename}:{code.co_firstlineno})") from None
        finally:
            running.pop()


def jit(fn: Optional[Callable] = None, *, runtime_options: Optional[dict] = None,
        pass_options: Optional[dict] = None, host_options: Optional[dict] = None,
        codegen_options: Optional[dict] = None, debug_options: Optional[dict] = None,
        verify_options: Optional[dict] = None, ub_bytes: int = DEFAULT_UB_BYTES):
    """PyPTO's kernel decorator, as ``@pypto.frontend.jit`` or ``@pypto.frontend.jit(...)``.

    The options of PyPTO's compiler and runtime (runtime_options, pass_options, host_options,
    codegen_options, debug_options, verify_options) are accepted and kept on the kernel; they
    tune NPU code generation and have no effect here. Every run_mode runs on the CPU. ub_bytes
    (tilerope's) is the unified buffer's capacity, 192 KiB by default."""
    opts = [_options(w, o) for w, o in (("runtime_options", runtime_options),
                                        ("pass_options", pass_options),
                                        ("host_options", host_options),
                                        ("codegen_options", codegen_options))]
    _options("debug_options", debug_options)
    _options("verify_options", verify_options)
    if isinstance(ub_bytes, bool) or not isinstance(ub_bytes, int) or ub_bytes < 32:
        raise ValueError(f"pypto.frontend.jit: ub_bytes must be an int >= 32, got {ub_bytes!r}")

    def make(f: Callable, scope: Optional[dict] = None) -> JitKernel:
        if not callable(f):
            raise TypeError(f"pypto.frontend.jit decorates a function, got {f!r}")
        if scope is None:
            scope = dict(sys._getframe(1).f_locals)
        return JitKernel(f, *opts, ub_bytes, scope)

    return make(fn, dict(sys._getframe(1).f_locals)) if fn is not None else make


__all__ = ["jit", "dynamic", "JitKernel"]
