#!/usr/bin/env bash
# Bench only: llama.cpp for bench/infer/compare_decode.py and bench/serve/compare_servers.py, from the
# llama.cpp vendored in the pinned llama-cpp-python source package on PyPI, all under the git-ignored
# bench/.cache/:
#   - llama-bench, llama-server, llama-perplexity and llama-quantize, built with CMake (Release, CPU only, -DGGML_NATIVE=ON, static
#     libraries; the server without its web UI: no npm build, no download of prebuilt assets);
#   - venv-gguf, a venv for its convert_hf_to_gguf.py (PyPI's torch, ~4.5 GB with its CUDA
#     packages: the CPU-only index is not reachable; pins as in its requirements files).
# Nothing of llama.cpp enters src/. Idempotent: what is done already is skipped.
#   bench/infer/build_llama_cpp.sh         # prints the llama.cpp source dir on stdout
#   bench/infer/build_llama_cpp.sh --dir   # only prints it
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION=0.3.36
CACHE="$ROOT/bench/.cache"
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$SRC/build"
VENV="$CACHE/venv-gguf"
if [[ "${1:-}" == --dir ]]; then
  echo "$SRC"
  exit 0
fi

if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  mkdir -p "$CACHE"
  archive="$CACHE/llama_cpp_python-$VERSION.tar.gz"
  [[ -f "$archive" ]] || pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE" >&2
  tar -xzf "$archive" -C "$CACHE"
fi
if [[ ! -x "$BUILD/bin/llama-bench" || ! -x "$BUILD/bin/llama-server" || ! -x "$BUILD/bin/llama-perplexity" ||
      ! -x "$BUILD/bin/llama-quantize" ]]; then
  # This llama.cpp has no CURL option any more (LLAMA_CURL is deprecated); OpenSSL is off instead.
  # Reconfiguring an older build dir (made with the server off) turns the server on.
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >&2
  cmake --build "$BUILD" --target llama-bench llama-server llama-perplexity llama-quantize -j2 >&2
fi
if [[ ! -f "$VENV/.complete" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.11.0 "numpy~=2.2.6" transformers==4.57.6 "sentencepiece>=0.1.98,<0.3.0" \
    "protobuf>=4.21.0,<5.0.0" "$SRC/gguf-py" >&2
  touch "$VENV/.complete"
fi
echo "$SRC"
