"""apply_rope_with_cos_sin_cache (FlashInfer's and vLLM's interface) against transformers'
apply_rotary_pos_emb on the same angles, the fp64 golden, and numpy arrays in place."""

import numpy as np
import pytest
import torch
from conftest import DTYPES, assert_golden, assert_parity, randn, rotate_half
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

import tilerope


def cache_of(max_pos, rotary_dim, theta, dtype):
    inv, _ = tilerope.rope_parameters({"head_dim": rotary_dim, "rope_theta": theta})
    return inv, tilerope.cos_sin_cache(inv, max_pos, dtype=dtype)


def golden(x, positions, cache, rotary_dim, neox):
    """[T, H, D] rotated by cache rows, fp64, pairs as vLLM's forward_static forms them."""
    x = x.double()
    c, s = cache.double()[positions].chunk(2, -1)  # (T, rd/2) each
    c, s = c[:, None], s[:, None]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if neox:
        x1, x2 = rot.chunk(2, -1)
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)
    return torch.cat((out, rest), -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("t,hq,hk,d,rd,flat", [(37, 8, 2, 128, 128, True), (1, 32, 8, 128, 128, False),
                                              (16, 4, 4, 64, 32, True), (5, 2, 1, 80, 80, False)])
def test_cache_rotation(t, hq, hk, d, rd, flat, neox, dtype, gen):
    _, cache = cache_of(8192, rd, 1e6, torch.float32)
    positions = torch.randint(0, 8192, (t,), generator=gen)
    qkv = randn(t, (hq + 2 * hk) * d, dtype=dtype, gen=gen)  # a packed projection, sliced
    query, key = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]
    if not flat:
        query, key = query.view(t, hq, d), key.view(t, hk, d)
    before = qkv.clone()
    q_out, k_out = tilerope.apply_rope_with_cos_sin_cache(positions, query, key, d, cache, neox)
    assert torch.equal(qkv, before)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    for got, x in ((q_out, query), (k_out, key)):
        assert_golden(got.view(t, -1, d), golden(x.view(t, -1, d), positions, cache, rd, neox),
                      dtype)

    tilerope.apply_rope_with_cos_sin_cache_inplace(positions, query, key, d, cache, neox)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
    assert torch.equal(qkv[:, (hq + hk) * d :], before[:, (hq + hk) * d :]), "v written"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cache_matches_transformers_on_the_same_angles(dtype, gen):
    t, h, d = 12, 4, 128
    inv, cache = cache_of(4096, d, 1e4, dtype)
    positions = torch.randint(0, 4096, (t,), generator=gen)
    q, k = randn(t, h, d, dtype=dtype, gen=gen), randn(t, 2, d, dtype=dtype, gen=gen)
    q_out, k_out = tilerope.apply_rope_with_cos_sin_cache(positions, q, k, d, cache)
    cos, sin = cache[positions].chunk(2, -1)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # [T, D] in dtype
    hf_q, hf_k = hf_apply(q, k, cos, sin, unsqueeze_dim=1)
    for got, theirs, x in ((q_out, hf_q, q), (k_out, hf_k, k)):
        terms = (x.double() * cos.double()[:, None]).abs() + (
            rotate_half(x.double()) * sin.double()[:, None]).abs()
        assert_parity(got, theirs, terms, dtype)


def test_key_none_and_numpy_in_place(gen):
    t, h, d = 9, 3, 64
    _, cache = cache_of(512, d, 1e4, torch.float32)
    positions = torch.randint(0, 512, (t,), generator=gen)
    q = randn(t, h * d, gen=gen)
    q_out, k_out = tilerope.apply_rope_with_cos_sin_cache(positions, q, None, d, cache)
    assert k_out is None
    assert_golden(q_out.view(t, h, d), golden(q.view(t, h, d), positions, cache, d, True),
                  torch.float32)
    qn = q.numpy().copy()
    tilerope.apply_rope_with_cos_sin_cache_inplace(positions.numpy(), qn, None, d, cache.numpy())
    np.testing.assert_array_equal(qn, q_out.numpy())


@pytest.mark.parametrize("interleaved", [False, True], ids=["chunked", "interleaved"])
def test_mrope_positions(interleaved, gen):
    """vLLM's MRoPE: positions [3, T]; frequency i reads the cache row of its axis."""
    t, h, d = 20, 4, 128
    section = [24, 20, 20] if interleaved else [16, 24, 24]
    _, cache = cache_of(1024, d, 1e6, torch.float32)
    positions = torch.randint(0, 1024, (3, t), generator=gen)
    q, k = randn(t, h * d, gen=gen), randn(t, 2 * d, gen=gen)
    q_out, k_out = tilerope.apply_rope_with_cos_sin_cache(
        positions, q, k, d, cache, mrope_section=section, mrope_interleaved=interleaved)
    rows = cache[positions]  # (3, T, D): each axis's row
    axis = torch.zeros(d // 2, dtype=torch.long)
    if interleaved:
        axis[1 : 3 * section[1] : 3] = 1
        axis[2 : 3 * section[2] : 3] = 2
    else:
        axis[section[0] : section[0] + section[1]] = 1
        axis[section[0] + section[1] :] = 2
    col = torch.arange(d // 2)
    mixed = torch.cat((rows[axis, :, col].T, rows[axis, :, col + d // 2].T), -1)  # (T, D)
    for got, x in ((q_out, q), (k_out, k)):
        x3 = x.view(t, -1, d).double()
        c, s = mixed.double()[:, None, : d // 2], mixed.double()[:, None, d // 2 :]
        x1, x2 = x3.chunk(2, -1)
        want = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
        assert_golden(got.view(t, -1, d), want, torch.float32)


def test_cache_gradients(gen):
    t, h, d = 6, 2, 64
    _, cache = cache_of(64, d, 1e4, torch.float32)
    positions = torch.randint(0, 64, (t,), generator=gen)
    q = randn(t, h * d, gen=gen).requires_grad_()
    k = randn(t, d, gen=gen).requires_grad_()
    g = randn(t, h * d, gen=gen)
    q_out, k_out = tilerope.apply_rope_with_cos_sin_cache(positions, q, k, d, cache, False)
    ((q_out * g).sum() + k_out.sum()).backward()
    q64 = q.detach().double().requires_grad_()
    (golden(q64.view(t, h, d), positions, cache, d, False).reshape(t, -1) * g.double()).sum().backward()
    assert_golden(q.grad, q64.grad, torch.float32)
