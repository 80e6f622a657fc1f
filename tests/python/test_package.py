"""The package: version, runtime settings, and the GIL released while a kernel runs."""

import re
import threading
import time
from pathlib import Path

import torch

import tilerope


def test_version_is_the_cpp_version():
    cmake = (Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert tilerope.__version__ == re.search(r"project\(tilerope VERSION ([0-9.]+)", cmake)[1]


def test_runtime_settings():
    n = tilerope.num_threads()
    try:
        tilerope.set_num_threads(1)
        assert tilerope.num_threads() == 1
    finally:
        tilerope.set_num_threads(n)
    assert "scalar" in tilerope.compiled_cpu_targets()
    assert tilerope.cpu_target() in tilerope.supported_cpu_targets()
    try:
        tilerope.set_cpu_target("scalar")
        assert tilerope.cpu_target() == "scalar"
    finally:
        tilerope.set_cpu_target("best")
    # the class as the prefetch table names it, with the cpuid family and model
    assert re.fullmatch(r"(Intel|AMD Zen [345]|AMD before Zen 3|other) \(family \d+, model \d+\)",
                        tilerope.cpu_class()), tilerope.cpu_class()


def test_gil_is_released_while_a_kernel_runs():
    """The main thread runs Python between the moments the worker enters and leaves a long
    kernel: it could not if the kernel held the GIL (it would wait for the call to return)."""
    q = torch.randn(1, 32, 32768, 128)
    k = torch.randn(1, 8, 32768, 128)
    cos, sin = torch.randn(32768, 128), torch.randn(32768, 128)
    started = threading.Event()
    times = {}

    def rotate():
        started.set()
        times["enter"] = time.perf_counter()
        tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        times["leave"] = time.perf_counter()

    n = tilerope.num_threads()
    tilerope.set_num_threads(1)
    try:
        worker = threading.Thread(target=rotate)
        worker.start()
        started.wait()
        time.sleep(0.01)  # the worker is in the kernel by now (it takes ~0.2 s or more)
        times["main"] = time.perf_counter()
        worker.join()
    finally:
        tilerope.set_num_threads(n)
    assert times["enter"] < times["main"] < times["leave"]


def test_readme_example_runs(monkeypatch):
    """The README's Python example, as written, from the repository root."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    example = re.search(r"```python\n(.*?)```", readme, re.S)[1]
    monkeypatch.chdir(root)
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    q, k = scope["q"], scope["k"]
    assert q.shape == (1, 32, 16, 128) and k.shape == (1, 8, 16, 128)
    assert q.dtype == torch.bfloat16 and bool(torch.isfinite(q).all())


def test_large_outputs_reuse_cached_memory():
    """Outputs from 4 MiB up come from the output cache: a freed one is handed out again, the
    cache keeps no more than its limit, and empties on request."""
    q = torch.randn(1, 2048, 8, 128).transpose(1, 2)  # 8 MiB
    k = torch.randn(1, 2048, 2, 128).transpose(1, 2)  # 2 MiB: torch's own allocation
    cos, sin = torch.randn(2048, 128), torch.randn(2048, 128)
    limit = tilerope.output_cache_limit()
    try:
        tilerope.empty_output_cache()
        q_out, k_out = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        assert q_out.stride() == torch.empty_like(q).stride()
        address = q_out.data_ptr()
        del q_out, k_out
        assert tilerope.output_cache_bytes() == 8 << 20
        q_out, _ = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        assert q_out.data_ptr() == address and tilerope.output_cache_bytes() == 0
        tilerope.set_output_cache_limit(4 << 20)
        del q_out
        assert tilerope.output_cache_bytes() == 0  # over the limit: given back
        tilerope.set_output_cache_limit(limit)
        q_out, _ = tilerope.apply_rotary_pos_emb(q, k, cos, sin)
        del q_out
        assert tilerope.output_cache_bytes() == 8 << 20
        tilerope.empty_output_cache()
        assert tilerope.output_cache_bytes() == 0
    finally:
        tilerope.set_output_cache_limit(limit)
