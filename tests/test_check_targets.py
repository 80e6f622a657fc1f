"""scripts/check-targets.py against rows whose figures are set here: the rows of a full
`tilerope bench --json` run on main (docs/bench/bench-intel-xeon.json: its kernels, shapes
and keys), every figure then rewritten, so that each verdict is known. Every target met, each
target missed by one row (the row named, exit 1), a figure exactly at its threshold (met), rows
no target reads (gemma3-4b, prefetch) at any figure, a run without some target's rows (exit 1),
and files it cannot read or whose rows are not a bench's (exit 2).

Usage: /usr/bin/python3 test_check_targets.py SOURCE_DIR
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

SOURCE = sys.argv[1]
SCRIPT = os.path.join(SOURCE, "scripts", "check-targets.py")
RUN = os.path.join(SOURCE, "docs", "bench", "bench-intel-xeon.json")
COUNTS = {"passed": 0, "failed": 0}


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


def passing(rows):
    """Every figure set to meet its target with a margin."""
    rows = copy.deepcopy(rows)
    for r in rows:
        if r.get("fraction") is not None:
            r["fraction"] = 0.95
        if r.get("ns_per_call") is not None:
            r["ns_per_call"] = 500.0
        if r.get("speedup_vs_unfused") is not None:
            r["speedup_vs_unfused"] = 8.0
        if r["kernel"].endswith("-scale"):
            r["ns_per_element"] = 0.2
    return rows


def find(rows, kernel, dtype, inplace, shape, threads):
    hits = [r for r in rows if r["kernel"] == kernel and r["dtype"] == dtype
            and r["inplace"] == inplace and r["shape"].startswith(shape)
            and r["threads"] == threads]
    assert len(hits) == 1, (kernel, dtype, inplace, shape, threads, len(hits))
    return hits[0]


def label_of(r):
    io = "in" if r["inplace"] else "out"
    return f'{r["kernel"]} {r["dtype"]} {io} {r["shape"].split()[0]} {r["threads"]}t'


def run_on(rows, tmp):
    path = os.path.join(tmp, "rows.json")
    with open(path, "w") as f:
        json.dump(rows, f)
    return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)


def table_line(out, start):
    return next((line for line in out.splitlines() if line.startswith("| " + start)), "")


def main():
    with open(RUN) as f:
        base = passing(json.load(f))
    with tempfile.TemporaryDirectory() as tmp:
        res = run_on(base, tmp)
        lines = [t for t in res.stdout.splitlines() if t.startswith("| ") and "---" not in t][1:]
        check(res.returncode == 0 and "every target met" in res.stdout and len(lines) == 13
              and all(t.endswith("| met |") for t in lines[:12])
              and lines[12].endswith("| not read |")
              and lines[11].startswith("| time per element, T=1024 to T=32768:"),
              f"every target met: exit {res.returncode}, {len(lines) - 1} targets met, then the "
              "rows none reads")

        # each fraction target missed by one row, forward and backward
        misses = [
            ("rope neox/gptj, f32/bf16, in place, Qwen3-8B: fraction", 0.90,
             ("rope-gptj", "bf16", True, "qwen3-8b T=8192", 2)),
            ("rope neox/gptj, f32/bf16, in place, Qwen3-8B (backward)", 0.85,
             ("rope-neox-bwd", "f32", True, "qwen3-8b T=8192", 1)),
            ("rope neox/gptj, out of place: fraction", 0.85,
             ("rope-neox", "f16", False, "long T=32768", 2)),
            ("rope neox/gptj, out of place (backward)", 0.85,
             ("rope-neox-bwd", "bf16", False, "qwen3-8b T=8192", 2)),
            ("vision, mrope, interleave: fraction", 0.85,
             ("vision", "f16", True, "qwen2vl-vision", 1)),
            ("vision, mrope, interleave (backward)", 0.85,
             ("interleave-bwd", "bf16", False, "qwen3-8b T=8192", 1)),
            ("qk-norm-rope: fraction", 0.80, ("qk-norm-rope", "bf16", True, "qwen3-8b T=8192", 1)),
            ("qk-norm-rope (backward)", 0.80,
             ("qk-norm-rope-bwd", "f16", False, "qwen3-8b T=8192", 2)),
        ]
        for target, threshold, where in misses:
            kernel, dtype, inplace, shape, threads = where
            name = f'{kernel} {dtype} {"in" if inplace else "out"} {shape.split()[0]} {threads}t'
            rows = copy.deepcopy(base)
            find(rows, *where)["fraction"] = threshold - 0.01
            res = run_on(rows, tmp)
            line = table_line(res.stdout, target)
            check(res.returncode == 1 and "**not met**: 1 of" in line
                  and f"- {name} {threshold - 0.01:.4f} (-0.0100)" in res.stdout
                  and res.stdout.count("**not met**") == 1,
                  f"{name} at {threshold - 0.01:.2f}: only '{target}' not met, the row named")
            find(rows, *where)["fraction"] = threshold
            res = run_on(rows, tmp)
            check(res.returncode == 0, f"{name} exactly at {threshold:.2f}: met")

        # rope-neox-theta counts as rope-neox; in place f16 and other shapes have no target
        rows = copy.deepcopy(base)
        find(rows, "rope-neox-theta", "f32", True, "qwen3-8b T=8192", 1)["fraction"] = 0.84
        res = run_on(rows, tmp)
        line = table_line(res.stdout, "rope neox/gptj, f32/bf16, in place, Qwen3-8B: fraction")
        check(res.returncode == 1 and "**not met**: 1 of 12" in line
              and "rope-neox-theta f32 in qwen3-8b 1t 0.8400" in res.stdout,
              "rope-neox-theta in place at 0.84: read as rope-neox in place, not met")
        rows = copy.deepcopy(base)
        for r in rows:
            if (r["shape"].startswith("gemma3-4b") or r.get("prefetch_bytes") is not None
                    or (r["kernel"] == "rope-neox" and r["inplace"] and r["dtype"] == "f16")):
                r["fraction"] = 0.1
        res = run_on(rows, tmp)
        line = table_line(res.stdout, "rows no target names")
        rope = ("rope-neox", "rope-gptj", "rope-neox-theta", "rope-neox-bwd")
        unread = [r for r in rows if r["shape"].startswith("gemma3-4b")
                  or (r["kernel"] in rope and r["inplace"] and r["fraction"] is not None
                      and not r["shape"].startswith(("linear", "decode"))
                      and not (r["dtype"] != "f16"
                               and r["shape"].startswith("qwen3-8b T=8192 32")))]
        check(res.returncode == 0 and f"| {len(unread)} | 0.1000 (" in line
              and "| not read |" in line,
              "gemma3-4b, prefetch and in-place f16 rope rows at 0.1: no target reads them, "
              f"the last line counts {len(unread)} and shows the lowest (exit {res.returncode})")

        # decode T = 1 over 1 us; T = 16 has no time target
        rows = copy.deepcopy(base)
        find(rows, "qk-norm-rope", "bf16", True, "decode T=1 ", 1)["ns_per_call"] = 1001.0
        find(rows, "qk-norm-rope", "bf16", True, "decode T=16 ", 1)["ns_per_call"] = 9000.0
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "- qk-norm-rope bf16 in decode T=1 1t 1001 ns" in res.stdout
              and "**not met**: 1 of 20" in table_line(res.stdout, "decode T = 1"),
              "decode T = 1 at 1001 ns: not met, the row named")
        find(rows, "qk-norm-rope", "bf16", True, "decode T=1 ", 1)["ns_per_call"] = 1000.0
        res = run_on(rows, tmp)
        check("| met |" in table_line(res.stdout, "decode T = 1"), "decode T = 1 at 1000 ns: met")

        # the unfused baseline
        rows = copy.deepcopy(base)
        next(r for r in rows if r.get("speedup_vs_unfused"))["speedup_vs_unfused"] = 4.9
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "**not met**: 1 of 20" in table_line(res.stdout, "speedup"),
              "one row 4.9x over the unfused baseline: not met")

        # decode with all threads: every row slower is a slowdown, one row is noise
        rows = copy.deepcopy(base)
        for r in rows:
            if r.get("ns_per_call") is not None and r["threads"] > 1:
                r["ns_per_call"] *= 1.2
        res = run_on(rows, tmp)
        line = table_line(res.stdout, "decode with all")
        check(res.returncode == 1 and "median 1.200x" in line and "not met**: median" in line,
              "every decode row 1.2x slower with all threads: not met")
        rows = copy.deepcopy(base)
        find(rows, "mrope", "f32", True, "decode T=16 ", 2)["ns_per_call"] *= 1.5
        res = run_on(rows, tmp)
        line = table_line(res.stdout, "decode with all")
        check(res.returncode == 0 and "highest 1.500x (mrope f32 in decode T=16 2t)" in line,
              "one decode row 1.5x with all threads: met, the row shown")

        # linearity
        rows = copy.deepcopy(base)
        scale = [r for r in rows if r["kernel"].endswith("-scale")]
        scale[0]["ns_per_element"] = 0.2 * 1.16
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "1.160x" in table_line(res.stdout, "time per element"),
              "one length 1.16x the others' time per element: not met")

        # a figure exactly at its threshold is met; the miss names its row
        rows = copy.deepcopy(base)
        fused = [r for r in rows if r.get("speedup_vs_unfused")]
        fused[0]["speedup_vs_unfused"] = 5.0
        lengths = [r for r in rows if r["kernel"].endswith("-scale")]
        lengths[0]["ns_per_element"] = 0.2 * 1.15
        res = run_on(rows, tmp)
        check(res.returncode == 0, "speedup exactly 5x and a length exactly 1.15x: met")
        fused[0]["speedup_vs_unfused"] = 4.99
        res = run_on(rows, tmp)
        check(res.returncode == 1 and f"- {label_of(fused[0])} 4.99x" in res.stdout,
              "speedup 4.99x: not met, the row named")

        # a measurement without its figure (NaN is written as null) misses, as does a row
        # absent at one of the thread counts
        rows = copy.deepcopy(base)
        row = find(rows, "mrope", "bf16", False, "qwen3-8b T=8192", 2)
        row["fraction"] = None
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "- mrope bf16 out qwen3-8b 2t: no figure" in res.stdout
              and "**not met**: 1 of 36" in table_line(res.stdout, "vision, mrope, interleave:"),
              "an mrope row without its fraction: not met, named")
        rows = copy.deepcopy(base)
        rows.remove(find(rows, "qk-norm-rope-bwd", "f32", True, "qwen3-8b T=8192", 2))
        res = run_on(rows, tmp)
        check(res.returncode == 1
              and "- qk-norm-rope-bwd f32 in qwen3-8b: no row at 2t" in res.stdout,
              "a qk-norm-rope-bwd row absent at two threads: not met, named")
        rows = copy.deepcopy(base)
        find(rows, "rope-gptj", "f32", True, "decode T=1 ", 1)["ns_per_call"] = None
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "- rope-gptj f32 in decode T=1 1t: no figure" in res.stdout,
              "a decode row without its time: not met, named")

        # a machine of one thread: nothing to compare for the decode rows
        rows = [r for r in copy.deepcopy(base) if r["threads"] == 1]
        res = run_on(rows, tmp)
        line = table_line(res.stdout, "decode with")
        check(res.returncode == 0 and "| n/a: one thread |" in line,
              "one thread only: decode with all threads n/a, every target met "
              f"(exit {res.returncode})")

        # a quick run's two lengths: the line names the lengths it read
        rows = [r for r in copy.deepcopy(base) if not (r["kernel"].endswith("-scale")
                and r["shape"].split()[1] in ("T=4096", "T=32768"))]
        res = run_on(rows, tmp)
        check(res.returncode == 0 and table_line(res.stdout, "time per element, T=1024 to T=8192:"),
              "the lengths 1024 and 8192 only: the line reads 'T=1024 to T=8192'")

        # a run without some target's rows (bench --only rope, say)
        rows = [r for r in base if not r["kernel"].startswith("qk-norm")]
        res = run_on(rows, tmp)
        check(res.returncode == 1 and "| no rows |" in table_line(res.stdout, "qk-norm-rope: ")
              and "not every target met" in res.stdout,
              "no qk-norm-rope rows: 'no rows', not met")

        # files it cannot read
        res = subprocess.run([sys.executable, SCRIPT, os.path.join(tmp, "absent.json")],
                             capture_output=True, text=True)
        check(res.returncode == 2 and "absent.json" in res.stderr, "a missing file: exit 2, named")
        path = os.path.join(tmp, "object.json")
        with open(path, "w") as f:
            json.dump({"kernel": "rope-neox"}, f)
        res = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)
        check(res.returncode == 2 and "expected a JSON list of rows" in res.stderr,
              "a JSON object: exit 2, says a list is expected")
        rows = copy.deepcopy(base)
        del rows[0]["kernel"]
        res = run_on(rows, tmp)
        check(res.returncode == 2 and "KeyError: 'kernel'" in res.stderr and not res.stdout,
              "a row without its kernel: exit 2, the key named, no table")
        res = run_on([["rope-neox", "f32"]], tmp)
        check(res.returncode == 2 and "rows.json" in res.stderr and not res.stdout,
              "a row that is a list: exit 2, the file named, no table")
        res = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
        check(res.returncode == 2 and "check-targets.py bench.json" in res.stderr,
              "no argument: exit 2, usage")

    print(f'{COUNTS["passed"]} passed, {COUNTS["failed"]} failed')
    return 1 if COUNTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
