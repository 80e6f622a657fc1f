#!/usr/bin/env bash
# The main job: set up, build, check the built-in cases three ways (fp64 golden, production
# kernels; tile-layer reference kernels where they exist), then a short benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
build/tools/tilerope/tilerope info
build/tools/tilerope/tilerope check
if build/tools/tilerope/tilerope bench --help >/dev/null 2>&1; then
  build/tools/tilerope/tilerope bench --quick
fi
