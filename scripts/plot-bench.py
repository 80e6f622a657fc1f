#!/usr/bin/env python3
"""Plots `tilerope bench --json OUT.json`: for each prefill shape, every kernel's GB/s beside
the ceiling measured in the same run (OUT_DIR/<shape>.png), the decode, linearity and
prefetch-distance rows (OUT_DIR/decode.png, OUT_DIR/linearity.png, OUT_DIR/prefetch.png).
docs/performance.md shows some of them, one machine class per folder (docs/bench/CLASS).

    scripts/plot-bench.py bench.json [OUT_DIR]    # OUT_DIR: docs/bench unless given
    scripts/plot-bench.py docs/bench/bench-zen5.json docs/bench/zen5
    scripts/plot-bench.py --table bench.json      # the rows as a Markdown table, to stdout
"""
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def num(v, f):
    return "-" if v is None else format(v, f)


def markdown_table(rows):
    print("| kernel | dtype | io | shape | threads | GB/s | ceiling GB/s | fraction | "
          "speedup vs unfused | ns/call | ns/element |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        speed = r.get("speedup_vs_unfused") or r.get("tile_time_ratio")
        print(f'| {r["kernel"]} | {r["dtype"]} | {"in" if r["inplace"] else "out"} | {r["shape"]} '
              f'| {r["threads"]} | {num(r["gbps"], ".1f")} | {num(r["ceiling_gbps"], ".1f")} '
              f'| {num(r["fraction"], ".2f")} | {num(speed, ".1f")}{"x" if speed else ""} '
              f'| {num(r["ns_per_call"], ".0f")} | {num(r.get("ns_per_element"), ".3f")} |')


def save(fig, path, written, dpi=110):
    """Writes the figure to path, closes it, and notes the path in `written`."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    written.append(path)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--table":
        markdown_table(json.load(open(sys.argv[2])))
        return
    rows = json.load(open(sys.argv[1]))
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join("docs", "bench")
    os.makedirs(out_dir, exist_ok=True)
    written = []

    prefill = [r for r in rows if r["fraction"] is not None and not r["kernel"].endswith("-scale")
               and r.get("prefetch_bytes") is None]
    for shape in dict.fromkeys(r["shape"] for r in prefill):
        group = [r for r in prefill if r["shape"] == shape]
        kernels = list(dict.fromkeys(r["kernel"] for r in group))
        cols = min(3, len(kernels))
        nrows = (len(kernels) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
        for ax in axes.flat[len(kernels):]:
            ax.axis("off")
        for ax, kernel in zip(axes.flat, kernels):
            sub = [r for r in group if r["kernel"] == kernel]
            labels = [f'{r["dtype"]} {"in" if r["inplace"] else "out"} {r["threads"]}t'
                      for r in sub]
            xs = range(len(sub))
            ax.bar([x - 0.2 for x in xs], [r["gbps"] for r in sub], 0.4, label="kernel")
            ax.bar([x + 0.2 for x in xs], [r["ceiling_gbps"] for r in sub], 0.4,
                   label="ceiling (same run)", color="#bbbbbb")
            for x, r in zip(xs, sub):
                ax.text(x, max(r["gbps"], r["ceiling_gbps"]) * 1.02, f'{r["fraction"]:.2f}',
                        ha="center", fontsize=6)
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=6)
            ax.set_title(kernel, fontsize=9)
            ax.set_ylabel("GB/s", fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
        axes.flat[0].legend(fontsize=7)
        fig.suptitle(f"{shape}: kernel GB/s against the ceiling, fraction above each pair",
                     fontsize=10)
        save(fig, os.path.join(out_dir, slug(shape) + ".png"), written, dpi=100)

    decode = [r for r in rows if r["ns_per_call"] is not None]
    if decode:
        fig, ax = plt.subplots(figsize=(max(6, 0.42 * len(decode) + 2), 4.2))
        # the timer's own cost (an empty call timed as the calls are) in grey
        timer = [r["kernel"] == "decode-timer" for r in decode]
        labels = ["timer (empty call)" if t else
                  f'{r["kernel"]} {r["dtype"]} {r["shape"].split()[1]} {r["threads"]}t'
                  for r, t in zip(decode, timer)]
        ax.bar(range(len(decode)), [r["ns_per_call"] / 1000 for r in decode],
               color=["0.6" if t else "C0" for t in timer])
        ax.axhline(1.0, color="red", linewidth=0.8, label="1 us")
        ax.set_xticks(range(len(decode)))
        ax.set_xticklabels(labels, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel("microseconds per call (median)")
        ax.set_title("decode, 32 q heads + 8 k heads, head_dim 128")
        ax.legend(fontsize=8)
        save(fig, os.path.join(out_dir, "decode.png"), written)

    scale = [r for r in rows if r["kernel"].endswith("-scale")]
    if scale:
        fig, ax = plt.subplots(figsize=(6, 4))
        tokens = [int(r["shape"].split("T=")[1].split()[0]) for r in scale]
        ax.plot(tokens, [r["ns_per_element"] for r in scale], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("ns per element (median)")
        ax.set_title("rope-neox bf16 in place, 1 thread: cost per element")
        save(fig, os.path.join(out_dir, "linearity.png"), written)

    sweep = [r for r in rows if r.get("prefetch_bytes") is not None]
    if sweep:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for kernel, dtype in dict.fromkeys((r["kernel"], r["dtype"]) for r in sweep):
            for threads in dict.fromkeys(r["threads"] for r in sweep):
                sub = [r for r in sweep if r["kernel"] == kernel and r["dtype"] == dtype
                       and r["threads"] == threads]
                if sub:
                    ax.plot([r["prefetch_bytes"] for r in sub], [r["fraction"] for r in sub],
                            marker="o", label=f'{kernel.split(":", 1)[1]} {dtype} {threads}t')
        ax.set_xlabel("software prefetch distance (bytes)")
        ax.set_ylabel("fraction of the ceiling (median)")
        ax.set_ylim(bottom=0)
        ax.set_title("in place, Qwen3-8B: fraction by software prefetch distance")
        ax.legend(fontsize=7)
        save(fig, os.path.join(out_dir, "prefetch.png"), written)

    for p in written:
        print(p)


if __name__ == "__main__":
    main()
