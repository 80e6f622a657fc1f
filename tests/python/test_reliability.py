"""Reliability from Python: many Python threads at once (the GIL is released while a kernel
runs) give the bits of serial calls; every invalid call leaves every tensor it was given as it
was; partial overlaps are errors, exact aliases are in place, strided in-place updates of a
packed qkv touch only q and k."""

import threading

import pytest
import torch
from conftest import hf_cos_sin, randn

import tilerope


def _calls(gen):
    """(name, function of no arguments returning tensors) for a mix of ops and dtypes."""
    calls = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q, k = randn(2, 8, 96, 128, dtype=dtype, gen=gen), randn(2, 2, 96, 128, dtype=dtype, gen=gen)
        cos, sin = hf_cos_sin(torch.arange(96)[None] * 37, 128, dtype=dtype)
        w = torch.rand(128, generator=gen).to(dtype) + 0.5
        calls.append((f"apply_rotary_pos_emb {dtype}",
                      lambda q=q, k=k, c=cos, s=sin: tilerope.apply_rotary_pos_emb(q, k, c, s)))
        calls.append((f"qk_norm_rope {dtype}",
                      lambda q=q, k=k, w=w, c=cos, s=sin: tilerope.qk_norm_rope(q, k, w, w, c, s)))
        calls.append((f"interleave_rope {dtype}",
                      lambda q=q, c=cos, s=sin: (tilerope.interleave_rope(q, c[:, None], s[:, None]),)))
    inv, _ = tilerope.rope_parameters({"head_dim": 128, "rope_theta": 1e6})
    cache = tilerope.cos_sin_cache(inv, 4096)
    positions = torch.randint(0, 4096, (300,), generator=gen)
    query, key = randn(300, 8 * 128, gen=gen), randn(300, 2 * 128, gen=gen)

    def in_place(query=query, key=key):
        qc, kc = query.clone(), key.clone()
        tilerope.apply_rope_with_cos_sin_cache_inplace(positions, qc, kc, 128, cache)
        return qc, kc
    calls.append(("apply_rope_with_cos_sin_cache_inplace", in_place))
    return calls


def test_python_threads_give_the_bits_of_serial_calls(gen):
    calls = _calls(gen)
    serial = [fn() for _, fn in calls]
    results = [[None] * 4 for _ in calls]
    errors = []

    def worker(i, fn):
        try:
            for r in range(4):
                results[i][r] = fn()
        except Exception as e:  # reported below, on the main thread
            errors.append(f"{calls[i][0]}: {e!r}")

    default_threads = tilerope.num_threads()
    for threads in (1, 2):
        tilerope.set_num_threads(threads)  # each call's own OpenMP team
        pool = [threading.Thread(target=worker, args=(i, fn)) for i, (_, fn) in enumerate(calls)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        tilerope.set_num_threads(default_threads)
        assert not errors, errors
        for i, (name, _) in enumerate(calls):
            for r in range(4):
                for got, want in zip(results[i][r], serial[i]):
                    assert torch.equal(got, want), f"{name}, repeat {r}, {threads} OpenMP threads"


def _invalid_calls(gen):
    """(what, function of the _Tensors it may write, the error it must raise)."""
    return [
        ("q float64", lambda t: tilerope.apply_rotary_pos_emb(t.q.double(), t.k, t.cos, t.sin),
         "q has dtype float64"),
        ("k head_dim 32", lambda t: tilerope.apply_rotary_pos_emb(t.q, t.k[..., :32], t.cos, t.sin),
         "k"),
        ("cos of 7 tokens", lambda t: tilerope.apply_rotary_pos_emb(
            t.q, t.k, *hf_cos_sin(torch.arange(7)[None], 64)), "S = 6"),
        ("unsqueeze_dim 3", lambda t: tilerope.apply_rotary_pos_emb(t.q, t.k, t.cos, t.sin, 3),
         r"unsqueeze_dim \(3\)"),
        ("strided last dim", lambda t: tilerope.apply_rotary_pos_emb(
            randn(2, 4, 6, 128)[..., ::2], t.k, t.cos, t.sin), "last dim"),
        ("vision of rank 4", lambda t: tilerope.apply_rotary_pos_emb_vision(
            t.q, t.k, t.cos[0], t.sin[0]), r"q must be \[S, H, D\]; got shape \(2, 4, 6, 64\)"),
        ("mrope_section sum", lambda t: tilerope.apply_multimodal_rotary_pos_emb(
            t.q, t.k, torch.stack([t.cos] * 3), torch.stack([t.sin] * 3), [16, 8, 9]),
         "mrope_section"),
        ("mrope_section of 2", lambda t: tilerope.apply_multimodal_rotary_pos_emb(
            t.q, t.k, torch.stack([t.cos] * 3), torch.stack([t.sin] * 3), [16, 16]),
         "3 entries"),
        ("qk_norm eps -1", lambda t: tilerope.qk_norm_rope(t.q, t.k, t.w, t.w, t.cos, t.sin,
                                                           eps=-1.0), "eps"),
        ("qk_norm eps nan", lambda t: tilerope.qk_norm_rope(t.q, t.k, t.w, t.w, t.cos, t.sin,
                                                            eps=float("nan")), "eps"),
        ("qk_norm eps inf", lambda t: tilerope.qk_norm_rope(t.q, t.k, t.w, t.w, t.cos, t.sin,
                                                            eps=float("inf")), "eps"),
        ("qk_norm weight of 32", lambda t: tilerope.qk_norm_rope(
            t.q, t.k, torch.ones(32), t.w, t.cos, t.sin), "q_weight"),
        ("qk_norm rounding", lambda t: tilerope.qk_norm_rope(
            t.q, t.k, t.w, t.w, t.cos, t.sin, rounding="fp16"), "rounding"),
        ("interleave cos rank", lambda t: tilerope.interleave_rope(t.q, t.cos, t.sin),
         r"cos must be \[B, 1, S, D\]"),
        ("cache position past the end", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.tensor([0, 1, 2, 16, 3]), t.query, t.key, 64, t.cache), "16"),
        ("cache negative position", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.tensor([0, 1, -2, 1, 3]), t.query, t.key, 64, t.cache), "-2"),
        ("cache float positions", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.arange(5).float(), t.query, t.key, 64, t.cache), "positions"),
        ("cache positions [1, T]", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.arange(5)[None], t.query, t.key, 64, t.cache), r"positions must be \[T\]"),
        ("cache head_size 48", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.arange(5), t.query, t.key, 48, t.cache), "head_size = 48"),
        ("cache of odd width", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.arange(5), t.query, t.key, 64, t.cache[:, :63]), r"got shape \(16, 63\)"),
        ("query and key overlapping", lambda t: tilerope.apply_rope_with_cos_sin_cache_inplace(
            torch.arange(5), t.packed[:, : 4 * 64], t.packed[:, 3 * 64: 4 * 64], 64, t.cache),
         r"q \(in place\) \[5, 4, 64\] overlaps k \[5, 1, 64\]"),
        ("rope_parameters head_dim 0", lambda t: tilerope.rope_parameters({"head_dim": 0}),
         r"head_dim \(0\)"),
        ("rope_parameters theta nan", lambda t: tilerope.rope_parameters(
            {"head_dim": 64, "rope_theta": float("nan")}), "rope_theta"),
        ("rope_parameters factor inf", lambda t: tilerope.rope_parameters(
            {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": float("inf")}}),
         "factor"),
        ("rope_parameters head_dim 2^30", lambda t: tilerope.rope_parameters(
            {"head_dim": 1 << 30}), r"head_dim \(1073741824\)"),
        ("rope_parameters of a file nested 100000 deep",
         lambda t: tilerope.rope_parameters(t.deep_config), "deeper than 64"),
    ]


class _Tensors:
    def __init__(self, gen, tmp_path):
        self.deep_config = tmp_path / "deep.json"
        self.deep_config.write_text('{"head_dim": ' + "[" * 100000 + "]" * 100000 + "}")
        self.q, self.k = randn(2, 4, 6, 64, gen=gen), randn(2, 2, 6, 64, gen=gen)
        self.cos, self.sin = hf_cos_sin(torch.arange(6)[None], 64)
        self.w = torch.ones(64)
        inv, _ = tilerope.rope_parameters({"head_dim": 64})
        self.cache = tilerope.cos_sin_cache(inv, 16)
        self.query, self.key = randn(5, 4 * 64, gen=gen), randn(5, 64, gen=gen)
        self.packed = randn(5, 6 * 64, gen=gen)

    def all(self):
        return [self.q, self.k, self.cos, self.sin, self.w, self.cache, self.query, self.key,
                self.packed]


def test_every_invalid_call_raises_and_writes_nothing(gen, tmp_path):
    calls = _invalid_calls(gen)
    assert len(calls) >= 25
    for what, call, message in calls:
        t = _Tensors(gen, tmp_path)
        before = [x.clone() for x in t.all()]
        with pytest.raises((ValueError, TypeError), match=message):
            call(t)
        for x, x0 in zip(t.all(), before):
            assert torch.equal(x, x0), f"{what}: a tensor changed"


def test_exact_alias_is_in_place_and_packed_qkv_updates_only_q_and_k(gen):
    inv, _ = tilerope.rope_parameters({"head_dim": 64})
    cache = tilerope.cos_sin_cache(inv, 64)
    positions = torch.arange(7) * 3
    qkv = randn(7, (4 + 2 + 2) * 64, gen=gen)  # [T, (Hq + 2 Hk) D], strided q and k views
    before = qkv.clone()
    q, k = qkv[:, : 4 * 64], qkv[:, 4 * 64: 6 * 64]
    want_q, want_k = tilerope.apply_rope_with_cos_sin_cache(positions, q.clone(), k.clone(), 64,
                                                            cache)
    tilerope.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 64, cache)
    assert torch.equal(qkv[:, : 4 * 64], want_q)
    assert torch.equal(qkv[:, 4 * 64: 6 * 64], want_k)
    assert torch.equal(qkv[:, 6 * 64:], before[:, 6 * 64:]), "v written"
