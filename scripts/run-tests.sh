#!/usr/bin/env bash
# Every test: set up, build, run ctest (unit, exhaustive dtype, kernels on every SIMD target,
# CLI, example, install, format).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
