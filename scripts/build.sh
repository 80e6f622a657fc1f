#!/usr/bin/env bash
# Configures and builds tilerope (Release) into ./build. Used by run-main.sh and run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
