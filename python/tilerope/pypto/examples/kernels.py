"""The source material's production RoPE kernels in the pypto dialect: vision RoPE, MRoPE, Qwen3's
fused QK RMSNorm + RoPE, and interleaved RoPE. Each is a kernel factory (the kernel is made for
its head counts, as pypto-gym's ``_make_qk_rope_kernel(num_heads)`` is) and a wrapper that takes
torch tensors, prepares them as the source wrappers do (cos/sin given a heads axis of 1) and
returns new outputs.

Every kernel tiles the token axis by BS_TILE = 8 with a ``valid_shape`` tail,
``cur = (S - i * BS_TILE).min(BS_TILE)``, loops with ``unroll_list=[8, 4, 2, 1]``, sets a tile
of 32 per dim, computes in fp32 and casts back once. q and k of different head counts (GQA) are
rotated in one kernel."""

from __future__ import annotations

import torch

import tilerope.pypto as pypto

BS_TILE = 8
UNROLL = [8, 4, 2, 1]

_DTYPES = {torch.float32: pypto.DT_FP32, torch.float16: pypto.DT_FP16,
           torch.bfloat16: pypto.DT_BF16}


def pypto_dtype(t: torch.dtype):
    """The pypto dtype of a torch dtype."""
    if t not in _DTYPES:
        raise TypeError(f"dtype {t} is not one of float32, float16, bfloat16")
    return _DTYPES[t]


def _rotate_half(x, rows, heads, half):
    """concat([-x2, x1], -1) of x (rows, heads, 2 * half) ... as the skeleton builds it."""
    x1 = pypto.view(x, rows + [heads, half], [0] * len(rows) + [0, 0])
    x2 = pypto.view(x, rows + [heads, half], [0] * len(rows) + [0, half])
    return pypto.concat([pypto.neg(x2), x1], dim=-1)


# ---- vision RoPE: q [S, Nq, D], k [S, Nk, D], cos/sin [S, 1, D] --------------------------------


def make_vision_kernel(nq: int, nk: int, d: int, dtype):
    half = d // 2
    S = pypto.frontend.dynamic("S")

    @pypto.frontend.jit(runtime_options={"stitch_function_max_num": 128},
                        pass_options={"cube_l1_reuse_setting": {-1: 4}})
    def vision_rope_kernel(q: pypto.Tensor([S, nq, d], dtype), k: pypto.Tensor([S, nk, d], dtype),
                           cos: pypto.Tensor([S, 1, d], dtype), sin: pypto.Tensor([S, 1, d], dtype),
                           q_out: pypto.Tensor([S, nq, d], dtype),
                           k_out: pypto.Tensor([S, nk, d], dtype)):
        seq = q.shape[0]
        for bs_idx in pypto.loop((seq + BS_TILE - 1) // BS_TILE, name="LOOP_BS_VISION",
                                 idx_name="bs_idx", unroll_list=UNROLL):
            cur = (seq - bs_idx * BS_TILE).min(BS_TILE)
            pypto.set_vec_tile_shapes(32, 32, 32)
            cos_b = pypto.cast(pypto.view(cos, [BS_TILE, 1, d], [bs_idx * BS_TILE, 0, 0],
                                          valid_shape=[cur, 1, d]), pypto.DT_FP32)
            sin_b = pypto.cast(pypto.view(sin, [BS_TILE, 1, d], [bs_idx * BS_TILE, 0, 0],
                                          valid_shape=[cur, 1, d]), pypto.DT_FP32)
            for x, out, heads in ((q, q_out, nq), (k, k_out, nk)):
                xs = pypto.cast(pypto.view(x, [BS_TILE, heads, d], [bs_idx * BS_TILE, 0, 0],
                                           valid_shape=[cur, heads, d]), pypto.DT_FP32)
                rot = _rotate_half(xs, [BS_TILE], heads, half)
                y = pypto.add(pypto.mul(xs, cos_b), pypto.mul(rot, sin_b))
                pypto.assemble(pypto.cast(y, x.dtype), [bs_idx * BS_TILE, 0, 0], out)

    return vision_rope_kernel


def vision_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' apply_rotary_pos_emb_vision: q [S, Nq, D], k [S, Nk, D], cos/sin [S, D]."""
    kernel = make_vision_kernel(q.shape[1], k.shape[1], q.shape[2], pypto_dtype(q.dtype))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    kernel(q, k, cos.unsqueeze(1), sin.unsqueeze(1), q_out, k_out)
    return q_out, k_out


# ---- MRoPE: q [B, Hq, S, D], k [B, Hk, S, D], cos/sin [3, B, S, D] ---------------------------


def make_mrope_kernel(hq: int, hk: int, d: int, mrope_section, dtype):
    half = d // 2
    widths = [w for w in list(mrope_section) * 2]
    if sum(mrope_section) != half:
        raise ValueError(f"mrope_section {list(mrope_section)} must sum to head_dim/2 ({half})")
    B, S = pypto.frontend.dynamic("B"), pypto.frontend.dynamic("S")

    @pypto.frontend.jit(runtime_options={"stitch_function_max_num": 128})
    def mrope_kernel(q: pypto.Tensor([B, hq, S, d], dtype), k: pypto.Tensor([B, hk, S, d], dtype),
                     cos: pypto.Tensor([3, B, S, d], dtype), sin: pypto.Tensor([3, B, S, d], dtype),
                     q_out: pypto.Tensor([B, hq, S, d], dtype),
                     k_out: pypto.Tensor([B, hk, S, d], dtype)):
        batch, seq = q.shape[0], q.shape[2]

        def sectioned(table, b, s0, cur):
            # cat([c[i % 3] for i, c in enumerate(table.split(section * 2, -1))], -1)
            chunks, at = [], 0
            for i, w in enumerate(widths):
                chunks.append(pypto.view(table, [1, 1, BS_TILE, w], [i % 3, b, s0, at],
                                         valid_shape=[1, 1, cur, w]))
                at += w
            return pypto.cast(pypto.concat(chunks, dim=-1), pypto.DT_FP32)  # (1, 1, 8, D)

        for b in pypto.loop(batch, name="LOOP_B", idx_name="b", unroll_list=[1]):
            for s_idx in pypto.loop((seq + BS_TILE - 1) // BS_TILE, name="LOOP_S",
                                    idx_name="s_idx", unroll_list=UNROLL):
                cur = (seq - s_idx * BS_TILE).min(BS_TILE)
                s0 = s_idx * BS_TILE
                pypto.set_vec_tile_shapes(32, 32, 32, 32)
                cos_b = sectioned(cos, b, s0, cur)
                sin_b = sectioned(sin, b, s0, cur)
                for x, out, heads in ((q, q_out, hq), (k, k_out, hk)):
                    xs = pypto.cast(pypto.view(x, [1, heads, BS_TILE, d], [b, 0, s0, 0],
                                               valid_shape=[1, heads, cur, d]), pypto.DT_FP32)
                    x1 = pypto.view(xs, [1, heads, BS_TILE, half], [0, 0, 0, 0])
                    x2 = pypto.view(xs, [1, heads, BS_TILE, half], [0, 0, 0, half])
                    rot = pypto.concat([pypto.neg(x2), x1], dim=-1)
                    y = pypto.add(pypto.mul(xs, cos_b), pypto.mul(rot, sin_b))
                    pypto.assemble(pypto.cast(y, x.dtype), [b, 0, s0, 0], out)

    return mrope_kernel


def mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mrope_section):
    """transformers' apply_multimodal_rotary_pos_emb (chunked sections) on [B, H, S, D] q and k
    with cos/sin [3, B, S, D]."""
    kernel = make_mrope_kernel(q.shape[1], k.shape[1], q.shape[3], mrope_section,
                               pypto_dtype(q.dtype))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    kernel(q, k, cos, sin, q_out, k_out)
    return q_out, k_out


# ---- Qwen3 QK RMSNorm + RoPE: x [S, N, D], weight [D], cos/sin [S, 1, D] ---------------------


def make_qk_norm_rope_kernel(num_heads: int, d: int, eps: float, dtype):
    half = d // 2
    mean_coff = 1.0 / d
    S = pypto.frontend.dynamic("S")

    @pypto.frontend.jit
    def qk_norm_rope_kernel(x: pypto.Tensor([S, num_heads, d], dtype),
                            w_norm: pypto.Tensor([d], dtype),
                            cos: pypto.Tensor([S, 1, d], dtype), sin: pypto.Tensor([S, 1, d], dtype),
                            out: pypto.Tensor([S, num_heads, d], dtype)):
        seq = x.shape[0]
        bs_loop = (seq + BS_TILE - 1) // BS_TILE
        pypto.set_vec_tile_shapes(1, 1, 32)
        w_3d = pypto.reshape(w_norm, [1, 1, d], inplace=True)
        w_fp32 = pypto.cast(w_3d, pypto.DT_FP32)

        for bs_idx in pypto.loop(bs_loop, name="LOOP_BS_QKROPE", idx_name="bs_idx",
                                 unroll_list=UNROLL):
            cur_bs = (seq - bs_idx * BS_TILE).min(BS_TILE)
            x_tile = pypto.view(x, [BS_TILE, num_heads, d], [bs_idx * BS_TILE, 0, 0],
                                valid_shape=[cur_bs, num_heads, d])
            pypto.set_vec_tile_shapes(32, 32, 32)
            x_fp32 = pypto.cast(x_tile, pypto.DT_FP32)
            mean = pypto.mul(pypto.sum(pypto.mul(x_fp32, x_fp32), -1, keepdim=True), mean_coff)
            normed = pypto.mul(pypto.mul(x_fp32, pypto.rsqrt(pypto.add(mean, eps))), w_fp32)

            # cos/sin tile, first half: o1 = xl*cos - xr*sin, o2 = xr*cos + xl*sin
            cos_b = pypto.cast(pypto.view(cos, [BS_TILE, 1, half], [bs_idx * BS_TILE, 0, 0],
                                          valid_shape=[cur_bs, 1, half]), pypto.DT_FP32)
            sin_b = pypto.cast(pypto.view(sin, [BS_TILE, 1, half], [bs_idx * BS_TILE, 0, 0],
                                          valid_shape=[cur_bs, 1, half]), pypto.DT_FP32)
            x_left = pypto.view(normed, [BS_TILE, num_heads, half], [0, 0, 0])
            x_right = pypto.view(normed, [BS_TILE, num_heads, half], [0, 0, half])
            o1 = pypto.sub(pypto.mul(x_left, cos_b), pypto.mul(x_right, sin_b))
            o2 = pypto.add(pypto.mul(x_right, cos_b), pypto.mul(x_left, sin_b))
            y = pypto.concat([o1, o2], dim=-1)
            pypto.assemble(pypto.cast(y, x.dtype), [bs_idx * BS_TILE, 0, 0], out)

    return qk_norm_rope_kernel


def qk_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 eps: float = 1e-6):
    """Qwen3's per-head RMSNorm then rotate-half RoPE: x [S, N, D], weight [D], cos/sin [S, D]
    (the rotation reads the first half of each row, as the source kernel does)."""
    kernel = make_qk_norm_rope_kernel(x.shape[1], x.shape[2], eps, pypto_dtype(x.dtype))
    out = torch.empty_like(x)
    kernel(x, weight, cos.unsqueeze(1), sin.unsqueeze(1), out)
    return out


# ---- interleaved RoPE: x [B, N, S, D], cos/sin [B, 1, S or 1, D] ------------------------------


def make_interleave_kernel(n: int, d: int, table_seq1: bool, split_half: bool, path: str, dtype):
    half = d // 2
    B, S = pypto.frontend.dynamic("B"), pypto.frontend.dynamic("S")
    ts = 1 if table_seq1 else S
    if path not in ("deinterleave", "gathermask"):
        raise ValueError(f"path must be 'deinterleave' or 'gathermask', got {path!r}")

    def split(v):
        if path == "deinterleave":
            return pypto.deinterleave(v)
        return pypto.gathermask(v, 1), pypto.gathermask(v, 2)

    @pypto.frontend.jit
    def interleave_rope_kernel(x: pypto.Tensor([B, n, S, d], dtype),
                               cos: pypto.Tensor([B, 1, ts, d], dtype),
                               sin: pypto.Tensor([B, 1, ts, d], dtype),
                               out: pypto.Tensor([B, n, S, d], dtype)):
        batch, seq = x.shape[0], x.shape[2]
        for b in pypto.loop(batch, name="LOOP_B", idx_name="b", unroll_list=[1]):
            for s_idx in pypto.loop((seq + BS_TILE - 1) // BS_TILE, name="LOOP_S",
                                    idx_name="s_idx", unroll_list=UNROLL):
                cur = (seq - s_idx * BS_TILE).min(BS_TILE)
                s0 = s_idx * BS_TILE
                pypto.set_vec_tile_shapes(1, 8, 8, 32)  # 32 heads overflow the UB
                xs = pypto.cast(pypto.view(x, [1, n, BS_TILE, d], [b, 0, s0, 0],
                                           valid_shape=[1, n, cur, d]), pypto.DT_FP32)
                rows, at, valid = ((1, [b, 0, 0, 0], [1, 1, 1, d]) if table_seq1
                                   else (BS_TILE, [b, 0, s0, 0], [1, 1, cur, d]))
                c = pypto.cast(pypto.view(cos, [1, 1, rows, d], at, valid_shape=valid),
                               pypto.DT_FP32)
                s = pypto.cast(pypto.view(sin, [1, 1, rows, d], at, valid_shape=valid),
                               pypto.DT_FP32)
                x_e, x_o = split(xs)  # (1, N, 8, D/2)
                if split_half:
                    h = [1, 1, rows, half]
                    c1, c2 = pypto.view(c, h, [0, 0, 0, 0]), pypto.view(c, h, [0, 0, 0, half])
                    s1, s2 = pypto.view(s, h, [0, 0, 0, 0]), pypto.view(s, h, [0, 0, 0, half])
                    y_e = pypto.sub(pypto.mul(x_e, c1), pypto.mul(x_o, s1))
                    y_o = pypto.add(pypto.mul(x_e, s2), pypto.mul(x_o, c2))
                    y = pypto.concat([y_e, y_o], dim=-1)
                else:  # positional tables: the entries at 2k and 2k + 1
                    c_e, c_o = split(c)
                    s_e, s_o = split(s)
                    y_e = pypto.sub(pypto.mul(x_e, c_e), pypto.mul(x_o, s_e))
                    y_o = pypto.add(pypto.mul(x_o, c_o), pypto.mul(x_e, s_o))
                    y = pypto.interleave(y_e, y_o)
                pypto.assemble(pypto.cast(y, x.dtype), [b, 0, s0, 0], out)

    return interleave_rope_kernel


def interleave_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    output: str = "split-half", path: str = "deinterleave"):
    """Interleaved (even/odd pair) RoPE on x [B, N, S, D] with cos/sin [B, 1, S or 1, D]: the
    split-half output of the NPU-compatible form (half-pair tables), or the interleaved GPT-J
    output (positional tables)."""
    if output not in ("split-half", "interleaved"):
        raise ValueError(f"output must be 'split-half' or 'interleaved', got {output!r}")
    kernel = make_interleave_kernel(x.shape[1], x.shape[3], cos.shape[2] == 1 and x.shape[2] != 1,
                                    output == "split-half", path, pypto_dtype(x.dtype))
    out = torch.empty_like(x)
    kernel(x, cos, sin, out)
    return out
