"""Bad input: a TypeError or ValueError naming the argument and values, and nothing written."""

import ctypes

import pytest
import torch
from conftest import hf_cos_sin, randn

import tilerope
from tilerope import _C


@pytest.fixture
def qkcs(gen):
    q, k = randn(2, 4, 6, 64, gen=gen), randn(2, 2, 6, 64, gen=gen)
    cos, sin = hf_cos_sin(torch.arange(6)[None], 64)
    return q, k, cos, sin


def test_unsupported_dtype_is_a_type_error(qkcs):
    q, k, cos, sin = qkcs
    with pytest.raises(TypeError, match="q has dtype float64"):
        tilerope.apply_rotary_pos_emb(q.double(), k.double(), cos, sin)
    with pytest.raises(TypeError, match="same dtype"):
        tilerope.apply_rotary_pos_emb_vision(q[0], k[0].half(), cos[0], sin[0])


@pytest.mark.parametrize("case,message", [
    ("cos seq", r"cos must be \[B, S, D\] or \[S, D\] with B = 2 \(or 1\) and S = 6; got shape \(2, 7, 64\)"),
    ("cos wide", r"rotary_dim \(66\) must be even, > 0 and <= head_dim \(64\)"),
    ("strided last dim", r"last dim"),
    ("k head_dim", r"k"),
    ("unsqueeze_dim", r"unsqueeze_dim \(3\) must be 1"),
    ("rank", r"q must have 4 dims"),
])
def test_bad_shapes_are_value_errors(qkcs, case, message):
    q, k, cos, sin = qkcs
    if case == "cos seq":
        cos, sin = hf_cos_sin(torch.arange(7).expand(2, 7), 64)
    elif case == "cos wide":
        cos, sin = hf_cos_sin(torch.arange(6)[None], 66)
    elif case == "strided last dim":
        q = randn(2, 4, 6, 128)[..., ::2]
    elif case == "k head_dim":
        k = randn(2, 2, 6, 32)
    elif case == "rank":
        q = q[0]
    u = 3 if case == "unsqueeze_dim" else 1
    with pytest.raises(ValueError, match=message):
        tilerope.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=u)


def test_other_functions_validate(qkcs):
    q, k, cos, sin = qkcs
    planes = torch.stack([cos] * 3)
    with pytest.raises(ValueError, match="mrope_section"):
        tilerope.apply_multimodal_rotary_pos_emb(q, k, planes, planes, [16, 8, 9])
    with pytest.raises(ValueError, match=r"mrope_section \(\[16, 16\]\) must have 3 entries"):
        tilerope.apply_multimodal_rotary_pos_emb(q, k, planes, planes, [16, 16])
    w = torch.ones(64)
    with pytest.raises(ValueError, match="eps"):
        tilerope.qk_norm_rope(q, k, w, w, cos, sin, eps=-1.0)
    with pytest.raises(ValueError, match=r"rounding \('fp16'\) must be one of"):
        tilerope.qk_norm_rope(q, k, w, w, cos, sin, rounding="fp16")
    with pytest.raises(ValueError, match=r"q_weight"):
        tilerope.qk_norm_rope(q, k, torch.ones(32), w, cos, sin)
    with pytest.raises(ValueError, match=r"cos must be \[B, 1, S, D\]"):
        tilerope.interleave_rope(q, cos, sin)
    with pytest.raises(ValueError, match="head_size = 48"):
        tilerope.apply_rope_with_cos_sin_cache(torch.arange(6), q[0, 0], None, 48,
                                               torch.ones(8, 64))


def test_nothing_written_on_a_bad_call(gen):
    inv, _ = tilerope.rope_parameters({"head_dim": 64})
    cache = tilerope.cos_sin_cache(inv, 16)
    q, k = randn(5, 4 * 64, gen=gen), randn(5, 64, gen=gen)
    q0, k0 = q.clone(), k.clone()
    positions = torch.tensor([0, 1, 2, 16, 3])  # 16 is past the cache
    with pytest.raises(ValueError, match="16"):
        tilerope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 64, cache)
    with pytest.raises(ValueError, match="positions"):
        tilerope.apply_rope_with_cos_sin_cache_inplace(positions.float(), q, k, 64, cache)
    with pytest.raises(ValueError, match=r"positions must be \[T\]"):
        tilerope.apply_rope_with_cos_sin_cache_inplace(positions[None], q, k, 64, cache)
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_angle_inputs_take_no_gradient(qkcs):
    q, k, cos, sin = qkcs
    with pytest.raises(ValueError, match="only the rotated tensors take a gradient"):
        tilerope.apply_rotary_pos_emb(q.requires_grad_(), k, cos.requires_grad_(), sin)


def test_non_cpu_tensors_are_refused(qkcs):
    q, k, cos, sin = qkcs
    with pytest.raises(ValueError, match="on meta: this build of tilerope runs on the CPU only"):
        tilerope.apply_rotary_pos_emb(q.to("meta"), k.to("meta"), cos.to("meta"), sin.to("meta"))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", ctypes.c_uint8 * 4), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


def test_cuda_arrays_are_refused_before_any_access():
    """A DLPack capsule that says cuda:0 (its pointer is host memory that must not be read)."""
    buf = (ctypes.c_float * 64)()
    shape = (ctypes.c_int64 * 3)(1, 1, 64)
    strides = (ctypes.c_int64 * 3)(64, 64, 1)
    t = _DLManagedTensor()
    t.dl_tensor = _DLTensor(ctypes.cast(buf, ctypes.c_void_p), _DLDevice(2, 0), 3,
                            (ctypes.c_uint8 * 4)(2, 32, 1, 0), shape, strides, 0)
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.addressof(t), b"dltensor", None)
    angles = _C.angles.frequencies([1.0] * 32)
    with pytest.raises(ValueError, match="q is on cuda:0: this build of tilerope runs on the CPU"):
        _C.rope("neox", capsule, None, None, None, angles)
