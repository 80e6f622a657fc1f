#!/usr/bin/env bash
# Every test: set up, build, run ctest (unit, exhaustive dtype, kernels on every SIMD target,
# concurrency, past 2^31 elements, CLI, example, install, format), install the Python package
# into .venv and run pytest (tests/python), then the checking builds of scripts/sanitize.sh
# (ASan + UBSan, fuzzing, TSan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps .
HF_HUB_OFFLINE=1 .venv/bin/python -m pytest tests/python -q
scripts/sanitize.sh
