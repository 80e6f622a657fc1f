"""Every invalid input to `tilerope apply` exits 2 with `tilerope: error:` and the offending
value, and leaves an existing output file byte-identical. (Non-contiguous views, overlapping
outputs and positions outside a given table cannot be formed from .npy files; the API tests
cover them.)"""
import os
import sys
import tempfile

import numpy as np

from common import Checks, run

binary = sys.argv[1]
checks = Checks()
tmp = tempfile.mkdtemp()
path = lambda name: os.path.join(tmp, name)
rng = np.random.default_rng(7)

np.save(path("q.npy"), rng.normal(size=(5, 4, 64)).astype(np.float32))
np.save(path("q128.npy"), rng.normal(size=(5, 4, 128)).astype(np.float32))
np.save(path("k.npy"), rng.normal(size=(5, 2, 64)).astype(np.float32))
np.save(path("k_f16.npy"), rng.normal(size=(5, 2, 64)).astype(np.float16))
np.save(path("k_rank4.npy"), rng.normal(size=(1, 5, 2, 64)).astype(np.float32))
np.save(path("k_d32.npy"), rng.normal(size=(5, 2, 32)).astype(np.float32))
np.save(path("q_u2.npy"), rng.integers(0, 1 << 15, (5, 4, 64)).astype(np.uint16))
np.save(path("q_f8.npy"), rng.normal(size=(5, 4, 64)))
np.save(path("p.npy"), np.arange(5, dtype=np.int64))
np.save(path("p4.npy"), np.arange(4, dtype=np.int64))
np.save(path("pneg.npy"), np.array([0, 1, 2, -3, 4], dtype=np.int32))
with open(path("q.npy"), "rb") as f:
    whole = f.read()
with open(path("trunc.npy"), "wb") as f:
    f.write(whole[: len(whole) // 2])

out = path("out.npy")
sentinel = b"existing output, must survive"


def expect_error(name, args, needles):
    with open(out, "wb") as f:
        f.write(sentinel)
    p = run(binary, "apply", *args)
    line = p.stderr.strip()
    ok = p.returncode == 2 and line.startswith("tilerope: error:") and all(n in line for n in needles)
    with open(out, "rb") as f:
        untouched = f.read() == sentinel
    checks.check(ok and untouched, f"{name}: exit {p.returncode}, '{line}'" + ("" if untouched else " (output changed!)"))


base = lambda q="q.npy": ["--q", path(q), "--style", "neox", "--theta", "10000", "--out-q", out]
pos = ["--positions", path("p.npy")]
expect_error("dtype mismatch", base() + pos + ["--k", path("k_f16.npy"), "--out-k", path("ok.npy")], ["k dtype (f16)", "q dtype (f32)"])
expect_error("rank mismatch", base() + pos + ["--k", path("k_rank4.npy"), "--out-k", path("ok.npy")], ["[1, 5, 2, 64]"])
expect_error("head_dim mismatch", base() + pos + ["--k", path("k_d32.npy"), "--out-k", path("ok.npy")], ["k head_dim (32)", "q head_dim (64)"])
expect_error("odd rotary_dim", base() + pos + ["--rotary-dim", "63"], ["rotary_dim (63)"])
expect_error("rotary_dim > head_dim", base("q128.npy") + pos + ["--rotary-dim", "130"], ["rotary_dim (130)", "head_dim (128)"])
expect_error("positions length != T", base() + ["--positions", path("p4.npy")], ["positions shape [4]", "T = 5"])
expect_error("negative position", base() + ["--positions", path("pneg.npy")], ["positions[3] (-3)"])
expect_error("negative offset", base() + ["--offset", "-2"], ["offset (-2)"])
for theta, needle in (("nan", "nan"), ("inf", "inf"), ("0", "theta (0"), ("-1", "theta (-1")):
    args = ["--q", path("q.npy"), "--style", "neox", "--theta", theta, "--out-q", out] + pos
    expect_error(f"theta {theta}", args, [needle])
    expect_error(f"theta {theta} with a table", args + ["--table", "f32"], [needle])
expect_error("u2 without --dtype bf16", base("q_u2.npy") + pos, ["'<u2'", "--dtype bf16"])
expect_error("f8 input", base("q_f8.npy") + pos, ["'<f8'"])
expect_error("--dtype disagrees with the file", base() + pos + ["--dtype", "f16"], ["holds f32", "--dtype is f16"])
expect_error("missing --out-q", ["--q", path("q.npy"), "--style", "neox", "--theta", "1e4"] + pos, ["--out-q"])
expect_error("--positions and --offset", base() + pos + ["--offset", "3"], ["--offset"])
expect_error("neither --positions nor --offset", base(), ["--positions", "--offset"])
expect_error("unknown style", ["--q", path("q.npy"), "--style", "sideways", "--theta", "1e4", "--out-q", out] + pos, ["'sideways'"])
expect_error("unknown layout", base() + pos + ["--layout", "hsd"], ["'hsd'"])
expect_error("--k without --out-k", base() + pos + ["--k", path("k.npy")], ["--k and --out-k"])
expect_error("missing input file", base("nope.npy") + pos, ["nope.npy"])
expect_error("truncated .npy", base("trunc.npy") + pos, ["trunc.npy", "truncated"])

# usage errors exit 2 too
p = run(binary, "frobnicate")
checks.check(p.returncode == 2 and p.stderr.startswith("tilerope: error:"), f"unknown subcommand: exit {p.returncode}")
checks.finish()
