#!/usr/bin/env bash
# Bench only: builds llama.cpp's llama-bench (CPU, Release, -DGGML_NATIVE=ON, static) from the
# llama.cpp vendored in the pinned llama-cpp-python source package on PyPI, under bench/.cache/.
# Nothing of llama.cpp enters src/. Idempotent: skips the download and the build when done.
#   bench/infer/build_llama_cpp.sh     # prints the llama.cpp source dir on stdout
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION=0.3.36
CACHE="$ROOT/bench/.cache"
SRC="$CACHE/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$SRC/build"

if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  mkdir -p "$CACHE"
  archive="$CACHE/llama_cpp_python-$VERSION.tar.gz"
  [[ -f "$archive" ]] || pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$CACHE" >&2
  tar -xzf "$archive" -C "$CACHE"
fi
if [[ ! -x "$BUILD/bin/llama-bench" ]]; then
  # This llama.cpp has no CURL option any more (LLAMA_CURL is deprecated); OpenSSL is off instead.
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$BUILD" --target llama-bench -j2 >&2
fi
echo "$SRC"
