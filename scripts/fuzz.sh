#!/usr/bin/env bash
# Builds a libFuzzer target with clang + ASan/UBSan and runs it for a number of seconds.
#   scripts/fuzz.sh safetensors 60
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=${1:-safetensors}
seconds=${2:-60}
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPARAFLOW_FUZZ=ON -DPARAFLOW_SKIP_DATA=ON >/dev/null
cmake --build "$ROOT/build-fuzz" --target "${target}_fuzz" -j"$(nproc)"
mkdir -p "$ROOT/build-fuzz/corpus-$target"
"$ROOT/build-fuzz/tests/${target}_fuzz" -max_total_time="$seconds" "$ROOT/build-fuzz/corpus-$target"
