#!/usr/bin/env bash
# Installs every system package tilerope needs to build, test and benchmark, on Debian 12.
# Run as root (or with sudo available). Safe to run again: apt-get skips what is present.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libhwy-dev          # SIMD with runtime dispatch
  nlohmann-json3-dev  # case files
  libcli11-dev        # command line
  libgtest-dev libgmock-dev libbenchmark-dev
  libomp-dev          # OpenMP for clang builds; g++ brings libgomp
  clang-format
  python3 python3-numpy  # the independent fp64 checks of `tilerope apply` and `tilerope freqs`
  python3-matplotlib     # scripts/plot-bench.py (docs/bench/*.png)
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
