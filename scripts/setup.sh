#!/usr/bin/env bash
# What a fresh Debian 12 machine needs to build and run paraflow, then the Release build in build/.
#   scripts/setup.sh                    # system packages, build everything (tests included)
#   scripts/setup.sh --target paraflow  # only the binary (the quickstart); arguments go to cmake --build
# The Python reference environments are the test command's (scripts/test.sh), not this script's.
# Idempotent: packages already present are not fetched again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# C++ toolchain and libraries (Debian's -dev packages), plus the `fortunes` corpus for the quickstart.
PACKAGES=(
  build-essential cmake g++ pkg-config
  libgtest-dev libbenchmark-dev
  libopenblas-openmp-dev libdnnl-dev
  nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev libspdlog-dev
  libprotobuf-dev protobuf-compiler zlib1g-dev libzstd-dev
  libopenmpi-dev openmpi-bin libgloo-dev libgrpc++-dev protobuf-compiler-grpc
  libboost1.81-dev libssl-dev
  fortunes
)
bash scripts/apt_install_missing.sh "${PACKAGES[@]}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" "$@"
echo "[setup] built build/src/cli/paraflow" >&2
