"""Every invalid `tilerope apply` exits 2 with a stderr line `tilerope: error: ...` that names the
offending value (a flag a variant does not use names the flag and the variant; a bad input names
the file, its shape and what is expected), and leaves an existing --out-q file byte-identical
(and no temporary behind).

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
                         ["--offset", "'-2' is not an integer in [0, 9223372036854775807]"])
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

        # --- the variants (--variant vision, mrope, qk-norm-rope, interleave) ---
        import json
        np.save(p("q6.npy"), f32(5, 4, 6))
        np.save(p("q_bshd.npy"), f32(2, 5, 4, 64))
        np.save(p("p_hw.npy"), rng.integers(0, 64, (5, 2)))
        np.save(p("p_hw3.npy"), rng.integers(0, 64, (5, 3)))
        np.save(p("p_hw_neg.npy"), np.array([[0, 1], [2, 3], [4, -4], [5, 6], [7, 8]]))
        np.save(p("p3.npy"), rng.integers(0, 64, (3, 5)).astype(np.int32))
        np.save(p("p3_bad.npy"), rng.integers(0, 64, (2, 5)))
        np.save(p("c_rows.npy"), f32(5, 64))
        np.save(p("s_rows.npy"), f32(5, 64))
        np.save(p("s_f16.npy"), f32(5, 64).astype(np.float16))
        np.save(p("c_wide.npy"), f32(5, 48))
        np.save(p("c_u2.npy"), rng.integers(0, 1 << 14, (5, 64)).astype(np.uint16))
        np.save(p("c_planes.npy"), f32(3, 5, 64))
        np.save(p("c_b3.npy"), f32(3, 5, 64))
        np.save(p("s_b3.npy"), f32(3, 5, 64))
        np.save(p("w.npy"), f32(64))
        np.save(p("w65.npy"), f32(65))
        np.save(p("w_u2.npy"), rng.integers(0, 1 << 14, 64).astype(np.uint16))
        np.save(p("g.npy"), f32(5, 4, 64))
        np.save(p("gk.npy"), f32(5, 2, 64))
        np.save(p("g_bad.npy"), f32(5, 4, 32))
        np.save(p("g_f16.npy"), f32(5, 4, 64).astype(np.float16))

        def config(name, **keys):
            with open(p(name), "w") as f:
                json.dump({"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6,
                           **keys}, f)
            return p(name)
        cfg64 = config("cfg64.json")
        cfg128 = config("cfg128.json", head_dim=128)
        cfg_mrope = config("cfg_mrope.json",
                           rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})

        def var(name, q="q.npy"):
            return ["--variant", name, "--q", p(q), "--out-q", out]
        theta = ["--theta", "10000"]
        vision = var("vision") + theta + ["--positions", p("p_hw.npy")]
        mrope = var("mrope") + theta + ["--positions", p("p3.npy"), "--section", "8,12,12"]
        norm = var("qk-norm-rope") + theta + pos + ["--q-weight", p("w.npy")]
        back = norm + ["--backward", "--grad-q", p("g.npy")]
        inter = var("interleave") + theta + pos
        rows = ["--cos", p("c_rows.npy"), "--sin", p("s_rows.npy")]

        expect_error("unknown --variant", var("spiral") + theta + pos,
                     ["--variant 'spiral'", "rope, vision, mrope, qk-norm-rope, interleave"])
        # flags the variant does not use
        expect_error("--section with rope", base() + pos + ["--section", "8,12,12"],
                     ["--section is only for --variant mrope"])
        expect_error("--section-layout with vision", vision + ["--section-layout", "chunked"],
                     ["--section-layout is only for --variant mrope"])
        expect_error("--output-layout with rope", base() + pos + ["--output-layout", "split-half"],
                     ["--output-layout is only for --variant interleave"])
        for flag, value in (("--q-weight", p("w.npy")), ("--k-weight", p("w.npy")),
                            ("--eps", "1e-5"), ("--rounding", "hf_qwen3"),
                            ("--grad-q", p("g.npy")), ("--out-q-weight-grad", p("wg.npy"))):
            expect_error(f"{flag} with interleave", inter + [flag, value],
                         [f"{flag} is only for --variant qk-norm-rope"])
        expect_error("--style with vision", vision + ["--style", "neox"],
                     ["--style is not used by --variant vision", "neox"])
        expect_error("--style with interleave", inter + ["--style", "gptj"],
                     ["--style is not used by --variant interleave"])
        expect_error("--offset with mrope", var("mrope") + theta + ["--offset", 3],
                     ["--offset is not used by --variant mrope"])
        expect_error("--offset with vision", var("vision") + theta + ["--offset", 3],
                     ["--offset is not used by --variant vision"])
        expect_error("--config with vision", var("vision") + ["--config", cfg64] + pos,
                     ["--config is not used by --variant vision"])
        expect_error("--rotary-dim with vision", vision + ["--rotary-dim", 32],
                     ["--rotary-dim is not used by --variant vision"])
        expect_error("--layout with mrope", mrope + ["--layout", "bshd"],
                     ["--layout is not used by --variant mrope"])
        expect_error("--cos with rope",
                     base() + ["--cos", p("c_rows.npy"), "--sin", p("s_rows.npy")],
                     ["--cos is not used by --variant rope"])
        expect_error("--cos with qk-norm-rope", norm + ["--cos", p("c_rows.npy")],
                     ["--cos is not used by --variant qk-norm-rope"])
        # flags that go together or exclude each other
        expect_error("--style missing for rope",
                     ["--q", p("q.npy"), "--theta", "1e4", "--out-q", out] + pos,
                     ["--variant rope needs --style"])
        expect_error("--grad-q without --backward", norm + ["--grad-q", p("g.npy")],
                     ["--grad-q is only for --variant qk-norm-rope with --backward"])
        expect_error("--out-q-weight-grad without --backward",
                     norm + ["--out-q-weight-grad", p("wg.npy")],
                     ["--out-q-weight-grad", "with --backward"])
        expect_error("--grad-q with rope --backward", base() + pos + ["--backward", "--grad-q",
                                                                     p("g.npy")],
                     ["--grad-q is only for --variant qk-norm-rope"])
        expect_error("qk-norm-rope without --q-weight", var("qk-norm-rope") + theta + pos,
                     ["needs --q-weight"])
        expect_error("qk-norm-rope --k without --k-weight", norm + with_k("k.npy"),
                     ["k.npy", "needs --k-weight"])
        expect_error("--k-weight without --k", norm + ["--k-weight", p("w.npy")],
                     ["--k-weight", "without --k"])
        expect_error("--backward without --grad-q", norm + ["--backward"], ["needs --grad-q"])
        expect_error("--backward --k without --grad-k",
                     back + with_k("k.npy") + ["--k-weight", p("w.npy")], ["needs --grad-k"])
        expect_error("--grad-k without --k", back + ["--grad-k", p("gk.npy")],
                     ["--grad-k", "without --k"])
        expect_error("--out-k-weight-grad without --k", back + ["--out-k-weight-grad", p("wk.npy")],
                     ["--out-k-weight-grad", "without --k"])
        expect_error("--backward with --rounding hf_qwen3", back + ["--rounding", "hf_qwen3"],
                     ["--rounding hf_qwen3", "no backward"])
        expect_error("--rounding hf_qwen3 with --style gptj",
                     norm + ["--rounding", "hf_qwen3", "--style", "gptj"], ["hf_qwen3", "neox"])
        expect_error("--out-q-weight-grad same as --out-q", back + ["--out-q-weight-grad", out],
                     ["--out-q and --out-q-weight-grad name the same file"])
        expect_error("--theta and --config", inter + ["--config", cfg64],
                     ["--theta and --config are mutually exclusive"])
        expect_error("neither --theta nor --config", var("vision") + ["--positions", p("p_hw.npy")],
                     ["--theta", "--config", "--cos/--sin"])
        expect_error("vision without positions", var("vision") + theta,
                     ["--variant vision needs --positions", "[S, 2]"])
        expect_error("mrope without positions", var("mrope") + theta + ["--section", "8,12,12"],
                     ["--variant mrope needs --positions", "[3, T]"])
        expect_error("--cos without --sin", var("vision") + ["--cos", p("c_rows.npy")],
                     ["--cos", "needs --sin"])
        expect_error("--sin without --cos", var("vision") + ["--sin", p("s_rows.npy")],
                     ["--sin", "needs --cos"])
        for flag, extra in (("--theta", theta), ("--positions", ["--positions", p("p_hw.npy")]),
                            ("--table", ["--table", "f32"]),
                            ("--precision", ["--precision", "hf_compat"])):
            expect_error(f"{flag} with --cos/--sin", var("vision") + rows + extra,
                         [f"{flag} is not used with --cos/--sin"])
        expect_error("--config with --rotary-dim", var("rope") + ["--style", "neox", "--config",
                                                                  cfg64, "--rotary-dim", 32] + pos,
                     ["--rotary-dim and --config"])
        expect_error("--config and no positions", var("rope") + ["--style", "neox", "--config",
                                                                 cfg64],
                     ["--positions", "--offset"])
        expect_error("--precision hf_compat --table f32 with --config",
                     var("interleave") + ["--config", cfg64, "--table", "f32", "--precision",
                                          "hf_compat"] + pos,
                     ["hf_compat", "--table", "--config"])
        # values
        expect_error("--section with two entries", mrope[:-1] + ["16,24"], ["--section '16,24'"])
        expect_error("--section with four entries", mrope[:-1] + ["8,8,8,8"],
                     ["--section '8,8,8,8'"])
        expect_error("--section not numbers", mrope[:-1] + ["a,b,c"], ["--section 'a,b,c'"])
        expect_error("--section negative", mrope[:-1] + ["-8,20,20"], ["--section '-8,20,20'"])
        expect_error("--section sum != rotary_dim/2", mrope[:-1] + ["8,8,8"],
                     ["--section [8, 8, 8]", "sums to 24", "rotary_dim/2 (32)"])
        expect_error("--section sum vs --rotary-dim", mrope + ["--rotary-dim", 32],
                     ["--section [8, 12, 12]", "sums to 32", "rotary_dim/2 (16)"])
        expect_error("mrope without --section", var("mrope") + theta + ["--positions", p("p3.npy")],
                     ["--variant mrope needs --section"])
        expect_error("mrope --config without mrope_section",
                     var("mrope") + ["--config", cfg64, "--positions", p("p3.npy")],
                     ["cfg64.json has no mrope_section"])
        expect_error("mrope --config section vs head_dim",
                     var("mrope") + ["--config", cfg_mrope, "--positions", p("p3.npy")],
                     ["cfg_mrope.json", "mrope_section", "[16, 24, 24]",
                      "rotary_dim/2 (32)"])
        expect_error("--config head_dim != q head_dim",
                     var("interleave") + ["--config", cfg128] + pos,
                     ["cfg128.json", "head_dim (128)", "q head_dim (64"])
        expect_error("--config missing file",
                     var("interleave") + ["--config", p("nope.json")] + pos,
                     ["nope.json"])
        for eps in ("nan", "inf", "-1"):
            expect_error(f"--eps {eps}", norm + ["--eps", eps], [f"--eps ({eps})"])
        expect_error("unknown --rounding", norm + ["--rounding", "bf16"], ["--rounding 'bf16'"])
        expect_error("unknown --output-layout", inter + ["--output-layout", "halves"],
                     ["--output-layout 'halves'"])
        expect_error("unknown --section-layout", mrope + ["--section-layout", "zigzag"],
                     ["--section-layout 'zigzag'"])
        # shapes and dtypes of the new inputs: the file, its shape and what is expected
        expect_error("vision positions [S]", var("vision") + theta + pos,
                     ["p.npy", "positions shape [5]", "[S, 2] = [5, 2]"])
        expect_error("vision positions [S, 3]", var("vision") + theta + ["--positions",
                                                                        p("p_hw3.npy")],
                     ["p_hw3.npy", "[5, 3]", "[S, 2] = [5, 2]"])
        expect_error("vision negative position", var("vision") + theta + ["--positions",
                                                                         p("p_hw_neg.npy")],
                     ["p_hw_neg.npy", "positions[2, 1] (-4)"])
        expect_error("vision head_dim 6", var("vision", "q6.npy") + theta + ["--positions",
                                                                            p("p_hw.npy")],
                     ["q6.npy", "head_dim (6", "[5, 4, 6]", "multiple of 4"])
        expect_error("mrope positions [2, T]", var("mrope") + theta + ["--positions",
                                                                      p("p3_bad.npy"),
                                                                      "--section", "8,12,12"],
                     ["p3_bad.npy", "[2, 5]", "[3, T] = [3, 5]"])
        expect_error("mrope positions [T]", var("mrope") + theta + pos + ["--section", "8,12,12"],
                     ["p.npy", "[5]", "[3, T] = [3, 5]"])
        expect_error("mrope rows instead of planes", var("mrope") + rows + ["--section", "8,12,12"],
                     ["c_rows.npy", "--cos shape [5, 64]", "[3, 5, 64] or [3, 5, 32]"])
        expect_error("vision rows planes", var("vision") + ["--cos", p("c_planes.npy"), "--sin",
                                                            p("c_planes.npy")],
                     ["c_planes.npy", "[3, 5, 64]", "[5, 64] or [5, 32]"])
        expect_error("vision rows 48 wide", var("vision") + ["--cos", p("c_wide.npy"), "--sin",
                                                             p("c_wide.npy")],
                     ["c_wide.npy", "[5, 48]", "[5, 64] or [5, 32]"])
        expect_error("--sin dtype != --cos", var("vision") + ["--cos", p("c_rows.npy"), "--sin",
                                                              p("s_f16.npy")],
                     ["s_f16.npy", "f16", "c_rows.npy", "f32"])
        expect_error("--sin shape != --cos", var("interleave") + ["--cos", p("c_rows.npy"), "--sin",
                                                                  p("c_wide.npy")],
                     ["c_wide.npy", "[5, 48]", "[5, 64]"])
        expect_error("interleave bshd rows of another batch",
                     var("interleave", "q_bshd.npy") + ["--layout", "bshd", "--cos", p("c_b3.npy"),
                                                        "--sin", p("s_b3.npy")],
                     ["c_b3.npy", "[3, 5, 64]", "[5, 64] or [5, 32] or [2, 5, 64]"])
        expect_error("cos uint16 without --dtype bf16", var("interleave") + ["--cos", p("c_u2.npy"),
                                                                             "--sin",
                                                                             p("c_u2.npy")],
                     ["c_u2.npy", "'<u2'", "--dtype bf16"])
        expect_error("--q-weight [65]", var("qk-norm-rope") + theta + pos + ["--q-weight",
                                                                            p("w65.npy")],
                     ["w65.npy", "--q-weight shape [65]", "[D] = [64]"])
        expect_error("--q-weight uint16 without --dtype bf16",
                     var("qk-norm-rope") + theta + pos + ["--q-weight", p("w_u2.npy")],
                     ["w_u2.npy", "'<u2'"])
        expect_error("--q-weight positions file", var("qk-norm-rope") + theta + pos +
                     ["--q-weight", p("p.npy")], ["p.npy", "'<i8'"])
        expect_error("--grad-q shape", norm + ["--backward", "--grad-q", p("g_bad.npy")],
                     ["g_bad.npy", "[5, 4, 32]", "--q", "[5, 4, 64]"])
        expect_error("--grad-q dtype", norm + ["--backward", "--grad-q", p("g_f16.npy")],
                     ["g_f16.npy", "f16", "[5, 4, 64] f32"])
        expect_error("--grad-q missing file", norm + ["--backward", "--grad-q", p("nope_g.npy")],
                     ["nope_g.npy"])
        # outputs: nothing is written unless every output can be
        expect_error("--out-q-weight-grad in a missing directory",
                     back + ["--out-q-weight-grad", p("no_such_dir/wg.npy")],
                     ["no_such_dir/wg.npy"])
        expect_error("qk-norm-rope --out-k in a missing directory",
                     norm + ["--k", p("k.npy"), "--k-weight", p("w.npy"), "--out-k",
                             p("no_such_dir/ok.npy")], ["no_such_dir/ok.npy"])
        expect_error("mrope --out-k an existing directory",
                     mrope + ["--k", p("k.npy"), "--out-k", p("a_dir")], ["a_dir", "directory"])

        # T = 0 for the variants: exit 0, empty outputs of the input's shape
        np.save(p("empty_hw.npy"), np.zeros((0, 2), np.int64))
        np.save(p("empty_p3.npy"), np.zeros((3, 0), np.int64))
        np.save(p("empty_rows.npy"), np.zeros((0, 64), np.float32))
        np.save(p("w64.npy"), f32(64))
        for name, extra in (
                ("vision positions [0, 2]", ["--variant", "vision", "--theta", "1e4",
                                             "--positions", p("empty_hw.npy")]),
                ("vision rows [0, 64]", ["--variant", "vision", "--cos", p("empty_rows.npy"),
                                         "--sin", p("empty_rows.npy")]),
                ("mrope positions [3, 0]", ["--variant", "mrope", "--theta", "1e4", "--section",
                                            "8,12,12", "--positions", p("empty_p3.npy")]),
                ("qk-norm-rope --offset 3", ["--variant", "qk-norm-rope", "--theta", "1e4",
                                             "--offset", 3, "--q-weight", p("w64.npy")]),
                ("interleave split-half --config", ["--variant", "interleave", "--config", cfg64,
                                                    "--output-layout", "split-half",
                                                    "--positions", p("empty_p.npy")])):
            if os.path.exists(p("empty_out.npy")):
                os.remove(p("empty_out.npy"))
            r = run("apply", "--q", p("empty.npy"), "--out-q", p("empty_out.npy"), *extra)
            ok = r.returncode == 0 and not r.stdout and not r.stderr
            if ok:
                a = np.load(p("empty_out.npy"))
                ok = a.dtype == np.float32 and a.shape == (0, 4, 64)
            check(ok, f"T = 0, {name}: exit {r.returncode}, output {'valid' if ok else 'invalid'}"
                  + (f" ({r.stderr.strip()})" if r.stderr else ""))

        # --help names every flag with the variants that read it
        r = run("apply", "--help")
        lines = r.stdout.splitlines()
        flags = ["--variant", "--q", "--k", "--positions", "--offset", "--style", "--theta",
                 "--config", "--cos", "--sin", "--rotary-dim", "--layout", "--dtype", "--backward",
                 "--table", "--precision", "--section", "--section-layout", "--q-weight",
                 "--k-weight", "--eps", "--rounding", "--grad-q", "--grad-k",
                 "--out-q-weight-grad", "--out-k-weight-grad", "--output-layout", "--out-q",
                 "--out-k"]
        missing = []
        for flag in flags:
            at = [i for i, line in enumerate(lines) if line.strip().startswith(flag + " ")]
            text = " ".join(lines[at[0]:at[0] + 2]) if at else ""
            if not at or "[" not in text.split(flag, 1)[1]:
                missing.append(flag)
        check(r.returncode == 0 and not missing,
              f"apply --help: exit {r.returncode}, every flag tagged with its variants"
              + (f" (missing {missing})" if missing else ""))

        # usage errors exit 2 as well
        r = run("frobnicate")
        check(r.returncode == 2 and r.stderr.startswith("tilerope: error:"),
              f"unknown subcommand: exit {r.returncode}")

    print(f"{COUNTS['passed']} passed, {COUNTS['failed']} failed")
    sys.exit(1 if COUNTS["failed"] else 0)


if __name__ == "__main__":
    main()
