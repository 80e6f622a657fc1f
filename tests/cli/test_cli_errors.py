"""Every invalid `tilerope apply` exits 2 with a stderr line `tilerope: error: ...` that names the
offending value, and leaves an existing --out-q file byte-identical (and no temporary behind).

Not covered here, because .npy inputs cannot produce them: a position outside a cos/sin table
(the CLI sizes its table from the positions given), non-contiguous views and overlapping
outputs. The C++ API tests (tests/test_validation.cc) cover those.

Usage: /usr/bin/python3 test_cli_errors.py path/to/tilerope
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BINARY = sys.argv[1]
COUNTS = {"passed": 0, "failed": 0}
SENTINEL = b"an existing output that must survive\n"


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


def run(*args):
    return subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        p = lambda name: os.path.join(tmp, name)
        rng = np.random.default_rng(7)
        f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
        np.save(p("q.npy"), f32(5, 4, 64))
        np.save(p("q128.npy"), f32(5, 4, 128))
        np.save(p("k.npy"), f32(5, 2, 64))
        np.save(p("k_f16.npy"), f32(5, 2, 64).astype(np.float16))
        np.save(p("k_rank4.npy"), f32(1, 5, 2, 64))
        np.save(p("k_d32.npy"), f32(5, 2, 32))
        np.save(p("q_u2.npy"), rng.integers(0, 1 << 14, (5, 4, 64)).astype(np.uint16))
        np.save(p("q_f8.npy"), rng.normal(size=(5, 4, 64)))
        np.save(p("q_big.npy"), f32(5, 4, 64).astype(">f4"))
        np.save(p("q_fortran.npy"), np.asfortranarray(f32(5, 4, 64)))
        np.save(p("p.npy"), np.arange(5, dtype=np.int64))
        np.save(p("p4.npy"), np.arange(4, dtype=np.int64))
        np.save(p("p_f32.npy"), np.arange(5, dtype=np.float32))
        np.save(p("pneg.npy"), np.array([0, 1, 2, -3, 4], dtype=np.int32))
        np.save(p("phuge.npy"), np.array([0, 1, 2, 1 << 40, 4], dtype=np.int64))
        whole = open(p("q.npy"), "rb").read()
        open(p("trunc.npy"), "wb").write(whole[: len(whole) // 2])
        open(p("trunc_header.npy"), "wb").write(whole[:40])
        open(p("magic.npy"), "wb").write(b"PK\x03\x04" + whole[4:])
        open(p("version.npy"), "wb").write(whole[:6] + b"\x09\x00" + whole[8:])

        out = p("out.npy")

        def expect_error(name, args, needles):
            with open(out, "wb") as f:
                f.write(SENTINEL)
            r = run("apply", *args)
            line = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
            missing = [n for n in needles if n not in line]
            untouched = open(out, "rb").read() == SENTINEL
            leftovers = [f for f in os.listdir(tmp) if ".tmp-" in f]
            ok = (r.returncode == 2 and line.startswith("tilerope: error:") and not missing
                  and untouched and not leftovers)
            why = "".join([f" (missing {missing})" if missing else "",
                           "" if untouched else " (--out-q changed!)",
                           f" (left {leftovers})" if leftovers else ""])
            check(ok, f"{name}: exit {r.returncode}: {line}{why}")

        def base(q="q.npy"):
            return ["--q", p(q), "--style", "neox", "--theta", "10000", "--out-q", out]
        pos = ["--positions", p("p.npy")]
        with_k = lambda k: ["--k", p(k), "--out-k", p("ok.npy")]
        for table in ("none", "f32"):
            t = ["--table", table]
            expect_error(f"q f4 vs k f2 (table {table})", base() + pos + t + with_k("k_f16.npy"),
                         ["k dtype (f16)", "q dtype (f32)"])
            expect_error(f"rank mismatch (table {table})", base() + pos + t + with_k("k_rank4.npy"),
                         ["k_rank4.npy", "[1, 5, 2, 64]", "rank 4"])
            expect_error(f"head_dim mismatch (table {table})",
                         base() + pos + t + with_k("k_d32.npy"),
                         ["k head_dim (32)", "q head_dim (64)"])
            expect_error(f"odd rotary_dim (table {table})", base() + pos + t + ["--rotary-dim", 63],
                         ["rotary_dim (63)"])
            expect_error(f"rotary_dim > head_dim (table {table})",
                         base("q128.npy") + pos + t + ["--rotary-dim", 130],
                         ["rotary_dim (130)", "head_dim (128)"])
            expect_error(f"positions length != T (table {table})",
                         base() + ["--positions", p("p4.npy")] + t,
                         ["positions shape [4]", "T = 5"])
            expect_error(f"negative position (table {table})",
                         base() + ["--positions", p("pneg.npy")] + t, ["positions[3] (-3)"])
            expect_error(f"negative offset (table {table})", base() + ["--offset", -2] + t,
                         ["offset (-2)"])
            for theta, needle in (("nan", "theta (nan"), ("inf", "theta (inf"),
                                  ("-inf", "theta (-inf"), ("0", "theta (0"), ("-1", "theta (-1")):
                args = ["--q", p("q.npy"), "--style", "neox", "--theta", theta, "--out-q", out]
                expect_error(f"theta {theta} (table {table})", args + pos + t, [needle])
        expect_error("position 2^40 with --table f32", base() + ["--positions", p("phuge.npy")] +
                     ["--table", "f32"], ["1099511627776", "--table none"])
        expect_error("u2 without --dtype bf16", base("q_u2.npy") + pos, ["'<u2'", "--dtype bf16"])
        expect_error("f8 input", base("q_f8.npy") + pos, ["q_f8.npy", "'<f8'"])
        expect_error("big-endian input", base("q_big.npy") + pos, ["q_big.npy", "'>f4'"])
        expect_error("Fortran-order input", base("q_fortran.npy") + pos, ["fortran_order"])
        expect_error("float positions", base() + ["--positions", p("p_f32.npy")], ["'<f4'"])
        expect_error("--dtype f16 on an f32 file", base() + pos + ["--dtype", "f16"],
                     ["holds f32", "--dtype is f16"])
        expect_error("--dtype i32", base() + pos + ["--dtype", "i32"], ["--dtype 'i32'"])
        expect_error("missing --out-q",
                     ["--q", p("q.npy"), "--style", "neox", "--theta", "1e4"] + pos, ["--out-q"])
        expect_error("both --positions and --offset", base() + pos + ["--offset", 3],
                     ["--positions", "--offset"])
        expect_error("neither --positions nor --offset", base(), ["--positions", "--offset"])
        expect_error("unknown --style",
                     ["--q", p("q.npy"), "--style", "sideways", "--theta", "1e4", "--out-q", out]
                     + pos,
                     ["'sideways'"])
        expect_error("unknown --layout", base() + pos + ["--layout", "hsd"], ["'hsd'"])
        expect_error("unknown --table", base() + pos + ["--table", "f64"], ["'f64'"])
        expect_error("unknown --precision", base() + pos + ["--precision", "fast"], ["'fast'"])
        expect_error("--rotary-dim 0", base() + pos + ["--rotary-dim", 0], ["--rotary-dim (0)"])
        expect_error("--k without --out-k", base() + pos + ["--k", p("k.npy")], ["--k", "k.npy"])
        expect_error("--out-k without --k", base() + pos + ["--out-k", p("ok.npy")], ["--out-k"])
        expect_error("--out-k same as --out-q", base() + pos + ["--k", p("k.npy"), "--out-k", out],
                     ["same file"])
        expect_error("nonexistent input", base("nope.npy") + pos, ["nope.npy"])
        expect_error("nonexistent positions", base() + ["--positions", p("nope_p.npy")],
                     ["nope_p.npy"])
        expect_error("truncated data", base("trunc.npy") + pos, ["trunc.npy", "truncated"])
        expect_error("truncated header", base("trunc_header.npy") + pos,
                     ["trunc_header.npy", "truncated"])
        expect_error("bad magic", base("magic.npy") + pos, ["magic.npy", "magic"])
        expect_error("unknown .npy version", base("version.npy") + pos, ["version.npy", "9.0"])
        # a failure writing the second output leaves the first destination untouched too
        expect_error("--out-k in a missing directory", base() + pos +
                     ["--k", p("k.npy"), "--out-k", p("no_such_dir/ok.npy")],
                     ["no_such_dir/ok.npy"])
        os.mkdir(p("a_dir"))
        expect_error("--out-k an existing directory", base() + pos +
                     ["--k", p("k.npy"), "--out-k", p("a_dir")], ["a_dir", "directory"])

        # T = 0 is a valid no-op: exit 0, nothing printed, an empty array of the input's shape
        np.save(p("empty.npy"), np.zeros((0, 4, 64), np.float32))
        np.save(p("empty_p.npy"), np.zeros((0,), np.int64))
        for name, extra in (("positions [0]", ["--positions", p("empty_p.npy")]),
                            ("--offset 7 --table f32", ["--offset", 7, "--table", "f32"])):
            if os.path.exists(p("empty_out.npy")):
                os.remove(p("empty_out.npy"))
            r = run("apply", "--q", p("empty.npy"), "--style", "neox", "--theta", "1e4",
                    "--out-q", p("empty_out.npy"), *extra)
            ok = r.returncode == 0 and not r.stdout and not r.stderr
            if ok:
                a = np.load(p("empty_out.npy"))
                ok = a.dtype == np.float32 and a.shape == (0, 4, 64)
            check(ok, f"T = 0, {name}: exit {r.returncode}, output {'valid' if ok else 'invalid'}"
                  + (f" ({r.stderr.strip()})" if r.stderr else ""))

        # usage errors exit 2 as well
        r = run("frobnicate")
        check(r.returncode == 2 and r.stderr.startswith("tilerope: error:"),
              f"unknown subcommand: exit {r.returncode}")

    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    sys.exit(1 if COUNTS["failed"] else 0)


if __name__ == "__main__":
    main()
