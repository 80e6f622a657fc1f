#!/usr/bin/env python3
"""Reads `tilerope bench --json OUT.json` against the performance targets (docs/performance.md,
"The targets"): one line per target with the rows it covers, the worst of them, and every row
that misses it, by how much (a row without its figure, or absent at one of the thread counts,
misses). Exit status 0 when every target is met, 1 when one is not or has no rows in the file
(a run with --only, say), 2 when the file cannot be read as a bench's rows.

    scripts/check-targets.py bench.json              # a Markdown table, to stdout

The rows the targets do not name (rope in place in f16 or at shapes other than Qwen3-8B's,
gemma3-4b's rows) are read by none; the table's last line gives the lowest of them. Neither are
the prefetch-distance rows and the tile-layer row.
"""
import json
import signal
import statistics
import sys

# the prefill shapes the targets name, as `tilerope bench` labels them
PREFILL_SHAPES = ("qwen3-8b T=8192 ", "llama3.1-8b T=8192 ", "qwen2vl-vision T=4096 ",
                  "long T=32768 ")
QWEN3_8B = PREFILL_SHAPES[0]
DECODE_T1 = "decode T=1 "

ROPE_IN_PLACE = 0.90   # rope neox and gptj, f32 and bf16, in place, Qwen3-8B prefill
OTHER = 0.85           # out of place; vision, mrope, interleave; every backward but qk-norm's
QK_NORM = 0.80         # qk-norm-rope and its backward
DECODE_NS = 1000.0     # decode T = 1, per call
UNFUSED = 5.0          # speedup over the unfused baseline
DECODE_THREADS = 1.10  # decode with all threads allowed against one thread: "no slowdown"
LINEAR = 1.15          # time per element, slowest length against fastest


def family(kernel):
    """The forward kernel a row's kernel is measured as ("backward as forward")."""
    base = kernel[:-len("-bwd")] if kernel.endswith("-bwd") else kernel
    return "rope-neox" if base == "rope-neox-theta" else base


def label(r):
    io = "in" if r["inplace"] else "out"
    words = r["shape"].split()
    shape = " ".join(words[:2]) if words[0] == "decode" else words[0]  # the model, or decode T=N
    return f'{r["kernel"]} {r["dtype"]} {io} {shape} {r["threads"]}t'


def fraction_targets(rows):
    """(name, threshold, rows) for each fraction target, forward and backward apart, and the
    rows with a fraction that no target reads. A row at the prefill shapes is read whether or
    not it has a fraction (a measurement that failed writes none, and then misses)."""
    timed = [r for r in rows if not r["kernel"].startswith("prefetch:")
             and not r["kernel"].endswith("-scale")]
    prefill = [r for r in timed if r["shape"].startswith(PREFILL_SHAPES)]
    rope = ("rope-neox", "rope-gptj")
    groups = [
        ("rope neox/gptj, f32/bf16, in place, Qwen3-8B", ROPE_IN_PLACE,
         lambda r: family(r["kernel"]) in rope and r["inplace"] and r["dtype"] in ("f32", "bf16")
         and r["shape"].startswith(QWEN3_8B)),
        ("rope neox/gptj, out of place", OTHER,
         lambda r: family(r["kernel"]) in rope and not r["inplace"]),
        ("vision, mrope, interleave", OTHER,
         lambda r: family(r["kernel"]) in ("vision", "mrope", "interleave")),
        ("qk-norm-rope", QK_NORM, lambda r: family(r["kernel"]) == "qk-norm-rope"),
    ]
    out = []
    for name, threshold, covers in groups:
        for backward in (False, True):
            sub = [r for r in prefill if covers(r) and r["kernel"].endswith("-bwd") == backward]
            # every backward is held to OTHER, but QK RMSNorm's to its own
            held = min(threshold, OTHER) if backward and threshold != QK_NORM else threshold
            out.append((name + (" (backward)" if backward else ""), held, sub))
    read = {id(r) for _, _, sub in out for r in sub}
    return out, [r for r in timed if id(r) not in read and r.get("fraction") is not None]


def missing_threads(sub, threads):
    """A line for each row (kernel, dtype, in or out of place, shape) of `sub` absent at one of
    the thread counts `threads`: every fraction target holds at one and at all threads."""
    have = {}
    for r in sub:
        have.setdefault(row_key(r), set()).add(r["threads"])
    return [f"{k[0]} {k[1]} {'in' if k[2] else 'out'} {k[3].split()[0]}: no row at {t}t"
            for k, ts in have.items() for t in threads if t not in ts]


def row_key(r):
    return r["kernel"], r["dtype"], r["inplace"], r["shape"]


def verdict(misses, count):
    if count == 0:
        return "no rows"
    return "met" if not misses else f"**not met**: {len(misses)} of {count} rows"


def check(rows):
    """The table's lines (target, rows, worst, verdict, misses) and whether all are met."""
    lines = []
    threads = sorted({1, max((r["threads"] for r in rows), default=1)})

    targets, unread = fraction_targets(rows)
    for name, threshold, sub in targets:
        measured = sorted((r for r in sub if r.get("fraction") is not None),
                          key=lambda r: r["fraction"])
        misses = [f"{label(r)}: no figure" for r in sub if r.get("fraction") is None]
        misses += [f'{label(r)} {r["fraction"]:.4f} ({r["fraction"] - threshold:+.4f})'
                   for r in measured if r["fraction"] < threshold]
        misses += missing_threads(sub, threads)
        lines.append((f"{name}: fraction >= {threshold:.2f}", len(sub),
                      f'{measured[0]["fraction"]:.4f} ({label(measured[0])})' if measured else "-",
                      verdict(misses, len(sub)), misses))

    decode = [r for r in rows if r["shape"].startswith(DECODE_T1)]
    measured = sorted((r for r in decode if r.get("ns_per_call") is not None),
                      key=lambda r: -r["ns_per_call"])
    misses = [f"{label(r)}: no figure" for r in decode if r.get("ns_per_call") is None]
    misses += [f'{label(r)} {r["ns_per_call"]:.0f} ns' for r in measured
               if r["ns_per_call"] > DECODE_NS]
    lines.append((f"decode T = 1: ns per call <= {DECODE_NS:.0f}", len(decode),
                  f'{measured[0]["ns_per_call"]:.0f} ns ({label(measured[0])})' if measured
                  else "-", verdict(misses, len(decode)), misses))

    fused = sorted((r for r in rows if r.get("speedup_vs_unfused") is not None),
                   key=lambda r: r["speedup_vs_unfused"])
    misses = [f'{label(r)} {r["speedup_vs_unfused"]:.2f}x' for r in fused
              if r["speedup_vs_unfused"] < UNFUSED]
    lines.append((f"speedup over the unfused baseline >= {UNFUSED:.0f}x", len(fused),
                  f'{fused[0]["speedup_vs_unfused"]:.2f}x ({label(fused[0])})' if fused else "-",
                  verdict(misses, len(fused)), misses))

    # decode rows with all threads allowed against the same rows on one thread: a call under the
    # small-problem threshold that went to the threads would be slower in every row, so the
    # median ratio is read (one row's median moves by 10-15% between runs on a shared machine)
    calls = [r for r in rows if r["shape"].startswith("decode ")
             and r.get("ns_per_call") is not None]
    one = {row_key(r): r for r in calls if r["threads"] == 1}
    ratios = sorted(((r["ns_per_call"] / one[row_key(r)]["ns_per_call"], r) for r in calls
                     if r["threads"] > 1 and row_key(r) in one), key=lambda t: t[0])
    name = f"decode with all threads: median time <= {DECODE_THREADS:.2f}x one thread's"
    if threads == [1]:  # nothing to compare on a machine of one thread
        lines.append((name, 0, "-", "n/a: one thread", []))
    else:
        mid = statistics.median(x for x, _ in ratios) if ratios else None
        misses = ([f"median {mid:.3f}x over {len(ratios)} rows"]
                  if mid is not None and mid > DECODE_THREADS else [])
        worst = (f"median {mid:.3f}x; highest {ratios[-1][0]:.3f}x ({label(ratios[-1][1])})"
                 if ratios else "-")
        lines.append((name, len(ratios), worst,
                      f"**not met**: median {mid:.3f}x" if misses else verdict(misses, len(ratios)),
                      misses))

    scale = sorted((r for r in rows if r["kernel"].endswith("-scale")),
                   key=lambda r: int(r["shape"].split("T=")[1].split()[0]))
    per_element = [r.get("ns_per_element") for r in scale]
    name = f"time per element over T: slowest <= {LINEAR:.2f}x fastest"
    if len(scale) >= 2 and None not in per_element and min(per_element) > 0:
        spread = max(per_element) / min(per_element)
        lengths = ", ".join(f'{r["shape"].split()[1]} {r["ns_per_element"]:.3f}' for r in scale)
        name = (f"time per element, {scale[0]['shape'].split()[1]} to "
                f"{scale[-1]['shape'].split()[1]}: slowest <= {LINEAR:.2f}x fastest")
        misses = [f"{spread:.3f}x ({lengths} ns)"] if spread > LINEAR else []
        lines.append((name, len(scale), f"{spread:.3f}x ({lengths} ns)",
                      "met" if not misses else f"**not met**: {spread:.3f}x", misses))
    else:
        misses = [f"{label(r)}: no figure" for r in scale if r.get("ns_per_element") is None]
        lines.append((name, len(scale), "-", "**not met**: no figure" if misses else "no rows",
                      misses))

    ok = all(line[3] in ("met", "n/a: one thread") for line in lines)
    low = min(unread, key=lambda r: r["fraction"], default=None)
    lines.append(("rows no target names (rope in place in f16 or at other shapes; gemma3-4b)",
                  len(unread), f'{low["fraction"]:.4f} ({label(low)})' if low else "-",
                  "not read", []))
    return lines, ok


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            rows = json.load(f)
        if not isinstance(rows, list):
            raise ValueError("expected a JSON list of rows")
        lines, ok = check(rows)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            ZeroDivisionError) as e:  # not a bench JSON: a row without a key, of another type
        print(f"check-targets.py: {sys.argv[1]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print("| target | rows | worst | verdict |")
    print("|---|---|---|---|")
    for name, count, worst, result, _ in lines:
        print(f"| {name} | {count} | {worst} | {result} |")
    short = [(name, misses) for name, _, _, _, misses in lines if misses]
    for name, misses in short:
        print(f"\n{name}, rows that miss it:")
        for m in misses:
            print(f"- {m}")
    print(f'\n{"every target met" if ok else "not every target met"}')
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: end quietly
    sys.exit(main())
