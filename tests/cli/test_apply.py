"""`tilerope apply` against an independent fp64 numpy implementation of the HF formula."""
import os
import sys
import tempfile

import numpy as np

from common import Checks, bf16_bits_to_f64, f32_to_bf16_bits, run

binary = sys.argv[1]
checks = Checks()
rng = np.random.default_rng(2024)


def rope_f64(x, pos, style, theta, rotary_dim, backward=False):
    """x [..., T, H, D] as thd rows with positions [T]: x*cos + rotate(x)*sin, in fp64."""
    x = x.astype(np.float64)
    r = rotary_dim
    inv = theta ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    ang = pos.astype(np.float64)[:, None] * inv[None, :]  # [T, r/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if backward:
        s = -s
    y = x.copy()
    if style == "neox":
        x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
        cc, ss = np.concatenate([c, c], -1), np.concatenate([s, s], -1)
        rot = np.concatenate([-x2, x1], -1)
        y[..., :r] = x[..., :r] * cc + rot * ss
    else:
        xe, xo = x[..., 0:r:2], x[..., 1:r:2]
        y[..., 0:r:2] = xe * c - xo * s
        y[..., 1:r:2] = xo * c + xe * s
    return y


def ulp_f16(v):
    return np.spacing(np.abs(v).astype(np.float16)).astype(np.float64)


def ulp_bf16(v):
    # one bf16 step at v's binade: 2^(e - 8) for |v| in [2^(e-1), 2^e); subnormal floor 2^-133
    _, e = np.frexp(np.abs(v))
    return np.ldexp(1.0, np.maximum(e - 8, -133))


tmp = tempfile.mkdtemp()
path = lambda name: os.path.join(tmp, name)


def apply(q, k, pos, style, theta, dtype="f32", extra=(), offset=None):
    """Writes inputs, runs the CLI, returns (qo, ko) as fp64 and the process."""
    def save(name, a):
        if dtype == "bf16":
            np.save(path(name), f32_to_bf16_bits(a))
        elif dtype == "f16":
            np.save(path(name), a.astype(np.float16))
        else:
            np.save(path(name), a.astype(np.float32))
    save("q.npy", q)
    args = ["apply", "--q", path("q.npy"), "--style", style, "--theta", theta, "--out-q", path("oq.npy")]
    if k is not None:
        save("k.npy", k)
        args += ["--k", path("k.npy"), "--out-k", path("ok.npy")]
    if offset is None:
        np.save(path("p.npy"), pos)
        args += ["--positions", path("p.npy")]
    else:
        args += ["--offset", offset]
    if dtype == "bf16":
        args += ["--dtype", "bf16"]
    p = run(binary, *args, *extra)
    if p.returncode != 0:
        return None, None, p
    load = (lambda n: bf16_bits_to_f64(np.load(path(n)))) if dtype == "bf16" else (lambda n: np.load(path(n)).astype(np.float64))
    return load("oq.npy"), (load("ok.npy") if k is not None else None), p


def stored(a, dtype):
    """The values the CLI reads after the input was saved in `dtype`."""
    if dtype == "bf16":
        return bf16_bits_to_f64(f32_to_bf16_bits(a))
    if dtype == "f16":
        return a.astype(np.float16).astype(np.float64)
    return a.astype(np.float32).astype(np.float64)


# f32, |x| <= 4, positions < 65536: 2e-6 absolute; both styles, partial rotary, GQA, i32/i64/offset
for style in ("neox", "gptj"):
    for D, r in ((64, 64), (80, 80), (128, 128), (128, 64)):
        for pos_dtype in (np.int32, np.int64, "offset"):
            T = 9
            q = rng.uniform(-4, 4, (T, 8, D)).astype(np.float32)
            k = rng.uniform(-4, 4, (T, 2, D)).astype(np.float32)
            if pos_dtype == "offset":
                pos = np.arange(65000, 65000 + T)
                qo, ko, p = apply(q, k, None, style, 10000, extra=["--rotary-dim", r], offset=65000)
            else:
                pos = rng.integers(0, 65536, T).astype(pos_dtype)
                qo, ko, p = apply(q, k, pos, style, 10000, extra=["--rotary-dim", r])
            name = f"f32 {style} D={D} r={r} pos={getattr(pos_dtype, '__name__', pos_dtype)}"
            if qo is None:
                checks.check(False, name + ": " + p.stderr.strip())
                continue
            err = max(np.abs(qo - rope_f64(q, pos, style, 10000, r)).max(), np.abs(ko - rope_f64(k, pos, style, 10000, r)).max())
            checks.check(err <= 2e-6, f"{name}: max abs err {err:.2e} <= 2e-6")
            if r < D:
                checks.check(np.array_equal(qo[..., r:], q[..., r:].astype(np.float64)), name + ": pass-through dims bit-exact")

# f16 and bf16: within one ulp of the correctly rounded fp64 result
for dtype, ulp in (("f16", ulp_f16), ("bf16", ulp_bf16)):
    for style in ("neox", "gptj"):
        T, D = 17, 128
        q = rng.normal(size=(T, 8, D)).astype(np.float32)
        k = rng.normal(size=(T, 2, D)).astype(np.float32)
        pos = rng.integers(0, 32768, T).astype(np.int64)
        qo, ko, p = apply(q, k, pos, style, 1e6, dtype=dtype)
        if qo is None:
            checks.check(False, f"{dtype} {style}: " + p.stderr.strip())
            continue
        ok = True
        worst = 0.0
        for got, x in ((qo, q), (ko, k)):
            exact = rope_f64(stored(x, dtype), pos, style, 1e6, D)
            ratio = np.abs(got - exact) / ulp(exact)
            worst = max(worst, ratio.max())
            ok = ok and bool((ratio <= 1.0).all())
        checks.check(ok, f"{dtype} {style}: worst error {worst:.3f} ulp <= 1 ulp")

# backward(apply(x)) == x within 1e-5 (f32)
for style in ("neox", "gptj"):
    q = rng.uniform(-4, 4, (11, 4, 96)).astype(np.float32)
    pos = rng.integers(0, 60000, 11).astype(np.int64)
    qo, _, p = apply(q, None, pos, style, 10000)
    q2, _, p2 = apply(qo.astype(np.float32), None, pos, style, 10000, extra=["--backward"])
    ok = q2 is not None and np.abs(q2 - q).max() <= 1e-5
    checks.check(ok, f"{style}: backward(apply(x)) == x within 1e-5")

# layouts: bshd and bhsd with positions [S] and [B, S]
for layout in ("bshd", "bhsd"):
    for shared in (True, False):
        B, S, H, D = 3, 7, 4, 64
        shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
        q = rng.uniform(-4, 4, shape).astype(np.float32)
        pos = rng.integers(0, 50000, S if shared else (B, S)).astype(np.int64)
        qo, _, p = apply(q, None, pos, "neox", 10000, extra=["--layout", layout])
        if qo is None:
            checks.check(False, f"{layout}: " + p.stderr.strip())
            continue
        want = np.empty_like(qo)
        for b in range(B):
            pb = pos if shared else pos[b]
            xb = q[b] if layout == "bshd" else q[b].transpose(1, 0, 2)  # [S, H, D]
            yb = rope_f64(xb, pb, "neox", 10000, D)
            want[b] = yb if layout == "bshd" else yb.transpose(1, 0, 2)
        err = np.abs(qo - want).max()
        checks.check(err <= 2e-6, f"{layout} positions {'[S]' if shared else '[B, S]'}: max abs err {err:.2e}")

# tables: an fp32 table adds half an fp32 ulp of cos/sin (|x| <= 4: < 1e-6 more); a table in
# the x dtype (bf16) rounds cos/sin to bf16 first: up to 2^-9 each, times |x1| + |x2| <= 8,
# on top of the final rounding (one bf16 ulp of y).
T, D = 13, 128
q = rng.uniform(-4, 4, (T, 4, D)).astype(np.float32)
pos = rng.integers(0, 8192, T).astype(np.int64)
qo, _, p = apply(q, None, pos, "gptj", 10000, extra=["--table", "f32"])
err = np.abs(qo - rope_f64(q, pos, "gptj", 10000, D)).max() if qo is not None else np.inf
checks.check(err <= 3e-6, f"--table f32: max abs err {err:.2e} <= 3e-6")
qo, _, p = apply(q, None, pos, "neox", 10000, dtype="bf16", extra=["--table", "x"])
exact = rope_f64(stored(q, "bf16"), pos, "neox", 10000, D)
err = (np.abs(qo - exact) / (ulp_bf16(exact) + 8 * 2.0**-9)).max() if qo is not None else np.inf
checks.check(err <= 1.0, f"--table x (bf16): worst {err:.2f} of the bound ulp(y) + 8 * 2^-9")

# T = 0 is a valid no-op and writes an empty array
np.save(path("e.npy"), np.zeros((0, 4, 64), np.float32))
np.save(path("ep.npy"), np.zeros((0,), np.int64))
p = run(binary, "apply", "--q", path("e.npy"), "--positions", path("ep.npy"), "--style", "neox", "--theta", 1e4, "--out-q", path("eo.npy"))
checks.check(p.returncode == 0 and np.load(path("eo.npy")).shape == (0, 4, 64), "T = 0: exit 0, empty [0, 4, 64] output")

checks.finish()
