"""tilerope: rotary position embedding (RoPE) kernels for PyTorch on the CPU.

Drop-ins for the functions models already call (transformers' ``apply_rotary_pos_emb`` and its
vision and MRoPE forms, FlashInfer's and vLLM's ``apply_rope_with_cos_sin_cache``), Qwen3's
fused QK RMSNorm + RoPE, and a model's frequencies from its config. Each is a ``torch.library``
op (``torch.ops.tilerope.*``) with autograd and a fake implementation. docs/python.md has the
reference.
"""

from . import _C
from ._C import (
    compiled_cpu_targets,
    cpu_class,
    cpu_target,
    empty_output_cache,
    num_threads,
    output_cache_bytes,
    output_cache_limit,
    set_cpu_target,
    set_num_threads,
    set_output_cache_limit,
    supported_cpu_targets,
)
from .cache import apply_rope_with_cos_sin_cache, apply_rope_with_cos_sin_cache_inplace
from .frequencies import cos_sin, cos_sin_cache, rope_parameters, rope_settings
from .qk_norm import qk_norm_rope
from .rotary import (
    apply_multimodal_rotary_pos_emb,
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_vision,
    interleave_rope,
)

__version__: str = _C.version()

__all__ = [
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_vision",
    "apply_multimodal_rotary_pos_emb",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "qk_norm_rope",
    "interleave_rope",
    "rope_parameters",
    "rope_settings",
    "cos_sin_cache",
    "cos_sin",
    "set_num_threads",
    "num_threads",
    "set_cpu_target",
    "cpu_target",
    "cpu_class",
    "compiled_cpu_targets",
    "supported_cpu_targets",
    "output_cache_bytes",
    "output_cache_limit",
    "set_output_cache_limit",
    "empty_output_cache",
]
