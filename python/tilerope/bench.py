"""tilerope against what a PyTorch user runs today, in one process:

    python -m tilerope.bench [--quick] [--json OUT.json]

Times ``tilerope.apply_rotary_pos_emb``, transformers' ``apply_rotary_pos_emb`` (eager) and
``torch.compile`` of it on the same tensors: Qwen3-8B shapes (32 q heads, 8 kv heads, head_dim
128) in the layout its attention passes (``[B, H, S, D]`` views of ``[B, S, H, D]``
projections), prefill (8192 tokens) and decode (one token, batch 1 and 64), float32 and
bfloat16, one thread and all threads. Each figure is the median of repeated calls, the three
functions taking turns; the ratios are of medians of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Callable, Optional

import torch

import tilerope

HEADS_Q, HEADS_K, HEAD_DIM = 32, 8, 128
CASES = [("prefill", 1, 8192), ("decode", 1, 1), ("decode", 64, 1)]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median_seconds(fns: dict[str, Callable[[], object]], budget: float) -> dict[str, float]:
    """The median time of one call of each function. The functions take turns, a slice of about
    20 ms each, for about `budget` seconds in all (at least 5 calls each), so that a slow minute
    of a shared machine falls on all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
        fn()
    start = time.perf_counter()
    while min(len(t) for t in times.values()) < 5 or time.perf_counter() - start < budget:
        for name, fn in fns.items():
            slice_end = time.perf_counter() + 0.02
            while True:
                t = time.perf_counter()
                fn()
                done = time.perf_counter()
                times[name].append(done - t)
                if done >= slice_end:
                    break
        if min(len(t) for t in times.values()) >= 100000:
            break
    return {name: statistics.median(t) for name, t in times.items()}


def transformers_function() -> Optional[Callable]:
    try:
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb
    except ImportError:
        return None
    return apply_rotary_pos_emb


def run(quick: bool) -> list[dict]:
    hf = transformers_function()
    budget = 1.0 if quick else 4.0
    all_threads = os.cpu_count() or 1
    rows = []
    for threads in sorted({1, all_threads}):
        torch.set_num_threads(threads)
        tilerope.set_num_threads(threads)
        torch._dynamo.reset()
        compiled = torch.compile(hf, dynamic=False) if hf is not None else None
        for case, batch, seq in CASES:
            for dtype in (torch.float32, torch.bfloat16):
                gen = torch.Generator().manual_seed(0)
                q = torch.randn(batch, seq, HEADS_Q, HEAD_DIM, generator=gen).to(dtype)
                k = torch.randn(batch, seq, HEADS_K, HEAD_DIM, generator=gen).to(dtype)
                q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, S, D) views
                pos = torch.randint(0, 32768, (batch, seq), generator=gen)
                inv, _ = tilerope.rope_parameters({"head_dim": HEAD_DIM, "rope_theta": 1e6})
                cos, sin = tilerope.cos_sin(pos, inv, dtype=dtype)
                moved = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * cos.nbytes
                row = {"case": case, "batch": batch, "seq": seq, "dtype": str(dtype)[6:],
                       "threads": threads, "bytes": moved}
                fns = {"tilerope": lambda: tilerope.apply_rotary_pos_emb(q, k, cos, sin)}
                if hf is not None:
                    fns["eager"] = lambda: hf(q, k, cos, sin)
                    fns["compiled"] = lambda: compiled(q, k, cos, sin)
                with torch.no_grad():
                    for name, seconds in median_seconds(fns, budget).items():
                        row[f"{name}_s"] = seconds
                row["tilerope_gbps"] = moved / row["tilerope_s"] / 1e9
                for peer in ("eager", "compiled"):
                    if f"{peer}_s" in row:
                        row[f"{peer}_gbps"] = moved / row[f"{peer}_s"] / 1e9
                        row[f"vs_{peer}"] = row[f"{peer}_s"] / row["tilerope_s"]
                rows.append(row)
                print_row(row)
    return rows


def print_header():
    print(f"{'case':<15}{'dtype':<10}{'thr':>4}{'tilerope':>12}{'eager':>12}{'compiled':>12}"
          f"{'GB/s':>8}{'x eager':>9}{'x compiled':>11}")


def print_row(r: dict):
    def ms(key):
        return f"{r[key] * 1e3:10.3f}ms" if key in r else f"{'-':>12}"

    def ratio(key, width):
        return f"{r[key]:{width}.1f}x" if key in r else f"{'-':>{width + 1}}"

    name = f"{r['case']} B={r['batch']}" if r["case"] == "decode" else f"{r['case']} S={r['seq']}"
    print(f"{name:<15}{r['dtype']:<10}{r['threads']:>4}{ms('tilerope_s')}{ms('eager_s')}"
          f"{ms('compiled_s')}{r['tilerope_gbps']:8.1f}{ratio('vs_eager', 8)}"
          f"{ratio('vs_compiled', 10)}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tilerope.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s per row instead of 4")
    parser.add_argument("--json", metavar="OUT", help="write the rows and the machine to OUT")
    args = parser.parse_args(argv)
    print(f"tilerope {tilerope.__version__} ({tilerope.cpu_target()}), torch {torch.__version__}, "
          f"{cpu_name()}, {os.cpu_count()} CPUs")
    print("x eager, x compiled: the peer's median time over tilerope's (same run)")
    print_header()
    rows = run(args.quick)
    if args.json:
        import transformers

        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "cpus": os.cpu_count(), "torch": torch.__version__,
                       "transformers": transformers.__version__,
                       "tilerope": tilerope.__version__, "target": tilerope.cpu_target(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
