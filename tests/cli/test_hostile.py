"""Hostile files given to `tilerope freqs`, `tilerope check` and `tilerope apply`: each must exit 2
with a `tilerope: error:` line naming the file, the key and the value, never a crash (signal), a
hang or an out-of-memory, and must leave an existing --out-q file byte-identical.

Each case is a defect once found in the readers (deep nesting, integer overflow, float-to-int
conversion, numbers out of double range, sizes that ask for terabytes).

Usage: /usr/bin/python3 test_hostile.py path/to/tilerope
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
COUNTS = {"passed": 0, "failed": 0}
SENTINEL = b"an existing output that must survive\n"
DEEP = "[" * 200000 + "]" * 200000  # past any recursion's stack


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


def expect_error(name, args, needles, out=None, case_row=False):
    """Exit 2 and a first stderr line `tilerope: error: ...`; or, with case_row (a case that
    loads but cannot run), exit 1 and the case's FAIL row on stdout naming the problem."""
    if out:
        with open(out, "wb") as f:
            f.write(SENTINEL)
    try:
        r = subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        check(False, f"{name}: still running after 60 s")
        return
    if case_row:
        rows = [row for row in r.stdout.splitlines() if " FAIL " in row]
        line = rows[0].split(" FAIL ", 1)[1].strip() if rows else r.stderr.strip()
        shape_ok = r.returncode == 1 and len(rows) == 1
    else:
        line = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
        shape_ok = r.returncode == 2 and line.startswith("tilerope: error:")
    missing = [n for n in needles if n not in line]
    untouched = out is None or open(out, "rb").read() == SENTINEL
    ok = shape_ok and not missing and untouched
    why = "".join([f" (missing {missing})" if missing else "",
                   "" if untouched else " (--out-q changed!)"])
    check(ok, f"{name}: exit {r.returncode}: {line[:200]}{why}")


def npy_with_shape(path, shape):
    """A header-only .npy of f4 claiming `shape` (no data)."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())


def main():
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda name: os.path.join(tmp, name)

        def write(name, text):
            with open(p(name), "w") as f:
                f.write(text if isinstance(text, str) else json.dumps(text))
            return p(name)

        # config.json readers: freqs --config and apply --config
        llama = {"head_dim": 128, "rope_theta": 10000, "max_position_embeddings": 4096}
        configs = [
            ("head_dim nested 200000 deep",
             '{"head_dim": %s, "rope_theta": 10000}' % DEEP, ["deeper than 64"]),
            ("rope_scaling nested 200000 deep",
             '{"head_dim": 128, "rope_scaling": %s}' % DEEP, ["deeper than 64"]),
            ("partial_rotary_factor 1e300", dict(llama, partial_rotary_factor=1e300),
             ["partial_rotary_factor (1e+300)", "(0, 1]"]),
            ("head_dim 2^30 with factor 4", dict(llama, head_dim=1 << 30, partial_rotary_factor=4),
             ["head_dim (1073741824)"]),
            ("head_dim 161824786", dict(llama, head_dim=161824786), ["head_dim (161824786)"]),
            ("hidden_size / heads past the head_dim bound",
             {"hidden_size": 1 << 30, "num_attention_heads": 1, "rope_theta": 1e4},
             ["hidden_size / num_attention_heads (1073741824)"]),
            ("mrope_section entries of 2^30",
             dict(llama, rope_scaling={"rope_type": "default",
                                       "mrope_section": [1 << 30, 1 << 30, 1 << 30]}),
             ["mrope_section ([1073741824, 1073741824, 1073741824])"]),
            ("rope_theta 1e400", '{"head_dim": 128, "rope_theta": 1e400}', ["1e400"]),
            ("max_position_embeddings 1e400",
             '{"head_dim": 128, "max_position_embeddings": 1e400}', ["1e400"]),
        ]
        for i, (name, text, needles) in enumerate(configs):
            path = write(f"config{i}.json", text)
            expect_error("freqs: " + name, ["freqs", "--config", path], [path] + needles)

        # the JSON case loader: check FILE
        cases = [
            ("a case file nested 200000 deep", '{"cases": %s}' % DEEP, ["deeper than 64"]),
            ("k_heads 2^62", [{"name": "x", "k_heads": 1 << 62}],
             ["'k_heads'", "4611686018427387904"]),
            ("tokens 1e300", [{"name": "x", "tokens": 1e300}], ["'tokens'", "1e+300"]),
            ("head_dim 1e300", [{"name": "x", "head_dim": 1e300}], ["'head_dim'", "1e+300"]),
            ("rotary_dim 8589934624", [{"name": "x", "rotary_dim": 8589934624}],
             ["'rotary_dim'", "8589934624"]),
            ("offset INT64_MAX", [{"name": "x", "positions": "offset", "offset": (1 << 63) - 1}],
             ["'offset'", "9223372036854775807"]),
            ("max_pos 2^40", [{"name": "x", "max_pos": 1 << 40}], ["'max_pos'", "1099511627776"]),
            ("seed -1", [{"name": "x", "seed": -1}], ["'seed'", "-1"]),
            ("theta as a string", [{"name": "x", "theta": "1e4"}], ["'theta'", '"1e4"']),
            ("mrope_section of 2^40", [{"name": "x", "mrope_section": [1 << 40, 0, 0]}],
             ["'mrope_section'", "1099511627776"]),
            ("a tile of 2^40", [{"name": "x", "kernel": "skeleton", "tile": [1, 1 << 40]}],
             ["'tile'"]),
            ("a name that is a number", [{"name": 7}], ["name must be a string"]),
        ]
        for i, (name, content, needles) in enumerate(cases):
            path = write(f"cases{i}.json", content)
            expect_error("check: " + name, ["check", "--no-builtin", path], needles)
        # cases that load but describe buffers or tables too large to build: a FAIL row each
        too_large = [
            ("offset 2^62 with a table", [{"name": "x", "positions": "offset", "offset": 1 << 62}],
             ["cos/sin table of 4.612e+18 positions", "offset 4611686018427387904"]),
            ("max_pos 2^30 (a 256 GiB table)", [{"name": "x", "max_pos": 1 << 30}],
             ["cos/sin table of 1.074e+09 positions", "max_pos 1073741824"]),
            ("batch * tokens * heads * head_dim past 2^63",
             [{"name": "x", "layout": "bshd", "batch": 1 << 31, "tokens": 1 << 31,
               "q_heads": 1 << 31, "head_dim": 64}], ["(6.338e+29) must be <= 1e9"]),
            ("head_dim 1 (no whole pair: a division by zero)",
             [{"name": "x", "tokens": 1, "head_dim": 1, "table": "none"}],
             ["rotary_dim (1) must be even, >= 2 and <= head_dim (1)"]),
            ("a reference case with heads 2^31",
             [{"name": "x", "kernel": "skeleton", "batch": 1 << 31, "seq": 1 << 31,
               "heads": 1 << 31, "k_heads": 1, "head_dim": 64}], ["must be <= 1e9"]),
        ]
        for i, (name, content, needles) in enumerate(too_large):
            path = write(f"large{i}.json", content)
            expect_error("check: " + name, ["check", "--no-builtin", path], needles, case_row=True)

        # apply: .npy shapes and integer flags
        out = p("out.npy")
        np.save(p("q.npy"), np.ones((5, 4, 64), np.float32))
        npy_with_shape(p("zero_huge.npy"), (0, 1 << 62, 1 << 62))
        npy_with_shape(p("zero_wide.npy"), (0, 4, 1 << 62))
        base = ["apply", "--style", "neox", "--out-q", out]
        theta = ["--theta", "1e4"]
        expect_error("apply: .npy shape (0, 2^62, 2^62)",
                     base + theta + ["--q", p("zero_huge.npy"), "--offset", 0],
                     ["[0, 4611686018427387904, 4611686018427387904]", "2^60"], out)
        expect_error("apply: .npy shape (0, 4, 2^62)",
                     base + theta + ["--q", p("zero_wide.npy"), "--offset", 0],
                     ["[0, 4, 4611686018427387904]"], out)
        expect_error("apply: --offset 2^64", base + theta + ["--q", p("q.npy"), "--offset",
                                                     "18446744073709551616"],
                     ["--offset", "18446744073709551616"], out)
        expect_error("apply: --offset 2^63", base + theta + ["--q", p("q.npy"), "--offset",
                                                     "9223372036854775808"],
                     ["--offset", "9223372036854775808"], out)
        expect_error("apply: --offset INT64_MAX with 5 tokens",
                     base + theta + ["--q", p("q.npy"), "--offset", (1 << 63) - 1],
                     ["offset (9223372036854775807)", "overflows"], out)
        expect_error("apply: --config nested 200000 deep",
                     base + ["--q", p("q.npy"), "--offset", 0, "--config", p("config0.json")],
                     ["config0.json", "deeper than 64"], out)
        expect_error("freqs: --seq-len 2^64",
                     ["freqs", "--theta", "1e4", "--rotary-dim", 64, "--seq-len",
                      "18446744073709551616"], ["--seq-len", "18446744073709551616"])

    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    return 1 if COUNTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
