#!/usr/bin/env bash
# Every test: set up, build, run ctest (unit, exhaustive dtype, kernels on every SIMD target,
# CLI, example, install, format), then install the Python package into .venv and run pytest
# (tests/python).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps .
HF_HUB_OFFLINE=1 .venv/bin/python -m pytest tests/python -q
