#!/usr/bin/env bash
# Builds and runs bench/infer/check_quantizers.cc: our Q4_K and Q5_0 quantizers against llama.cpp's
# quantize_row_q4_K_ref and quantize_row_q5_0_ref, byte for byte. Needs build/ (paraflow_tensor)
# and llama.cpp built by bench/infer/build_llama_cpp.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
LLAMA="$("$ROOT/bench/infer/build_llama_cpp.sh" --dir)"
OUT="$ROOT/build/bench/infer/check_quantizers"
cmake --build "$ROOT/build" --target paraflow_tensor -j2 >/dev/null
mkdir -p "$(dirname "$OUT")"
g++ -O2 -march=native -std=c++20 -I"$ROOT/src" "$ROOT/bench/infer/check_quantizers.cc" \
  "$ROOT/build/src/tensor/libparaflow_tensor.a" "$ROOT/build/src/base/libparaflow_base.a" \
  "$LLAMA/build/ggml/src/libggml-base.a" -lfmt -fopenmp -lpthread -lm -o "$OUT"
"$OUT"
