#!/usr/bin/env bash
# Builds a libFuzzer target with clang + ASan/UBSan and runs it for a number of seconds.
#   scripts/fuzz.sh safetensors 60      (targets: safetensors, tfrecord, tokenizer, openai_request)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=${1:-safetensors}
seconds=${2:-60}
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPARAFLOW_FUZZ=ON >/dev/null
cmake --build "$ROOT/build-fuzz" --target "${target}_fuzz" -j"$(nproc)"
mkdir -p "$ROOT/build-fuzz/corpus-$target"
binary=$(find "$ROOT/build-fuzz/tests" -name "${target}_fuzz" -type f | head -n 1)
"$binary" -max_total_time="$seconds" "$ROOT/build-fuzz/corpus-$target"
