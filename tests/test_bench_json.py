"""`tilerope bench --quick --json OUT.json` writes what its readers take: a list of rows, each
with the keys the performance issue names and the types they hold (null where a figure does not
apply), fractions that are the row's GB/s over its ceiling's, and rows that every target of
scripts/check-targets.py finds (no "no rows" line, exit 0 or 1: the speed itself is not asserted
here, only that the run can be read against the targets).

Usage: /usr/bin/python3 test_bench_json.py path/to/tilerope SOURCE_DIR
Prints one line per check, then `N passed, M failed`; exits 1 if any check failed.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

BINARY, SOURCE = sys.argv[1], sys.argv[2]
COUNTS = {"passed": 0, "failed": 0}
KEYS = {"kernel": str, "dtype": str, "inplace": bool, "shape": str, "threads": int,
        "gbps": float, "ceiling_gbps": float, "fraction": float, "ns_per_call": float}


def check(ok, what):
    print(("PASS  " if ok else "FAIL  ") + what)
    COUNTS["passed" if ok else "failed"] += 1


def typed(v, t):
    if v is None:
        return True
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return isinstance(v, t) and (t is not int or not isinstance(v, bool))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "quick.json")
        res = subprocess.run([BINARY, "bench", "--quick", "--json", out], capture_output=True,
                             text=True)
        check(res.returncode == 0 and os.path.exists(out),
              f"bench --quick --json: exit {res.returncode}, file written")
        if res.returncode != 0 or not os.path.exists(out):
            print(res.stderr[-2000:])
            return 1
        with open(out) as f:
            rows = json.load(f)
        check(isinstance(rows, list) and len(rows) > 50, f"a list of rows ({len(rows)})")

        bad = [r for r in rows if not all(k in r and typed(r[k], t) for k, t in KEYS.items())]
        check(not bad, "every row has the named keys with their types"
              + (f" (first that does not: {bad[0]})" if bad else ""))
        if bad:
            print(f'{COUNTS["passed"]} passed, {COUNTS["failed"]} failed')
            return 1

        timed = [r for r in rows if r["fraction"] is not None]
        off = [r for r in timed if r["gbps"] is None or r["ceiling_gbps"] is None
               or r["gbps"] <= 0 or r["ceiling_gbps"] <= 0
               or abs(r["fraction"] - r["gbps"] / r["ceiling_gbps"]) > 1e-9 * r["fraction"]]
        check(timed and not off, f"fraction = gbps / ceiling_gbps in each of {len(timed)} rows"
              + (f" (not in {off[0]})" if off else ""))

        calls = [r for r in rows if r["ns_per_call"] is not None]
        check(calls and all(r["fraction"] is None and r["ns_per_call"] > 0 for r in calls),
              f"{len(calls)} decode rows: ns per call, no fraction")
        counts = {1, max(r["threads"] for r in rows)}
        at = {}
        for r in timed:
            if r["kernel"].endswith("-scale"):  # the linearity rows: one thread by design
                continue
            at.setdefault((r["kernel"], r["dtype"], r["inplace"], r["shape"]), set()).add(
                r["threads"])
        lone = [k for k, ts in at.items() if ts != counts]
        check(not lone, f"every timed row at one thread and at all ({sorted(counts)})"
              + (f" (not {lone[0]})" if lone else ""))

        res = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "check-targets.py"),
                              out], capture_output=True, text=True)
        lines = [t for t in res.stdout.splitlines() if t.startswith("| ") and "---" not in t][1:]
        empty = [t for t in lines if "| no rows |" in t]
        check(res.returncode in (0, 1) and len(lines) == 13 and not empty,
              f"check-targets.py reads it: exit {res.returncode}, {len(lines) - 1} targets, "
              f"none without rows" + (f" ({empty})" if empty else ""))

    print(f'{COUNTS["passed"]} passed, {COUNTS["failed"]} failed')
    return 1 if COUNTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
