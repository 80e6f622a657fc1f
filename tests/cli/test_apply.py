"""`tilerope apply` against an independent fp64 numpy implementation of the HF formula.

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

    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    sys.exit(1 if COUNTS["failed"] else 0)


if __name__ == "__main__":
    main()
