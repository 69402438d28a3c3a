#!/usr/bin/env bash
# Builds a libFuzzer target with clang + ASan/UBSan and runs it for a number of seconds.
#   scripts/fuzz.sh safetensors 60      (targets: safetensors, tfrecord, tokenizer, openai_request,
#                                        http_request, tf_serving_predict, jinja)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=${1:-safetensors}
seconds=${2:-60}
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPARAFLOW_FUZZ=ON >/dev/null
cmake --build "$ROOT/build-fuzz" --target "${target}_fuzz" -j"$(nproc)"
mkdir -p "$ROOT/build-fuzz/corpus-$target"
binary=$(find "$ROOT/build-fuzz/tests" -name "${target}_fuzz" -type f | head -n 1)
# New inputs go to the corpus; the target's seeds (tests/fuzz/seeds/<target>, where there are some) are read too.
seeds=("$ROOT/tests/fuzz/seeds/$target")
[[ $target == jinja ]] && seeds=("$ROOT/tests/infer/chat_templates")
[[ -d "${seeds[0]}" ]] || seeds=()
"$binary" -max_total_time="$seconds" "$ROOT/build-fuzz/corpus-$target" "${seeds[@]}"
