#!/usr/bin/env bash
# Installs every system package tilerope needs to build, test and benchmark, on Debian 12, and
# the Python environment .venv (python/requirements.txt from PyPI: the package's build, torch,
# transformers, pytest). Run as root (or with sudo available). Safe to run again: apt-get and
# pip skip what is present.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libhwy-dev          # SIMD with runtime dispatch
  nlohmann-json3-dev  # case files
  libcli11-dev        # command line
  libgtest-dev libgmock-dev libbenchmark-dev
  libomp-dev          # OpenMP for clang builds; g++ brings libgomp
  clang libclang-rt-14-dev libomp-14-dev  # scripts/sanitize.sh: sanitizers, libFuzzer, Archer
  clang-format
  python3 python3-numpy  # the independent fp64 checks of `tilerope apply` and `tilerope freqs`
  python3-venv python3-dev  # .venv, and the headers the Python extension builds against
  python3-matplotlib     # scripts/plot-bench.py (docs/bench/CLASS/*.png)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Python package's environment, made with Debian's python3 so that the extension is built
# for the interpreter that runs it.
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements.txt
