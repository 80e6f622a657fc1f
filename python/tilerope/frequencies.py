"""A model's RoPE frequencies from its config, and cos/sin built from them."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Union

import torch
from torch import Tensor

from . import _C

__all__ = ["rope_parameters", "rope_settings", "cos_sin_cache", "cos_sin"]

ConfigLike = Union[str, "os.PathLike[str]", dict, Any]


def _config_text(config: ConfigLike) -> tuple[str, str]:
    """The config as JSON text, and its name for error messages."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            return f.read(), os.fspath(config)
    if isinstance(config, dict):
        return json.dumps(config, default=str), "config"
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        return json.dumps(config.to_dict(), default=str), type(config).__name__
    raise TypeError(
        f"config must be a config.json path, a dict or a transformers config; got "
        f"{type(config).__name__}"
    )


def _select_layer_type(text: str, layer_type: str, origin: str) -> str:
    """The config with rope_parameters narrowed to one layer type's (Gemma 3's style)."""
    d = json.loads(text)
    holder = d
    if isinstance(d.get("text_config"), dict) and "rope_parameters" in d["text_config"]:
        holder = d["text_config"]
    per_type = holder.get("rope_parameters")
    if not isinstance(per_type, dict) or not isinstance(per_type.get(layer_type), dict):
        raise ValueError(f"{origin}: rope_parameters has no entry for layer_type {layer_type!r}")
    holder["rope_parameters"] = per_type[layer_type]
    return json.dumps(d)


def rope_settings(config: ConfigLike, seq_len: Optional[int] = None, *,
                  layer_type: Optional[str] = None) -> dict:
    """Everything tilerope reads of a config's RoPE: ``inv_freq`` (a list of floats, fp64),
    ``attention_scaling``, ``rope_type``, ``theta``, ``head_dim``, ``rotary_dim``,
    ``mrope_section`` (or None) and ``mrope_interleaved``."""
    text, origin = _config_text(config)
    if layer_type is not None:
        text = _select_layer_type(text, layer_type, origin)
    return _C.frequencies_of_config(text, origin, 0 if seq_len is None else int(seq_len))


def rope_parameters(
    config: ConfigLike,
    seq_len: Optional[int] = None,
    *,
    layer_type: Optional[str] = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, float]:
    """``(inv_freq, attention_scaling)`` as ``transformers.modeling_rope_utils`` computes them
    (``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len)``, or the model's default
    function), for every rope_type: default, linear, dynamic, yarn, longrope, llama3,
    proportional. ``config`` is a config.json path, its dict, or a transformers config object;
    ``seq_len`` (dynamic, longrope) is the number of positions covered, None for the model's
    starting frequencies; ``layer_type`` picks one entry of per-layer-type rope_parameters.
    Evaluated in fp64, returned as ``dtype`` (transformers' inv_freq is float32).
    """
    s = rope_settings(config, seq_len, layer_type=layer_type)
    return torch.tensor(s["inv_freq"], dtype=torch.float64).to(dtype), float(s["attention_scaling"])


def _angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    return positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)


def cos_sin_cache(
    inv_freq: Tensor,
    max_position: int,
    attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """vLLM's and FlashInfer's ``cos_sin_cache``: ``[max_position, 2 * len(inv_freq)]``, row p
    ``cos(p * inv_freq) * s`` then ``sin(p * inv_freq) * s`` (``s = attention_scaling``),
    computed in fp64 and rounded once to ``dtype``. For
    :func:`tilerope.apply_rope_with_cos_sin_cache`."""
    a = _angles(torch.arange(max_position), inv_freq)
    return (torch.cat((a.cos(), a.sin()), dim=-1) * attention_scaling).to(dtype)


def cos_sin(
    position_ids: Tensor,
    inv_freq: Tensor,
    attention_scaling: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """transformers' rotary embedding output, ``(cos, sin)`` of shape ``[*position_ids.shape,
    2 * len(inv_freq)]`` (each frequency's column twice, as ``cat((freqs, freqs), -1)``), times
    ``attention_scaling``, computed in fp64 and rounded once to ``dtype``. For
    :func:`tilerope.apply_rotary_pos_emb` and the other drop-ins."""
    a = _angles(position_ids, inv_freq)
    a = torch.cat((a, a), dim=-1)
    return (a.cos() * attention_scaling).to(dtype), (a.sin() * attention_scaling).to(dtype)
