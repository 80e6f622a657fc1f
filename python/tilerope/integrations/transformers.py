"""tilerope in a transformers model, on the CPU, in one call::

    report = tilerope.integrations.transformers.enable(model)
    print(report)

Text attention: transformers wraps ``apply_rotary_pos_emb`` as the hub kernel layer
"rotary_pos_emb", whose mapping has entries for CUDA, ROCm and XPU only. :func:`enable` maps it on
the CPU to tilerope's layer, a local repository inside this package (no download), and
kernelizes the model with the ``kernels`` package. Where a transformers version has no such
hook, it patches the model family's ``apply_rotary_pos_emb`` instead. On Qwen3-style attention
(``q_norm``/``k_norm`` applied just before RoPE) the norms are deferred to the rotation, which
then runs RMSNorm and RoPE in one pass. Vision towers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) get
tilerope's ``apply_rotary_pos_emb_vision`` by patching their modeling module. A model type it
does not know is refused. :func:`disable` undoes all of it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from ..qk_norm import qk_norm_rope
from ..rotary import apply_rotary_pos_emb, apply_rotary_pos_emb_vision

__all__ = ["enable", "disable", "Report", "SUPPORTED_MODEL_TYPES"]

#: model_type -> transformers.models.<name>.modeling_<name>
SUPPORTED_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
}
_VISION = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
_LAYER_NAME = "rotary_pos_emb"
_HUB_REPOSITORY = Path(__file__).with_name("hub_kernel")


@dataclass
class Report:
    """What :func:`enable` changed."""

    model_type: str
    changes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"tilerope on {self.model_type}:"] + [f"  - {c}" for c in self.changes]
        return "\n".join(lines)


# --- the fused QK RMSNorm + RoPE of Qwen3-style attention -------------------------------------


class _DeferredRMSNorm(nn.Module):
    """Stands in for an attention's q_norm or k_norm: passes x through while the attention's
    rotation applies the norm itself (fused), and is the original norm otherwise. It shares the
    original's weight, so the state dict keeps its keys."""

    def __init__(self, original: nn.Module, rotation: nn.Module):
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon
        self.__dict__["original"] = original  # not a submodule: the state dict is unchanged
        self.__dict__["rotation"] = weakref.ref(rotation)

    def forward(self, x):
        rotation = self.rotation()
        if rotation is not None and _fusion_of(rotation) is not None:
            return x
        return self.original(x)


class _Fusion:
    """Held by an attention's rotation: the attention's deferred norms, when both still are."""

    def __init__(self, attention: nn.Module, rounding: str):
        self.attention = weakref.ref(attention)
        self.rounding = rounding

    def norms(self):
        a = self.attention()
        if a is None:
            return None
        q, k = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
        if isinstance(q, _DeferredRMSNorm) and isinstance(k, _DeferredRMSNorm):
            return q, k
        return None


def _fusion_of(rotation: nn.Module) -> Optional[_Fusion]:
    fusion = rotation.__dict__.get("tilerope_fusion")
    if fusion is None or fusion.norms() is None:
        return None
    if rotation.__dict__.get("_kernel_repo") is not _REPOSITORY:
        return None  # the rotation is no longer tilerope's (kernelized again by someone else)
    return fusion


def rotary_pos_emb_forward(rotation: nn.Module, q, k, cos, sin, unsqueeze_dim=1):
    """The hub layer's forward: fused with the deferred norms where the attention has them."""
    fusion = _fusion_of(rotation)
    if fusion is None:
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    qn, kn = fusion.norms()
    return qk_norm_rope(q, k, qn.weight, kn.weight, cos, sin, qn.variance_epsilon, unsqueeze_dim,
                        rounding=fusion.rounding)


# Qwen3Attention.forward, the lines the fusion relies on: the norms on the projections, then
# the transpose, then RoPE on the results (transformers 4.51 to 5.x).
_FUSABLE_SOURCE = [
    re.compile(r"query_states\s*=\s*self\.q_norm\(self\.q_proj\(hidden_states\)\.view\("
               r"hidden_shape\)\)\.transpose\(1,\s*2\)"),
    re.compile(r"key_states\s*=\s*self\.k_norm\(self\.k_proj\(hidden_states\)\.view\("
               r"hidden_shape\)\)\.transpose\(1,\s*2\)"),
    re.compile(r"query_states,\s*key_states\s*=\s*apply_rotary_pos_emb\(query_states,\s*"
               r"key_states,\s*cos,\s*sin\)"),
]


def _why_not_fusable(attention: nn.Module) -> Optional[str]:
    qn, kn = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
    if qn is None or kn is None:
        return "no q_norm/k_norm"
    if not all(hasattr(n, "weight") and hasattr(n, "variance_epsilon") for n in (qn, kn)):
        return "q_norm/k_norm are not RMSNorms with weight and variance_epsilon"
    if qn.variance_epsilon != kn.variance_epsilon:
        return f"q_norm eps ({qn.variance_epsilon}) != k_norm eps ({kn.variance_epsilon})"
    try:
        source = inspect.getsource(type(attention).forward)
    except (OSError, TypeError):
        return "the attention's forward has no source to check"
    if not all(p.search(source) for p in _FUSABLE_SOURCE):
        return f"{type(attention).__name__}.forward does not apply q_norm/k_norm just before RoPE"
    return None


# --- enable / disable ---------------------------------------------------------------------------

_REPOSITORY: Any = None  # the kernels LocalLayerRepository, made once
_PATCHED: dict[tuple[str, str], Any] = {}  # (module, name) -> the original function


def _repository():
    global _REPOSITORY
    if _REPOSITORY is None:
        from kernels import LocalLayerRepository

        _REPOSITORY = LocalLayerRepository(
            repo_path=_HUB_REPOSITORY, layer_name="RotaryPosEmb", check_arch=False)
    return _REPOSITORY


def _kernels_available() -> bool:
    try:
        importlib.import_module("kernels")
    except ImportError:
        return False
    return True


def _patch(module: Any, name: str, replacement: Any) -> None:
    key = (module.__name__, name)
    if key not in _PATCHED:
        _PATCHED[key] = getattr(module, name)
    setattr(module, name, replacement)


def _rotations(model: nn.Module):
    """(attention, its "rotary_pos_emb" hub wrapper) for every attention that has one."""
    for m in model.modules():
        funcs = getattr(m, "_kernel_funcs", None)
        if isinstance(funcs, dict) and _LAYER_NAME in funcs:
            yield m, funcs[_LAYER_NAME]


def enable(model: nn.Module, *, fuse_qk_norm: bool = True, vision: bool = True,
           qk_norm_rounding: str = "fp32_once") -> Report:
    """Runs the model's RoPE (and, on Qwen3-style attention, QK RMSNorm + RoPE) with tilerope.

    Supported: the model types of :data:`SUPPORTED_MODEL_TYPES` (text attention, and the vision
    tower of the VL models when ``vision``), on the CPU. ``qk_norm_rounding`` is
    :func:`tilerope.qk_norm_rope`'s ``rounding``. Raises ValueError for another model type or a
    model not on the CPU. Returns a :class:`Report` of what changed.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"tilerope.integrations.transformers.enable: model_type {model_type!r} is not one "
            f"tilerope knows; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    devices = {p.device.type for p in model.parameters()}
    if devices - {"cpu"}:
        raise ValueError(f"tilerope runs on the CPU; the model has parameters on {sorted(devices)}")
    family = SUPPORTED_MODEL_TYPES[model_type]
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    report = Report(model_type)

    rotations = list(_rotations(model))
    if rotations and _kernels_available():
        from kernels import Mode, kernelize, use_kernel_mapping

        mapping = {_LAYER_NAME: {"cpu": _repository()}}
        mode = Mode.TRAINING if model.training else Mode.INFERENCE
        # The local repository has no digest to verify, which `kernels` warns of on each load.
        validate_log = logging.getLogger("kernels._internals.validate")
        level = validate_log.level
        validate_log.setLevel(logging.ERROR)
        try:
            with use_kernel_mapping(mapping, inherit_mapping=False):
                for _, rotation in rotations:
                    kernelize(rotation, device="cpu", mode=mode)
        finally:
            validate_log.setLevel(level)
        report.changes.append(
            f"{len(rotations)} attention layers: '{_LAYER_NAME}' hub kernel mapped on the CPU to "
            f"tilerope (local repository {_HUB_REPOSITORY.name}, kernels.kernelize, {mode})")
    else:
        _patch(modeling, "apply_rotary_pos_emb", apply_rotary_pos_emb)
        report.changes.append(
            f"{modeling.__name__}.apply_rotary_pos_emb patched (no hub kernel hook in this "
            "transformers; every model of this family in the process)")

    if fuse_qk_norm:
        fused, reasons = 0, set()
        for attention, rotation in rotations:
            if _fusion_of(rotation) is not None:
                fused += 1
                continue
            why = _why_not_fusable(attention)
            if why is None and rotation.__dict__.get("_kernel_repo") is not _REPOSITORY:
                why = "the rotation is not tilerope's hub kernel"
            if why is not None:
                if hasattr(attention, "q_norm"):
                    reasons.add(why)
                continue
            rotation.__dict__["tilerope_fusion"] = _Fusion(attention, qk_norm_rounding)
            attention.q_norm = _DeferredRMSNorm(attention.q_norm, rotation)
            attention.k_norm = _DeferredRMSNorm(attention.k_norm, rotation)
            fused += 1
        if fused:
            report.changes.append(
                f"{fused} attention layers: q_norm/k_norm fused into the rotation "
                f"(tilerope.qk_norm_rope, rounding {qk_norm_rounding})")
        for why in sorted(reasons):
            report.changes.append(f"q_norm/k_norm not fused: {why}")

    if vision and model_type in _VISION:
        _patch(modeling, "apply_rotary_pos_emb_vision", apply_rotary_pos_emb_vision)
        report.changes.append(
            f"{modeling.__name__}.apply_rotary_pos_emb_vision patched (vision tower; every "
            "model of this family in the process)")
    return report


def disable(model: nn.Module) -> None:
    """Undoes :func:`enable`: the model's rotations and norms are transformers' again, and the
    patched modeling functions are restored (for every model of those families)."""
    for attention, rotation in _rotations(model):
        for name in ("q_norm", "k_norm"):
            norm = getattr(attention, name, None)
            if isinstance(norm, _DeferredRMSNorm):
                setattr(attention, name, norm.original)
        rotation.__dict__.pop("tilerope_fusion", None)
        if rotation.__dict__.get("_kernel_repo") is _REPOSITORY:
            rotation.__dict__.pop("forward", None)
            rotation.__dict__.pop("_kernel_repo", None)
    for (module_name, name), original in list(_PATCHED.items()):
        setattr(importlib.import_module(module_name), name, original)
        del _PATCHED[(module_name, name)]
