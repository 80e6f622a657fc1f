"""`tilerope apply` against an independent fp64 numpy implementation of each variant, written
from the HF formulas (rope, Qwen2-VL vision, Qwen2-VL / Qwen3-VL MRoPE, Qwen3 QK RMSNorm + RoPE,
interleaved RoPE with the NPU's split-half output), and of HF model configs' frequencies.

Usage: /usr/bin/python3 test_apply.py path/to/tilerope
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
RNG = np.random.default_rng(20240611)
COUNTS = {"passed": 0, "failed": 0}


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


# --- the fp64 reference ------------------------------------------------------------------------


def rope_f64(x, pos, style, theta, r, backward=False):
    """HF's x*cos + rotate(x)*sin in fp64 on the first r dims of x [T, H, D], positions [T].

    Returns (y, mag): y the exact result (up to fp64 rounding) and, per element,
    mag = |x*cos| + |rotate(x)*sin|, the size of the two terms (0 on pass-through dims)."""
    x = np.asarray(x, dtype=np.float64)
    inv_freq = float(theta) ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # [r/2]
    angle = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, r/2]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]  # [T, 1, r/2]
    if backward:
        sin = -sin
    xr = x[..., :r]
    if style == "neox":  # rotate_half: (x1, x2) -> (-x2, x1); cos/sin repeated per half
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        rot = np.concatenate([-xr[..., r // 2:], xr[..., : r // 2]], -1)
    else:  # rotate_every_two: (x0, x1) -> (-x1, x0) per pair; cos/sin repeated per element
        cos, sin = np.repeat(cos, 2, -1), np.repeat(sin, 2, -1)
        rot = np.stack([-xr[..., 1::2], xr[..., 0::2]], -1).reshape(xr.shape)
    y, mag = x.copy(), np.zeros_like(x)
    y[..., :r] = xr * cos + rot * sin
    mag[..., :r] = np.abs(xr * cos) + np.abs(rot * sin)
    return y, mag


def rope_layout(x, pos, layout, style, theta, r, backward=False):
    """rope_f64 of a thd, bshd [B, S, H, D] or bhsd [B, H, S, D] array; pos [T], [S] or [B, S]."""
    if layout == "thd":
        return rope_f64(x, pos, style, theta, r, backward)
    y, mag = np.empty(x.shape), np.empty(x.shape)
    for b in range(x.shape[0]):
        pb = pos if pos.ndim == 1 else pos[b]
        xb = x[b] if layout == "bshd" else x[b].transpose(1, 0, 2)  # [S, H, D]
        yb, mb = rope_f64(xb, pb, style, theta, r, backward)
        if layout == "bhsd":
            yb, mb = yb.transpose(1, 0, 2), mb.transpose(1, 0, 2)
        y[b], mag[b] = yb, mb
    return y, mag


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) on the halves of the last axis (HF's rotate_half)."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def rotate_every_two(x):
    """(x0, x1) -> (-x1, x0) on adjacent pairs of the last axis (GPT-J's rotate_every_two)."""
    return np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)


def rows_f64(x, cos, sin, pairs):
    """x*cos + rotate(x)*sin in fp64 on the first r dims of x [T, H, D] with per-token rows cos,
    sin [T, r], each column used as given (HF's position_embeddings); pairs 'halves'
    (rotate_half) or 'adjacent' (rotate_every_two). Returns (y, mag) as rope_f64."""
    x = np.asarray(x, dtype=np.float64)
    r = cos.shape[-1]
    c, s = np.asarray(cos, np.float64)[:, None, :], np.asarray(sin, np.float64)[:, None, :]
    xr = x[..., :r]
    rot = rotate_half(xr) if pairs == "halves" else rotate_every_two(xr)
    y, mag = x.copy(), np.zeros_like(x)
    y[..., :r] = xr * c + rot * s
    mag[..., :r] = np.abs(xr * c) + np.abs(rot * s)
    return y, mag


def split_half_f64(x, cos, sin):
    """The NPU's interleaved RoPE with split-half output (ops-transformer's InterleaveRope): the
    pairs (x[2i], x[2i+1]) = (xe, xo) of the first r dims, rows cos, sin [T, r]:
    y[i] = xe cos[i] - xo sin[i], y[r/2 + i] = xo cos[r/2 + i] + xe sin[r/2 + i]."""
    x = np.asarray(x, dtype=np.float64)
    r = cos.shape[-1]
    xs = np.concatenate([x[..., 0:r:2], x[..., 1:r:2], x[..., r:]], -1)
    return rows_f64(xs, cos, sin, "halves")


def angle_rows(angles, pairs):
    """Half-width angles [T, r/2] as full rows [T, r]: repeated per half or per pair."""
    if pairs == "halves":
        return np.concatenate([angles, angles], -1)
    return np.repeat(angles, 2, -1)


def rows_layout(x, cos, sin, layout, fn):
    """fn(x [S, H, D], cos [S, r], sin [S, r]) over a thd, bshd or bhsd array; rows [T, r],
    [S, r] (shared by the batch) or [B, S, r]."""
    if layout == "thd":
        return fn(x, cos, sin)
    y, mag = np.empty(x.shape), np.empty(x.shape)
    for b in range(x.shape[0]):
        cb, sb = (cos, sin) if cos.ndim == 2 else (cos[b], sin[b])
        xb = x[b] if layout == "bshd" else x[b].transpose(1, 0, 2)
        yb, mb = fn(xb, cb, sb)
        if layout == "bhsd":
            yb, mb = yb.transpose(1, 0, 2), mb.transpose(1, 0, 2)
        y[b], mag[b] = yb, mb
    return y, mag


def vision_angles(pos_hw, D, theta):
    """Qwen2-VL's VisionRotaryEmbedding(D/2) and rot_pos_emb: [S, D] angles of the patches at
    (row, col) = pos_hw [S, 2]: D/4 frequencies theta^(-2j/(D/2)) for the row, the same for the
    column, then cat(freqs, freqs) as apply_rotary_pos_emb_vision takes them."""
    dim = D // 2
    inv = 1.0 / float(theta) ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # [D/4]
    p = np.asarray(pos_hw, dtype=np.float64)
    f = np.concatenate([p[:, 0:1] * inv, p[:, 1:2] * inv], -1)  # [S, D/2]
    return np.concatenate([f, f], -1)


def select_mrope_planes(planes, section, layout):
    """HF's choice of one plane [3, T, r] per column, giving rows [T, r]. chunked (Qwen2-VL's
    apply_multimodal_rotary_pos_emb): the columns split by mrope_section * 2, chunk i from plane
    i % 3. interleaved (Qwen3-VL's apply_interleaved_mrope on the half-width frequencies, then
    cat(freqs, freqs)): plane 1 at columns 1, 4, ... below 3 * section[1], plane 2 at 2, 5, ...
    below 3 * section[2], plane 0 elsewhere."""
    if layout == "chunked":
        chunks = np.split(planes, np.cumsum(list(section) * 2)[:-1], axis=-1)
        return np.concatenate([c[i % 3] for i, c in enumerate(chunks)], -1)
    h = planes.shape[-1] // 2
    out = planes[0].copy()
    for half in (slice(0, h), slice(h, 2 * h)):
        part = out[..., half]
        for dim, offset in ((1, 1), (2, 2)):
            idx = slice(offset, section[dim] * 3, 3)
            part[..., idx] = planes[dim][..., half][..., idx]
        out[..., half] = part
    return out


def mrope_angles(ids, section, layout, inv_freq):
    """HF's MRoPE angles [T, r] for positions ids [3, T]: per axis the plain angles
    cat(freqs, freqs), then select_mrope_planes."""
    freqs = np.asarray(ids, np.float64)[:, :, None] * inv_freq[None, None, :]  # [3, T, r/2]
    return select_mrope_planes(np.concatenate([freqs, freqs], -1), section, layout)


def inv_freq_f64(theta, r):
    return float(theta) ** (-np.arange(0, r, 2, dtype=np.float64) / r)


def rms_norm_f64(x, w, eps):
    """Qwen3RMSNorm in fp64 over the last axis: x / sqrt(mean(x^2) + eps) * w."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * np.asarray(w, np.float64)


def qk_norm_rope_f64(x, w, eps, pos, style, theta, r):
    """Qwen3's q_norm / k_norm, then RoPE (rope_f64), in fp64. Returns (y, mag)."""
    return rope_f64(rms_norm_f64(x, w, eps), pos, style, theta, r)


# --- bf16 in integer arithmetic, f16 through numpy -----------------------------------------------


def f64_to_bf16_bits(v):
    """fp64 -> bf16 bits, round to nearest even, straight from the fp64 bits (one rounding, no
    trip through fp32). Finite inputs below the bf16 overflow threshold."""
    bits = np.ascontiguousarray(v, dtype=np.float64).view(np.uint64)
    sign = (bits >> np.uint64(63)).astype(np.int64)
    biased = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    frac = bits & np.uint64((1 << 52) - 1)
    sig = np.where(biased > 0, frac | np.uint64(1 << 52), frac)  # |v| = sig * 2^(e - 52)
    e = np.maximum(biased, 1) - 1023
    # bf16 keeps 8 significant bits down to 2^-126, then a fixed quantum of 2^-133 (subnormals):
    # quantum exponent qe = max(e, -126) - 7, so drop `shift` low bits of sig.
    qe = np.maximum(e, -126) - 7
    shift = np.minimum(qe - (e - 52), 60).astype(np.uint64)
    q = sig >> shift
    rem = sig - (q << shift)
    half = np.uint64(1) << (shift - np.uint64(1))
    q = q + ((rem > half) | ((rem == half) & (q & np.uint64(1) == 1))).astype(np.uint64)
    # q * 2^qe as bf16 bits: ((qe + 133) << 7) + q covers normals, subnormals and the carry into
    # the next binade alike.
    out = ((qe + 133) << 7) + q.astype(np.int64)
    return (out | (sign << 15)).astype(np.uint16)


def bf16_bits_to_f64(b):
    wide = np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16
    return wide.view(np.float32).astype(np.float64)


def ulp_bf16(v):
    """One bf16 step in the binade of v: 2^(e - 8) for |v| in [2^(e-1), 2^e); 2^-133 minimum."""
    _, e = np.frexp(np.abs(v))
    return np.ldexp(1.0, np.maximum(e - 8, -133))


def ulp_f16(v):
    """numpy's float16 spacing at |v| rounded to f16."""
    return np.spacing(np.abs(v).astype(np.float16)).astype(np.float64)


def stored(x, dt):
    """The values an array of fp64 x holds once saved as dt."""
    if dt == "bf16":
        return bf16_bits_to_f64(f64_to_bf16_bits(x))
    return x.astype(np.float16 if dt == "f16" else np.float32).astype(np.float64)


def correctly_rounded(exact, dt):
    if dt == "bf16":
        return bf16_bits_to_f64(f64_to_bf16_bits(exact))
    return exact.astype(np.float16).astype(np.float64)


# --- running the CLI ---------------------------------------------------------------------------

NPY = {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}


def save(path, x, dt):
    if dt == "bf16":
        np.save(path, f64_to_bf16_bits(x))
    else:
        np.save(path, x.astype(np.float16 if dt == "f16" else np.float32))


def load(path, dt, shape):
    """The output as fp64, or an error string if its dtype or shape is not the input's."""
    a = np.load(path)
    if a.dtype.str != NPY[dt] or a.shape != tuple(shape):
        return f"{path} is {a.dtype.str} {a.shape}, want {NPY[dt]} {tuple(shape)}"
    return bf16_bits_to_f64(a) if dt == "bf16" else a.astype(np.float64)


def apply(tmp, q, k, style, theta, dt="f32", pos=None, offset=None, extra=()):
    """Runs `tilerope apply` on q (and k), values already representable in dt; returns
    (q_out, k_out) in fp64, or (error text, None)."""
    p = lambda name: os.path.join(tmp, name)
    save(p("q.npy"), q, dt)
    args = ["apply", "--q", p("q.npy"), "--style", style, "--theta", theta, "--out-q", p("oq.npy")]
    if k is not None:
        save(p("k.npy"), k, dt)
        args += ["--k", p("k.npy"), "--out-k", p("ok.npy")]
    if offset is None:
        np.save(p("pos.npy"), pos)
        args += ["--positions", p("pos.npy")]
    else:
        args += ["--offset", offset]
    if dt == "bf16":
        args += ["--dtype", "bf16"]
    args = [BINARY, *map(str, args), *map(str, extra)]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        return f"exit {run.returncode}: {run.stderr.strip()}", None
    qo = load(p("oq.npy"), dt, q.shape)
    ko = load(p("ok.npy"), dt, k.shape) if k is not None else None
    if isinstance(ko, str):
        return ko, None
    return qo, ko


def compare(name, outs, wants, tol_text, within):
    """One check: each (out, (exact, mag)) pair meets within(out, exact, mag) -> (ok, worst)."""
    if isinstance(outs[0], str):
        check(False, f"{name}: {outs[0]}")
        return False
    ok, worst = True, 0.0
    for out, (exact, mag) in zip(outs, wants):
        good, w = within(out, exact, mag)
        ok, worst = ok and good, max(worst, w)
    check(ok, f"{name}: worst {worst:.3g} {tol_text}")
    return ok


def abs_within(limit):
    def within(out, exact, mag):
        err = np.abs(out - exact).max(initial=0.0)
        return err <= limit, err
    return within


def ulp_within(dt, table_rel=0.0, table_abs=0.0):
    """|out - exact| <= one ulp of dt at exact, plus the fp32 arithmetic the kernels use
    (4 fp32 roundings of the terms: 2^-22 * mag, which only matters where the two terms cancel)
    and, for a table in dt, the rounding of its cos/sin (table_rel * mag + table_abs). The worst
    is reported in units of that bound."""
    ulp = ulp_bf16 if dt == "bf16" else ulp_f16

    def within(out, exact, mag):
        bound = ulp(exact) + (2.0**-22 + table_rel) * mag + table_abs
        ratio = (np.abs(out - exact) / bound).max(initial=0.0)
        return ratio <= 1.0, ratio
    return within


def uniform(shape, dt="f32", lo=-4.0, hi=4.0):
    return stored(RNG.uniform(lo, hi, shape), dt)


def cli(tmp, ins, extra, outs):
    """Runs `tilerope apply` with the input arrays ins {flag: (array, dt)} (dt f32, f16 or bf16
    for float data, None to save the array as it is), the other flags `extra` and the outputs
    outs {flag: (dt, shape)}. Returns the outputs in fp64, in outs' order, or [error text]."""
    p = lambda flag: os.path.join(tmp, flag.strip("-") + ".npy")
    args = [BINARY, "apply"]
    for flag, (arr, dt) in ins.items():
        if dt is None:
            np.save(p(flag), arr)
        else:
            save(p(flag), arr, dt)
        args += [flag, p(flag)]
    for flag in outs:
        if os.path.exists(p(flag)):
            os.remove(p(flag))
        args += [flag, p(flag)]
    run = subprocess.run(args + [str(e) for e in extra], capture_output=True, text=True)
    if run.returncode != 0:
        return [f"exit {run.returncode}: {run.stderr.strip()}"]
    got = [load(p(flag), dt, shape) for flag, (dt, shape) in outs.items()]
    bad = [g for g in got if isinstance(g, str)]
    return bad[:1] if bad else got


def qk(q, k, dt="f32"):
    """The ins and outs of cli() for q and k (k may be None)."""
    ins, outs = {"--q": (q, dt)}, {"--out-q": (dt, q.shape)}
    if k is not None:
        ins["--k"], outs["--out-k"] = (k, dt), (dt, k.shape)
    return ins, outs


def round_trip(tmp, name, q, k, extra, dt="f32", ins_extra=None):
    """apply, then --backward on its outputs with the same flags, gives q and k back."""
    ins, outs = qk(q, k, dt)
    ins.update(ins_extra or {})
    fwd = cli(tmp, ins, extra, outs)
    if isinstance(fwd[0], str):
        check(False, f"{name} backward(apply(x)) == x: {fwd[0]}")
        return
    ins, _ = qk(fwd[0], fwd[1] if k is not None else None, dt)
    ins.update(ins_extra or {})
    back = cli(tmp, ins, list(extra) + ["--backward"], outs)
    compare(f"{name} backward(apply(x)) == x", back, [(q, None), (k, None)][: len(back)],
            "<= 1e-5 abs", abs_within(1e-5))


def test_vision(tmp):
    """Qwen2-VL's vision tower: rows [S, D] as HF passes them, or (row, col) positions [S, 2]."""
    theta = 10000.0
    for D in (80, 64):
        S = 37
        q, k = uniform((S, 16, D)), uniform((S, 16, D))
        pos_hw = RNG.integers(0, 1024, (S, 2))
        ang = vision_angles(pos_hw, D, theta)
        want = lambda cos, sin: [rows_f64(x, cos, sin, "halves") for x in (q, k)]
        # rows: HF computes them in fp32; they are used as given
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        ins, outs = qk(q, k)
        ins.update({"--cos": (cos, None), "--sin": (sin, None)})
        compare(f"vision rows [S, D] f32 D={D}", cli(tmp, ins, ["--variant", "vision"], outs),
                want(cos, sin), "<= 2e-6 abs", abs_within(2e-6))
        # 2D positions, int32 and int64, angles from --theta (and from an f32 table)
        for kind, extra in (("int32", []), ("int64", []), ("int64", ["--table", "f32"])):
            ins, outs = qk(q, k)
            ins["--positions"] = (pos_hw.astype(kind), None)
            outs_got = cli(tmp, ins, ["--variant", "vision", "--theta", theta] + extra, outs)
            compare(f"vision positions [S, 2] {kind} D={D} {' '.join(extra)}".strip(), outs_got,
                    want(np.cos(ang), np.sin(ang)), "<= 2e-6 + 2^-24 * mag abs",
                    lambda o, e, m: ((np.abs(o - e) - 2.0**-24 * m).max() <= 2e-6,
                                     (np.abs(o - e) - 2.0**-24 * m).max()))
    # bf16 rows and x: one ulp of the exact result with the rows as given
    S, D = 29, 80
    q = uniform((S, 16, D), "bf16")
    ang = vision_angles(RNG.integers(0, 1024, (S, 2)), D, theta)
    cos, sin = stored(np.cos(ang), "bf16"), stored(np.sin(ang), "bf16")
    ins, outs = qk(q, None, "bf16")
    ins.update({"--cos": (cos, "bf16"), "--sin": (sin, "bf16")})
    compare("vision rows bf16", cli(tmp, ins, ["--variant", "vision", "--dtype", "bf16"], outs),
            [rows_f64(q, cos, sin, "halves")], "of 1 ulp", ulp_within("bf16"))
    # backward(apply(x)) == x, with positions and with rows
    pos_hw = RNG.integers(0, 1024, (S, 2))
    q, k = uniform((S, 4, D)), uniform((S, 4, D))
    round_trip(tmp, "vision positions", q, k, ["--variant", "vision", "--theta", theta],
               ins_extra={"--positions": (pos_hw, None)})
    ang = vision_angles(pos_hw, D, theta)
    rows = {"--cos": (np.cos(ang).astype(np.float32), None),
            "--sin": (np.sin(ang).astype(np.float32), None)}
    round_trip(tmp, "vision rows", q, k, ["--variant", "vision"], ins_extra=rows)


def test_mrope(tmp):
    """MRoPE: positions [3, T] with Qwen2-VL's chunked and Qwen3-VL's interleaved sections, and
    precomputed planes [3, T, D]; q and k with different head counts."""
    theta = 1000000.0
    for layout, section, D in (("chunked", (16, 24, 24), 128), ("interleaved", (24, 20, 20), 128),
                               ("chunked", (4, 6, 6), 64), ("interleaved", (8, 12, 12), 80)):
        T, r = 21, 2 * sum(section)
        q, k = uniform((T, 8, D)), uniform((T, 2, D))
        ids = RNG.integers(0, 65536, (3, T))
        ang = mrope_angles(ids, section, layout, inv_freq_f64(theta, r))
        wants = [rows_f64(x, np.cos(ang), np.sin(ang), "halves") for x in (q, k)]
        flags = ["--variant", "mrope", "--section", ",".join(map(str, section))]
        if layout == "interleaved":
            flags += ["--section-layout", "interleaved"]
        if r != D:
            flags += ["--rotary-dim", r]
        name = f"mrope {layout} {list(section)} D={D}"
        for kind in ("int32", "int64"):
            ins, outs = qk(q, k)
            ins["--positions"] = (ids.astype(kind), None)
            compare(f"{name} positions [3, T] {kind}",
                    cli(tmp, ins, flags + ["--theta", theta], outs), wants, "<= 2e-6 abs",
                    abs_within(2e-6))
        ins, outs = qk(q, k)
        ins["--positions"] = (ids, None)
        got = cli(tmp, ins, flags + ["--theta", theta, "--table", "f32"], outs)

        def table_within(out, exact, mag):
            err = (np.abs(out - exact) - 2.0**-24 * mag).max(initial=0.0)
            return err <= 2e-6, err
        compare(f"{name} --table f32", got, wants, "<= 2e-6 + 2^-24 * mag abs", table_within)
        if r != D:
            same = not isinstance(got[0], str) and all(
                np.array_equal(o[..., r:], x[..., r:]) for o, x in zip(got, (q, k)))
            check(same, f"{name}: dims {r}..{D - 1} passed through bit-exact")
        # planes [3, T, r]: per-axis fp32 tables as HF builds them, each column used as given
        freqs = ids[:, :, None].astype(np.float64) * inv_freq_f64(theta, r)[None, None, :]
        planes = np.concatenate([freqs, freqs], -1)
        cos_p, sin_p = np.cos(planes).astype(np.float32), np.sin(planes).astype(np.float32)
        cos, sin = (select_mrope_planes(v.astype(np.float64), section, layout)
                    for v in (cos_p, sin_p))
        ins, outs = qk(q, k)
        ins.update({"--cos": (cos_p, None), "--sin": (sin_p, None)})
        compare(f"{name} planes [3, T, {r}]", cli(tmp, ins, flags, outs),
                [rows_f64(x, cos, sin, "halves") for x in (q, k)], "<= 2e-6 abs",
                abs_within(2e-6))
        round_trip(tmp, f"{name} positions", q, k, flags + ["--theta", theta],
                   ins_extra={"--positions": (ids, None)})
        round_trip(tmp, f"{name} planes", q, k, flags,
                   ins_extra={"--cos": (cos_p, None), "--sin": (sin_p, None)})
    # f16: one ulp of the exact result
    T, D, section = 17, 128, (16, 24, 24)
    q, k = uniform((T, 8, D), "f16"), uniform((T, 2, D), "f16")
    ids = RNG.integers(0, 65536, (3, T)).astype(np.int32)
    ang = mrope_angles(ids, section, "chunked", inv_freq_f64(theta, D))
    ins, outs = qk(q, k, "f16")
    ins["--positions"] = (ids, None)
    compare("mrope chunked f16", cli(tmp, ins, ["--variant", "mrope", "--section", "16,24,24",
                                                "--theta", theta], outs),
            [rows_f64(x, np.cos(ang), np.sin(ang), "halves") for x in (q, k)], "of 1 ulp",
            ulp_within("f16"))


def test_interleave(tmp):
    """Interleaved RoPE (adjacent pairs), output interleaved or split-half (the NPU form)."""
    theta = 10000.0
    for out_layout in ("interleaved", "split-half"):
        pairs = "adjacent" if out_layout == "interleaved" else "halves"
        fn = (lambda x, c, s: rows_f64(x, c, s, "adjacent")) if out_layout == "interleaved" \
            else split_half_f64
        flags = ["--variant", "interleave", "--output-layout", out_layout]
        # angles from --theta: positions [T] or --offset, partial rotary, GQA
        for D, r, kind in ((128, 128, "int64"), (64, 32, "offset"), (80, 80, "int32")):
            T = 19
            q, k = uniform((T, 8, D)), uniform((T, 2, D))
            ins, outs = qk(q, k)
            extra = flags + ["--theta", theta] + (["--rotary-dim", r] if r != D else [])
            if kind == "offset":
                pos = np.arange(60000, 60000 + T)
                extra += ["--offset", 60000]
            else:
                pos = RNG.integers(0, 65536, T).astype(kind)
                ins["--positions"] = (pos, None)
            ang = pos[:, None].astype(np.float64) * inv_freq_f64(theta, r)[None, :]
            cos, sin = np.cos(angle_rows(ang, pairs)), np.sin(angle_rows(ang, pairs))
            got = cli(tmp, ins, extra, outs)
            name = f"interleave {out_layout} D={D} rotary_dim={r} positions {kind}"
            if compare(name, got, [fn(x, cos, sin) for x in (q, k)], "<= 2e-6 abs",
                       abs_within(2e-6)) and r != D:
                same = all(np.array_equal(o[..., r:], x[..., r:]) for o, x in zip(got, (q, k)))
                check(same, f"{name}: dims {r}..{D - 1} passed through bit-exact")
        # rows [T, D] as given (thd); the NPU's split-half output reads half-pair tables
        T, D = 23, 64
        q, k = uniform((T, 8, D)), uniform((T, 2, D))
        cos = RNG.uniform(-1, 1, (T, D)).astype(np.float32)
        sin = RNG.uniform(-1, 1, (T, D)).astype(np.float32)
        ins, outs = qk(q, k)
        ins.update({"--cos": (cos, None), "--sin": (sin, None)})
        compare(f"interleave {out_layout} rows [T, D] (arbitrary values)",
                cli(tmp, ins, flags, outs),
                [fn(x, cos, sin) for x in (q, k)], "<= 2e-6 abs", abs_within(2e-6))
        # half-width rows [T, D/2]: one entry per pair
        ang = RNG.uniform(-np.pi, np.pi, (T, D // 2))
        ch, sh = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        ins, outs = qk(q, k)
        ins.update({"--cos": (ch, None), "--sin": (sh, None)})
        compare(f"interleave {out_layout} rows [T, D/2]", cli(tmp, ins, flags, outs),
                [fn(x, angle_rows(ch.astype(np.float64), pairs),
                    angle_rows(sh.astype(np.float64), pairs)) for x in (q, k)],
                "<= 2e-6 abs", abs_within(2e-6))
        # bshd and bhsd with rows [S, D] (shared) or [B, S, D]
        B, S = 2, 9
        for layout in ("bshd", "bhsd"):
            for rows_shape in ((S, D), (B, S, D)):
                shape = lambda h: (B, S, h, D) if layout == "bshd" else (B, h, S, D)
                q, k = uniform(shape(4)), uniform(shape(2))
                ang = RNG.uniform(-np.pi, np.pi, rows_shape[:-1] + (D // 2,))
                cos = np.cos(angle_rows(ang, pairs)).astype(np.float32)
                sin = np.sin(angle_rows(ang, pairs)).astype(np.float32)
                ins, outs = qk(q, k)
                ins.update({"--cos": (cos, None), "--sin": (sin, None)})
                got = cli(tmp, ins, flags + ["--layout", layout], outs)
                wants = [rows_layout(x, cos.astype(np.float64), sin.astype(np.float64), layout, fn)
                         for x in (q, k)]
                compare(f"interleave {out_layout} {layout} rows {list(rows_shape)}", got, wants,
                        "<= 2e-6 abs", abs_within(2e-6))
                round_trip(tmp, f"interleave {out_layout} {layout} rows {list(rows_shape)}", q, k,
                           flags + ["--layout", layout],
                           ins_extra={"--cos": (cos, None), "--sin": (sin, None)})
        # f16 and bf16: one ulp
        for dt in ("f16", "bf16"):
            T, D = 17, 128
            q = uniform((T, 8, D), dt)
            pos = RNG.integers(0, 65536, T)
            ang = pos[:, None].astype(np.float64) * inv_freq_f64(theta, D)[None, :]
            ins, outs = qk(q, None, dt)
            ins["--positions"] = (pos, None)
            extra = flags + ["--theta", theta] + (["--dtype", dt] if dt == "bf16" else [])
            compare(f"interleave {out_layout} {dt}", cli(tmp, ins, extra, outs),
                    [fn(q, np.cos(angle_rows(ang, pairs)), np.sin(angle_rows(ang, pairs)))],
                    "of 1 ulp", ulp_within(dt))
        # backward(apply(x)) == x with positions
        T, D = 15, 64
        q, k = uniform((T, 4, D)), uniform((T, 2, D))
        round_trip(tmp, f"interleave {out_layout} positions", q, k, flags + ["--theta", theta],
                   ins_extra={"--positions": (RNG.integers(0, 65536, T), None)})


def f32_to_bf16_values(v):
    return bf16_bits_to_f64(f64_to_bf16_bits(np.asarray(v, np.float64)))


def hf_qwen3_bf16(x, w, eps, pos, theta, D):
    """A numpy emulation of HF's Qwen3 attention in bf16 (Qwen3RMSNorm, then
    apply_rotary_pos_emb with Qwen3RotaryEmbedding's cos/sin), rounding where torch rounds:
    - norm: x to fp32, variance = mean(x^2) in fp32, x * rsqrt(variance + eps) in fp32, rounded
      to bf16; weight * that rounded to bf16 (one product of two bf16 values);
    - cos/sin: inv_freq = 1 / fp32(theta ^ fp32(2i/D)) in fp32, angle fp32(p) * inv_freq in
      fp32, cos/sin of it rounded to fp32 and then to bf16 (`.to(x.dtype)`);
    - q*cos and rotate_half(q)*sin each rounded to bf16, their sum rounded to bf16.
    Returns (y, larger term |q*cos| or |rotate_half(q)*sin|)."""
    x32 = np.asarray(x, np.float32)
    var = np.mean(x32 * x32, -1, keepdims=True, dtype=np.float32)
    r = (np.float32(1) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    n = f32_to_bf16_values((x32 * r).astype(np.float32))
    h = f32_to_bf16_values(n * np.asarray(w, np.float64))
    exponent = np.arange(0, D, 2, dtype=np.float32) / np.float32(D)
    power = (np.float64(np.float32(theta)) ** exponent.astype(np.float64)).astype(np.float32)
    inv = np.float32(1) / power
    angle = (np.asarray(pos, np.float32)[:, None] * inv[None, :]).astype(np.float32)
    emb = np.concatenate([angle, angle], -1).astype(np.float64)
    cos = f32_to_bf16_values(np.cos(emb).astype(np.float32))[:, None, :]
    sin = f32_to_bf16_values(np.sin(emb).astype(np.float32))[:, None, :]
    a = f32_to_bf16_values(h * cos)
    b = f32_to_bf16_values(rotate_half(h) * sin)
    y = f32_to_bf16_values((a + b).astype(np.float32))
    return y, np.maximum(np.abs(a), np.abs(b))


def test_qk_norm_rope(tmp):
    """Qwen3 QK RMSNorm + RoPE: fp32_once against fp64, hf_qwen3 against HF's rounding chain."""
    theta, eps = 1000000.0, 1e-6
    # fp32_once, f32: the usual 2e-6 (the normalised values are smaller than |x| <= 4)
    for style, D, r, kind, layout in (("neox", 128, 128, "int64", "thd"),
                                      ("gptj", 64, 64, "offset", "thd"),
                                      ("neox", 128, 64, "int32", "thd"),
                                      ("neox", 64, 64, "[S]", "bshd"),
                                      ("neox", 64, 64, "[B, S]", "bhsd")):
        T = 13
        if layout == "thd":
            q, k = uniform((T, 8, D)), uniform((T, 2, D))
        else:
            B = 2
            shape = lambda h: (B, T, h, D) if layout == "bshd" else (B, h, T, D)
            q, k = uniform(shape(8)), uniform(shape(2))
        wq, wk = uniform((D,), lo=0.25, hi=2.0), uniform((D,), lo=0.25, hi=2.0)
        ins, outs = qk(q, k)
        ins.update({"--q-weight": (wq, "f32"), "--k-weight": (wk, "f32")})
        extra = ["--variant", "qk-norm-rope", "--style", style, "--theta", theta,
                 "--layout", layout] + (["--rotary-dim", r] if r != D else [])
        if kind == "offset":
            pos = np.arange(1000, 1000 + T)
            extra += ["--offset", 1000]
        elif kind.startswith("["):
            pos = RNG.integers(0, 65536, T if kind == "[S]" else (2, T))
            ins["--positions"] = (pos, None)
        else:
            pos = RNG.integers(0, 65536, T).astype(kind)
            ins["--positions"] = (pos, None)
        got = cli(tmp, ins, extra, outs)
        wants = [rope_layout(rms_norm_f64(x, w, eps), pos, layout, style, theta, r)
                 for x, w in ((q, wq), (k, wk))]
        compare(f"qk-norm-rope fp32_once f32 {style} {layout} D={D} rotary_dim={r} "
                f"positions {kind}", got, wants, "<= 2e-6 abs", abs_within(2e-6))
    # --eps 0.1 and no k
    T, D = 9, 64
    q, wq = uniform((T, 4, D)), uniform((D,), lo=0.25, hi=2.0)
    pos = RNG.integers(0, 65536, T)
    ins, outs = qk(q, None)
    ins.update({"--q-weight": (wq, "f32"), "--positions": (pos, None)})
    compare("qk-norm-rope fp32_once --eps 0.1",
            cli(tmp, ins, ["--variant", "qk-norm-rope", "--theta", theta, "--eps", 0.1], outs),
            [qk_norm_rope_f64(q, wq, 0.1, pos, "neox", theta, D)], "<= 2e-6 abs",
            abs_within(2e-6))
    # fp32_once, f16 and bf16 (weights in the x dtype): one ulp of the exact result
    for dt in ("f16", "bf16"):
        T, D = 17, 128
        q, k = uniform((T, 8, D), dt), uniform((T, 2, D), dt)
        wq, wk = uniform((D,), dt, 0.25, 2.0), uniform((D,), dt, 0.25, 2.0)
        pos = RNG.integers(0, 65536, T)
        ins, outs = qk(q, k, dt)
        ins.update({"--q-weight": (wq, dt), "--k-weight": (wk, dt), "--positions": (pos, None)})
        extra = ["--variant", "qk-norm-rope", "--theta", theta] + \
            (["--dtype", "bf16"] if dt == "bf16" else [])
        compare(f"qk-norm-rope fp32_once {dt}", cli(tmp, ins, extra, outs),
                [qk_norm_rope_f64(x, w, eps, pos, "neox", theta, D) for x, w in ((q, wq), (k, wk))],
                "of 1 ulp", ulp_within(dt))
    # hf_qwen3, bf16, HF's fp32 angles (--precision hf_compat): one bf16 ulp of the larger term
    # of the emulated chain (the kernel sums the squares in another order, which may move a
    # rounding of the normalised x by one ulp), and nearly always bit-identical
    for D in (128, 64):
        T = 31
        q, k = uniform((T, 16, D), "bf16"), uniform((T, 4, D), "bf16")
        wq, wk = uniform((D,), "bf16", 0.25, 2.0), uniform((D,), "bf16", 0.25, 2.0)
        pos = RNG.integers(0, 32768, T)
        ins, outs = qk(q, k, "bf16")
        ins.update({"--q-weight": (wq, "bf16"), "--k-weight": (wk, "bf16"),
                    "--positions": (pos, None)})
        got = cli(tmp, ins, ["--variant", "qk-norm-rope", "--theta", theta, "--dtype", "bf16",
                             "--rounding", "hf_qwen3", "--precision", "hf_compat"], outs)
        wants = [hf_qwen3_bf16(x, w, eps, pos, theta, D) for x, w in ((q, wq), (k, wk))]

        def one_ulp_of_term(out, emulated, term):
            ratio = (np.abs(out - emulated) / ulp_bf16(term)).max(initial=0.0)
            return ratio <= 1.0, ratio
        name = f"qk-norm-rope hf_qwen3 bf16 D={D} vs HF's rounding chain"
        if compare(name, got, wants, "of 1 bf16 ulp of the larger term", one_ulp_of_term):
            hits = sum(int((o == w[0]).sum()) for o, w in zip(got, wants))
            total = sum(o.size for o in got)
            check(hits >= 0.99 * total, f"{name}: {hits}/{total} outputs bit-identical")


def test_qk_norm_backward(tmp):
    """qk-norm-rope --backward: dx and dw against central finite differences of the fp64 forward
    (h = 1e-5: truncation ~1e-10, far below the fp32 arithmetic of the kernel)."""
    theta, eps, fd_h = 10000.0, 1e-6, 1e-5
    for style, D, r in (("neox", 32, 32), ("gptj", 32, 32), ("neox", 48, 32)):
        T, Hq, Hk = 4, 3, 2
        q, k = uniform((T, Hq, D)), uniform((T, Hk, D))
        wq, wk = uniform((D,), lo=0.25, hi=2.0), uniform((D,), lo=0.25, hi=2.0)
        gq, gk = uniform((T, Hq, D), lo=-1, hi=1), uniform((T, Hk, D), lo=-1, hi=1)
        pos = RNG.integers(0, 65536, T)

        def loss_rows(x, w, g):  # per-row sum(g * y), [T, H]
            return (g * qk_norm_rope_f64(x, w, eps, pos, style, theta, r)[0]).sum(-1)

        def fd_dx(x, w, g):  # rows are independent: perturb dim j of every row at once
            dx = np.empty(x.shape)
            for j in range(D):
                e = np.zeros(x.shape)
                e[..., j] = fd_h
                dx[..., j] = (loss_rows(x + e, w, g) - loss_rows(x - e, w, g)) / (2 * fd_h)
            return dx

        def fd_dw(x, w, g):
            dw = np.empty(D)
            for j in range(D):
                e = np.zeros(D)
                e[j] = fd_h
                dw[j] = (loss_rows(x, w + e, g).sum() - loss_rows(x, w - e, g).sum()) / (2 * fd_h)
            return dw

        ins, outs = qk(q, k)
        ins.update({"--q-weight": (wq, "f32"), "--k-weight": (wk, "f32"),
                    "--grad-q": (gq, "f32"), "--grad-k": (gk, "f32"),
                    "--positions": (pos, None)})
        outs.update({"--out-q-weight-grad": ("f32", (D,)), "--out-k-weight-grad": ("f32", (D,))})
        extra = ["--variant", "qk-norm-rope", "--backward", "--style", style, "--theta", theta]
        if r != D:
            extra += ["--rotary-dim", r]
        got = cli(tmp, ins, extra, outs)
        name = f"qk-norm-rope --backward {style} D={D} rotary_dim={r}"
        if isinstance(got[0], str):
            check(False, f"{name}: {got[0]}")
            continue
        dq, dk, dwq, dwk = got
        # dx ~ |g| |w| / rms ~ 1: fp32 arithmetic gives ~1e-6; dw sums T*H rows of that
        compare(f"{name}: dq, dk vs finite differences", [dq, dk],
                [(fd_dx(q, wq, gq), None), (fd_dx(k, wk, gk), None)], "<= 1e-5 abs",
                abs_within(1e-5))
        compare(f"{name}: dq_weight, dk_weight vs finite differences", [dwq, dwk],
                [(fd_dw(q, wq, gq), None), (fd_dw(k, wk, gk), None)], "<= 5e-5 abs",
                abs_within(5e-5))


def read_config(path):
    """The keys of an HF config.json that default and linear RoPE need (text_config first)."""
    import json
    with open(path) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config", cfg)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    r = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    theta = scaling.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return {"head_dim": head_dim, "r": r, "theta": theta, "kind": kind, "scaling": scaling}


def config_inv_freq(c):
    """HF's default (and mrope, whose frequencies are the default ones) and linear inv_freq."""
    inv = inv_freq_f64(c["theta"], c["r"])
    if c["kind"] == "linear":
        inv = inv / c["scaling"]["factor"]
    return inv


def test_configs(tmp):
    """--config: HF configs' frequencies. default and linear (and Qwen2-VL / Qwen3-VL MRoPE with
    the config's mrope_section) against numpy's own evaluation; the scaled types against the
    frequencies `tilerope freqs` prints for the same seq_len (the wiring: which seq_len, the
    attention scaling on cos and sin), as their formulas are tested by cli.freqs."""
    import json
    configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")
    if not os.path.isdir(configs):
        print("SKIP  --config: no tests/configs")
        return
    p = lambda name: os.path.join(tmp, name)

    def write(name, cfg):
        with open(p(name), "w") as f:
            json.dump(cfg, f)
        return p(name)

    plain = [os.path.join(configs, "qwen3-8b.json"),
             write("linear.json", {"hidden_size": 1024, "num_attention_heads": 16,
                                   "rope_theta": 500000.0,
                                   "rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
             write("partial.json", {"head_dim": 80, "num_attention_heads": 8, "hidden_size": 640,
                                    "partial_rotary_factor": 0.4, "rope_theta": 10000.0})]
    for path in plain:
        if not os.path.exists(path):
            continue
        c = read_config(path)
        D, r, inv = c["head_dim"], c["r"], config_inv_freq(c)
        T = 19
        q, k = uniform((T, 8, D)), uniform((T, 2, D))
        pos = RNG.integers(0, 32768, T)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        name = f"--config {os.path.basename(path)} ({c['kind']}, rotary_dim {r})"
        for variant, style, fn in (("rope", "neox", lambda x: rows_f64(
                                        x, np.cos(angle_rows(ang, "halves")),
                                        np.sin(angle_rows(ang, "halves")), "halves")),
                                   ("interleave", None, lambda x: rows_f64(
                                        x, np.cos(angle_rows(ang, "adjacent")),
                                        np.sin(angle_rows(ang, "adjacent")), "adjacent"))):
            ins, outs = qk(q, k)
            ins["--positions"] = (pos, None)
            extra = ["--variant", variant, "--config", path] + (["--style", style] if style else [])
            got = cli(tmp, ins, extra, outs)
            if compare(f"{name} --variant {variant}", got, [fn(x) for x in (q, k)],
                       "<= 2e-6 abs", abs_within(2e-6)) and r != D:
                same = all(np.array_equal(o[..., r:], x[..., r:]) for o, x in zip(got, (q, k)))
                check(same, f"{name} --variant {variant}: dims {r}..{D - 1} passed through")
        wq, wk = uniform((D,), lo=0.25, hi=2.0), uniform((D,), lo=0.25, hi=2.0)
        ins, outs = qk(q, k)
        ins.update({"--positions": (pos, None), "--q-weight": (wq, "f32"),
                    "--k-weight": (wk, "f32")})
        got = cli(tmp, ins, ["--variant", "qk-norm-rope", "--config", path], outs)
        wants = [rows_f64(rms_norm_f64(x, w, 1e-6), np.cos(angle_rows(ang, "halves")),
                          np.sin(angle_rows(ang, "halves")), "halves")
                 for x, w in ((q, wq), (k, wk))]
        compare(f"{name} --variant qk-norm-rope", got, wants, "<= 2e-6 abs", abs_within(2e-6))

    # MRoPE: the section and its layout from the config
    for base in ("qwen2-vl-7b-instruct.json", "qwen3-vl-8b-instruct.json"):
        path = os.path.join(configs, base)
        if not os.path.exists(path):
            continue
        c = read_config(path)
        section = c["scaling"]["mrope_section"]
        layout = "interleaved" if c["scaling"].get("mrope_interleaved") else "chunked"
        D, T = c["head_dim"], 17
        q, k = uniform((T, 4, D)), uniform((T, 2, D))
        ids = RNG.integers(0, 65536, (3, T))
        ang = mrope_angles(ids, section, layout, config_inv_freq(c))
        ins, outs = qk(q, k)
        ins["--positions"] = (ids, None)
        compare(f"--config {base} --variant mrope ({layout} {section} from the config)",
                cli(tmp, ins, ["--variant", "mrope", "--config", path], outs),
                [rows_f64(x, np.cos(ang), np.sin(ang), "halves") for x in (q, k)],
                "<= 2e-6 abs", abs_within(2e-6))

    # scaled types: the frequencies and attention scaling of `tilerope freqs` for seq_len =
    # max position + 1 (or offset + T); LongRoPE switches to long_factor once seq_len > 4096,
    # so positions up to 4095 take short_factor and up to 4096 long_factor (off by one: caught)
    scaled = [("phi-3-mini-128k-instruct.json", 4095), ("phi-3-mini-128k-instruct.json", 4096),
              ("phi-3-mini-128k-instruct.json", 60000),
              ("qwen2.5-7b-instruct-yarn.json", 100000), ("llama-3.1-8b.json", 30000),
              ("deepseek-v2-lite.json", 50000)]
    for base, largest in scaled:
        path = os.path.join(configs, base)
        if not os.path.exists(path):
            continue
        T = 11
        for kind in ("positions", "offset"):
            if kind == "positions":
                pos = np.concatenate([RNG.integers(0, largest, T - 1), [largest]])
            else:
                pos = np.arange(largest + 1 - T, largest + 1)
            run = subprocess.run([BINARY, "freqs", "--config", path, "--seq-len", str(largest + 1),
                                  "--json"], capture_output=True, text=True)
            if run.returncode != 0:
                check(False, f"--config {base}: tilerope freqs: {run.stderr.strip()}")
                continue
            f = json.loads(run.stdout)
            inv, scale = np.array(f["inv_freq"], np.float64), f["attention_scaling"]
            q = uniform((T, 4, f["head_dim"]))
            ang = pos[:, None].astype(np.float64) * inv[None, :]
            rows = angle_rows(ang, "halves")
            ins, outs = qk(q, None)
            extra = ["--config", path, "--style", "neox"]
            if kind == "positions":
                ins["--positions"] = (pos, None)
            else:
                extra += ["--offset", int(pos[0])]
            y, mag = rows_f64(q, np.cos(rows) * scale, np.sin(rows) * scale, "halves")
            compare(f"--config {base} {f['rope_type']} positions to {largest} ({kind}): "
                    f"as tilerope freqs --seq-len {largest + 1} (scaling {scale:.6g})",
                    cli(tmp, ins, extra, outs), [(y, mag)], f"<= 2e-6 * {max(scale, 1):.3g} abs",
                    abs_within(2e-6 * max(scale, 1.0)))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        theta = 10000.0

        # f32, |x| <= 4, positions < 65536 (ids int32 / int64 and --offset): max abs err <= 2e-6.
        # GQA (Hq = 8, Hk = 2), both styles, head_dim 64, 80, 128.
        for style in ("neox", "gptj"):
            for D in (64, 80, 128):
                for kind in ("int32", "int64", "offset"):
                    T = 19
                    q, k = uniform((T, 8, D)), uniform((T, 2, D))
                    if kind == "offset":
                        offset = 65536 - T
                        pos = np.arange(offset, offset + T)
                        outs = apply(tmp, q, k, style, theta, offset=offset)
                    else:
                        pos = RNG.integers(0, 65536, T).astype(kind)
                        outs = apply(tmp, q, k, style, theta, pos=pos)
                    wants = [rope_f64(q, pos, style, theta, D), rope_f64(k, pos, style, theta, D)]
                    compare(f"f32 {style} D={D} GQA 8/2 positions {kind}", outs, wants,
                            "<= 2e-6 abs", abs_within(2e-6))

        # partial rotary: dims >= rotary_dim pass through bit-exact
        for style in ("neox", "gptj"):
            for D, r in ((128, 64), (80, 48), (64, 2)):
                T = 13
                q, k = uniform((T, 8, D)), uniform((T, 2, D))
                pos = RNG.integers(0, 65536, T).astype(np.int64)
                outs = apply(tmp, q, k, style, theta, pos=pos, extra=["--rotary-dim", r])
                wants = [rope_f64(q, pos, style, theta, r), rope_f64(k, pos, style, theta, r)]
                name = f"f32 {style} D={D} rotary_dim={r}"
                if compare(name, outs, wants, "<= 2e-6 abs", abs_within(2e-6)):
                    same = all(np.array_equal(o[..., r:], x[..., r:]) for o, x in zip(outs, (q, k)))
                    check(same, f"{name}: dims {r}..{D - 1} passed through bit-exact")

        # layouts: bshd [B, S, H, D] and bhsd [B, H, S, D], positions [S] (shared) or [B, S]
        B, S, D = 3, 11, 64
        for layout in ("bshd", "bhsd"):
            for style in ("neox", "gptj"):
                for pos_shape in ("[S]", "[B, S]", "offset"):
                    shape = lambda h: (B, S, h, D) if layout == "bshd" else (B, h, S, D)
                    q, k = uniform(shape(8)), uniform(shape(2))
                    extra = ["--layout", layout]
                    if pos_shape == "offset":
                        pos = np.arange(40000, 40000 + S)
                        outs = apply(tmp, q, k, style, theta, offset=40000, extra=extra)
                    else:
                        pos = RNG.integers(0, 65536, S if pos_shape == "[S]" else (B, S))
                        outs = apply(tmp, q, k, style, theta, pos=pos, extra=extra)
                    wants = [rope_layout(x, pos, layout, style, theta, D) for x in (q, k)]
                    compare(f"f32 {layout} {style} positions {pos_shape}", outs, wants,
                            "<= 2e-6 abs", abs_within(2e-6))

        # backward: against the fp64 inverse rotation, and backward(apply(x)) == x within 1e-5
        for style in ("neox", "gptj"):
            T, D = 17, 128
            q = uniform((T, 4, D))
            pos = RNG.integers(0, 65536, T).astype(np.int64)
            back = apply(tmp, q, None, style, theta, pos=pos, extra=["--backward"])
            compare(f"f32 {style} --backward", back[:1], [rope_f64(q, pos, style, theta, D, True)],
                    "<= 2e-6 abs", abs_within(2e-6))
            fwd = apply(tmp, q, None, style, theta, pos=pos)
            if isinstance(fwd[0], str):
                check(False, f"f32 {style} round trip: {fwd[0]}")
                continue
            again = apply(tmp, fwd[0], None, style, theta, pos=pos, extra=["--backward"])
            compare(f"f32 {style} backward(apply(x)) == x", again[:1], [(q, None)],
                    "<= 1e-5 abs", abs_within(1e-5))

        # f16 and bf16: within one ulp of the exact result (see ulp_within), and nearly always
        # exactly the correctly rounded value (fp32 arithmetic, rounded once at the store)
        for dt in ("f16", "bf16"):
            for style in ("neox", "gptj"):
                for D, r in ((128, 128), (80, 80), (128, 64)):
                    T = 23
                    q, k = uniform((T, 8, D), dt), uniform((T, 2, D), dt)
                    pos = RNG.integers(0, 65536, T).astype(np.int32)
                    extra = ["--rotary-dim", r]
                    outs = apply(tmp, q, k, style, theta, dt, pos=pos, extra=extra)
                    wants = [rope_f64(q, pos, style, theta, r), rope_f64(k, pos, style, theta, r)]
                    name = f"{dt} {style} D={D} rotary_dim={r}"
                    if not compare(name, outs, wants, "of 1 ulp", ulp_within(dt)):
                        continue
                    hits = sum(int((o == correctly_rounded(w[0], dt)).sum())
                               for o, w in zip(outs, wants))
                    total = sum(o.size for o in outs)
                    check(hits >= 0.99 * total,
                          f"{name}: {hits}/{total} outputs are the correctly rounded fp64 result")
                    if r < D:
                        same = all(np.array_equal(o[..., r:], x[..., r:])
                                   for o, x in zip(outs, (q, k)))
                        check(same, f"{name}: dims {r}..{D - 1} passed through bit-exact")

        # tables. --table f32: cos/sin rounded to fp32 in the table (half an fp32 ulp, <= 2^-24
        # relative), so the bound grows by 2^-24 * (|x cos| + |rot(x) sin|) <= 2^-24 * 8 ~ 4.8e-7.
        # --table x: cos/sin rounded to the x dtype, by up to 2^-8 relative for bf16 (8
        # significant bits) or 2^-11 for f16 (11 bits; below 2^-14 its subnormals round by up
        # to 2^-25 absolute, times |x_a| + |x_b| <= 8): that much is added to the one-ulp bound.
        T, D = 29, 128
        q, k = uniform((T, 8, D)), uniform((T, 2, D))
        pos = RNG.integers(0, 65536, T).astype(np.int64)
        outs = apply(tmp, q, k, "neox", theta, pos=pos, extra=["--table", "f32"])
        wants = [rope_f64(x, pos, "neox", theta, D) for x in (q, k)]

        def table_f32_within(out, exact, mag):
            err = (np.abs(out - exact) - 2.0**-24 * mag).max(initial=0.0)
            return err <= 2e-6, err
        compare("f32 --table f32", outs, wants, "<= 2e-6 + 2^-24 * mag abs", table_f32_within)
        for dt, rel, absolute in (("bf16", 2.0**-8, 0.0), ("f16", 2.0**-11, 8 * 2.0**-25)):
            q, k = uniform((T, 8, D), dt), uniform((T, 2, D), dt)
            outs = apply(tmp, q, k, "gptj", theta, dt, pos=pos, extra=["--table", "x"])
            wants = [rope_f64(x, pos, "gptj", theta, D) for x in (q, k)]
            compare(f"{dt} --table x", outs, wants, f"of 1 ulp + {rel:.3g} * mag + {absolute:.3g}",
                    ulp_within(dt, table_rel=rel, table_abs=absolute))

        # .npy formats 2.0 and 3.0 and the byte-order marks '=' and '|' read as format 1.0 '<'
        q = uniform((7, 4, 64))
        pos = RNG.integers(0, 65536, 7).astype(np.int64)
        want = apply(tmp, q, None, "neox", theta, pos=pos)[0]
        p = lambda name: os.path.join(tmp, name)
        for version in ((2, 0), (3, 0)):
            for mark in ("<", "=", "|"):
                with open(p("qv.npy"), "wb") as f:
                    np.lib.format.write_array(f, q.astype(np.float32), version=version)
                with open(p("qv.npy"), "r+b") as f:
                    raw = f.read().replace(b"'<f4'", f"'{mark}f4'".encode(), 1)
                    f.seek(0)
                    f.write(raw)
                with open(p("pv.npy"), "wb") as f:
                    np.lib.format.write_array(f, pos, version=version)
                run = subprocess.run([BINARY, "apply", "--q", p("qv.npy"), "--positions",
                                      p("pv.npy"), "--style", "neox", "--theta", str(theta),
                                      "--out-q", p("ov.npy")], capture_output=True, text=True)
                got = load(p("ov.npy"), "f32", q.shape) if run.returncode == 0 else None
                ok = isinstance(got, np.ndarray) and np.array_equal(got, want)
                check(ok, f"format {version[0]}.0 input, descr '{mark}f4': same output as 1.0 '<f4'"
                      + ("" if run.returncode == 0 else f" ({run.stderr.strip()})"))

        test_vision(tmp)
        test_mrope(tmp)
        test_interleave(tmp)
        test_qk_norm_rope(tmp)
        test_qk_norm_backward(tmp)
        test_configs(tmp)

    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    sys.exit(1 if COUNTS["failed"] else 0)


if __name__ == "__main__":
    main()
