"""Shared helpers of the CLI tests: run the binary, count checks, bf16 in numpy."""
import subprocess
import sys

import numpy as np


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        print(("PASS " if ok else "FAIL ") + what)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


def run(binary, *args):
    return subprocess.run([binary, *map(str, args)], capture_output=True, text=True)


def f32_to_bf16_bits(x):
    """fp32 -> bf16 bits, round to nearest even (inputs are finite)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f64(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
