#!/usr/bin/env python3
"""The angle error of each precision mode against position: `tilerope apply` rotates f32 rows of
|x| <= 1 (theta 1e6, head_dim 128, neox, angles computed per token) at positions spread over
[1, 2^24], and each output is compared with an fp64 evaluation of the same formula in numpy. One
line per binade of positions: the largest absolute error of each mode there; and a plot of both
(docs/reliability-long-context.png by default).

    scripts/long-context-error.py build/tools/tilerope/tilerope [OUT.png]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "docs", "reliability-long-context.png")
THETA, D, PER_BINADE = 1e6, 128, 256


def main():
    rng = np.random.default_rng(24)
    pos = np.concatenate([np.arange(1, 1024)] + [
        (1 << (e - 1)) + rng.integers(0, 1 << (e - 1), PER_BINADE) for e in range(11, 25)] +
        [np.array([(1 << 24) - 1, 1 << 24])]).astype(np.int64)
    x = rng.uniform(-1, 1, (len(pos), 1, D)).astype(np.float32)
    inv = THETA ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    angle = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(angle), np.sin(angle)
    x64 = x[:, 0, :].astype(np.float64)
    x1, x2 = x64[:, : D // 2], x64[:, D // 2:]
    want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1)
    errors = {}
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "q.npy"), x)
        np.save(os.path.join(tmp, "p.npy"), pos)
        for mode in ("accurate", "hf_compat"):
            out = os.path.join(tmp, f"y-{mode}.npy")
            subprocess.run([BINARY, "apply", "--q", os.path.join(tmp, "q.npy"), "--positions",
                            os.path.join(tmp, "p.npy"), "--style", "neox", "--theta", str(THETA),
                            "--table", "none", "--precision", mode, "--out-q", out], check=True)
            errors[mode] = np.abs(np.load(out)[:, 0, :].astype(np.float64) - want).max(axis=1)
    binade = np.floor(np.log2(pos)).astype(int)
    print(f"{'positions':>22} {'accurate':>10} {'hf_compat':>10}")
    for e in range(0, 25):
        sel = binade == e
        if sel.any():
            print(f"[2^{e:<2}, 2^{e + 1:<2}) {int(sel.sum()):>7}"
                  f" {errors['accurate'][sel].max():10.2e} {errors['hf_compat'][sel].max():10.2e}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, color in (("hf_compat", "tab:red"), ("accurate", "tab:blue")):
        ax.scatter(pos, np.maximum(errors[mode], 1e-9), s=3, color=color, label=mode)
    ax.axhline(2e-6, color="gray", linestyle="--", linewidth=1, label="2e-6 (accurate's bound)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel("max |y - fp64 golden| over a row (f32, |x| <= 1)")
    ax.set_title(f"RoPE f32 output error against position (theta {THETA:g}, head_dim {D})")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print("plot:", os.path.relpath(OUT))


if __name__ == "__main__":
    main()
