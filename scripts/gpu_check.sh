#!/usr/bin/env bash
# The CUDA backend's check on a lent GPU machine (issue #47, docs/cuda.md), in one call.
#
#   bash scripts/gpu_check.sh --prepare   here: build the binaries and pack them, with the shared
#                                         libraries the device image lacks, into .gpu-check/
#   bash scripts/gpu_check.sh             there, with .gpu-check carried: the CUDA op tests, the
#                                         GPT-2 equality test against PyTorch, training tokens/s and
#                                         MFU against PyTorch's torch.compile with bf16 autocast;
#                                         a short table last
#   bash scripts/gpu_check.sh --dry-run   here: every step that can run without a GPU (the
#                                         unpacking, the binaries' start, the op tests' "not run"),
#                                         the GPU-only ones reported as not run
#
# The device machine has CUDA, PyTorch, CMake and ninja but none of paraflow's Debian
# dependencies and no network, so nothing is built there: the binaries made by --prepare run there
# against the carried libraries (xz-compressed: oneDNN and OpenBLAS alone are over 64 MiB raw) and
# the machine's own CUDA libraries. Its log goes to $OUT/gpu_check.log when OUT is set.
# Device call: run(command="bash scripts/gpu_check.sh", carry=[".gpu-check"], timeout_s=540).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PACK=.gpu-check
MODE=${1:-device}
# Its own build, without -march=native (the device's CPU may not match this one's); GPU_BUILD=build
# packs an existing build as it is configured (a dry run here, say).
GPU_BUILD=${GPU_BUILD:-build-gpu}
BINARIES=($GPU_BUILD/tests/backend_ops_test $GPU_BUILD/tests/backend_test $GPU_BUILD/tests/train_test
          $GPU_BUILD/bench/train/train_bench)

if [[ $MODE == --prepare ]]; then
  set -e
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  [[ -f $GPU_BUILD/CMakeCache.txt ]] || cmake -S . -B "$GPU_BUILD" -DCMAKE_BUILD_TYPE=Release -DPARAFLOW_NATIVE=OFF >/dev/null
  grep -q "CMAKE_CUDA_COMPILER:" "$GPU_BUILD/CMakeCache.txt" || { echo "gpu_check --prepare: no nvcc, no CUDA backend" >&2; exit 1; }
  cmake --build "$GPU_BUILD" -j"$(nproc)" --target backend_ops_test backend_test train_test train_bench
  rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/lib"
  cp "${BINARIES[@]}" "$PACK/bin/"
  # Every shared library the binaries load, but the C and C++ runtimes (the device image's are
  # newer, and PyTorch there needs them) and CUDA's (it has its own driver and CUDA 13 libraries).
  ldd "${BINARIES[@]}" | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcublas[^/]*|libcudart[^/]*|libnccl)\.so' |
    xargs -I{} cp -L {} "$PACK/lib/"
  tar -C "$PACK" -cJf "$PACK/lib.tar.xz" lib && rm -rf "$PACK/lib"
  du -sh "$PACK"
  echo "gpu_check --prepare: carry $PACK (from $GPU_BUILD)"
  exit 0
fi

DRY=0
[[ $MODE == --dry-run ]] && DRY=1
[[ $MODE == device || $MODE == --dry-run ]] || { echo "usage: gpu_check.sh [--prepare|--dry-run]" >&2; exit 2; }
LOG=${OUT:-/tmp}/gpu_check.log
exec > >(tee "$LOG") 2>&1
declare -a TABLE
row() { TABLE+=("$(printf '%-34s %-10s %s' "$1" "$2" "$3")"); }

echo "gpu_check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') mode $MODE"
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "gpu: ${GPU:-none}"
if [[ -z $GPU && $DRY == 0 ]]; then echo "gpu_check: no GPU here (nvidia-smi found none): use --dry-run" >&2; exit 1; fi

[[ -f $PACK/lib.tar.xz ]] || { echo "gpu_check: no $PACK/lib.tar.xz: run 'bash scripts/gpu_check.sh --prepare' here and carry $PACK" >&2; exit 1; }
LIBS=$(mktemp -d)
# Python's tarfile, not tar: the device image may lack xz.
python3 -c 'import sys, tarfile; safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **safe)' "$PACK/lib.tar.xz" "$LIBS"
# CUDA's libraries: the toolkit's, or the ones PyTorch's wheels bring.
CUDA_LIBS=/usr/local/cuda/lib64
for module in nvidia.cublas nvidia.cuda_runtime nvidia.cu13; do
  dir=$(python3 -c "import $module, os; print(os.path.join(list($module.__path__)[0], 'lib'))" 2>/dev/null) && CUDA_LIBS+=:$dir
done
# Only our binaries see the carried libraries: PyTorch, there, keeps its own.
ours() { LD_LIBRARY_PATH=$LIBS/lib:$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
CLEAN_PYTHON=$LIBS/python3  # the GPT-2 oracle, started by train_test, without them
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec python3 "$@"\n' >"$CLEAN_PYTHON" && chmod +x "$CLEAN_PYTHON"
BIN=$PACK/bin
if ! ours "$BIN/backend_test" --gtest_list_tests >/dev/null; then
  row "binaries start" FAILED "see the loader's message above (build there instead: docs/cuda.md)"
  printf '%s\n' "${TABLE[@]}"
  exit 1
fi
row "binaries start" ok "$(ours ldd "$BIN/backend_ops_test" | grep -c '=>') shared libraries resolved"

# 1. Every CUDA kernel against the CPU backend (77: nothing to check, no GPU).
ours "$BIN/backend_ops_test"
case $? in
  0) row "CUDA op tests (backend_ops_test)" passed "$(grep -c '^  ok' "$LOG") cases" ;;
  77) row "CUDA op tests (backend_ops_test)" "NOT RUN" "no GPU backend present" ;;
  *) row "CUDA op tests (backend_ops_test)" FAILED "$(grep -c '^  FAILED' "$LOG") failed, see log" ;;
esac

# 2. The fallback or the GPU choice, and the GPT-2 equality test against PyTorch in float64 (the
# CUDA backend runs its GPT-2 cases where a GPU is present).
ours "$BIN/backend_test" --gtest_filter='DefaultBackendTest.*' >/dev/null && row "default backend" ok "" ||
  row "default backend" FAILED "see log"
if [[ $DRY == 1 ]]; then
  row "GPT-2 vs PyTorch (train_test)" "NOT RUN" "dry run: the CPU's own run is tests/train in CI"
else
  PARAFLOW_REFERENCE_PYTHON=$CLEAN_PYTHON PARAFLOW_SOURCE_DIR=$ROOT ours "$BIN/train_test" --gtest_filter='Configs/TorchReference.*' |
    tee /tmp/gpt2_equality.txt | grep -E '^\[|backend'
  if grep -q "backend cuda" /tmp/gpt2_equality.txt && grep -q '^\[  PASSED' /tmp/gpt2_equality.txt &&
    ! grep -q '^\[  FAILED' /tmp/gpt2_equality.txt; then
    row "GPT-2 vs PyTorch (train_test)" passed "on cuda, f32, against float64"
  else
    row "GPT-2 vs PyTorch (train_test)" FAILED "see log"
  fi
fi

# 3. Training throughput: GPT-2 124M's shape, sequence 1024, bf16 (mixed_bfloat16), ours against
# PyTorch with torch.compile and bf16 autocast, and MFU against the card's measured bf16 GEMM peak.
SHAPE=(--n-layer 12 --n-embd 768 --n-head 12 --n-ctx 1024 --vocab 50257 --batch 8 --precision mixed_bfloat16)
if [[ $DRY == 1 ]] || ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  row "training tokens/s, MFU" "NOT RUN" "needs a GPU and PyTorch with CUDA"
else
  PEAK=$(python3 - <<'EOF'
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    a @ b
end.record()
torch.cuda.synchronize()
print(2 * 8192**3 * 20 / (start.elapsed_time(end) / 1000))
EOF
)
  OURS=$(ours timeout 200 "$BIN/train_bench" "${SHAPE[@]}" --steps 10 --warmup 2 | tee /dev/stderr | awk '/^tokens_per_s/{print $2}')
  TORCH=$(timeout 200 python3 bench/train/peer_torch.py --threads 16 --device cuda --compile "${SHAPE[@]}" --steps 10 --warmup 3 |
    tee /dev/stderr | awk '/^tokens_per_s/{print $2}')
  # Model FLOPs per token: 6 per parameter (forward and backward) plus attention's 6·L·T·C (the causal half of 12·L·T·C).
  read -r RATIO MFU_OURS MFU_TORCH < <(python3 - "$PEAK" "${OURS:-0}" "${TORCH:-0}" <<'EOF'
import sys
peak, ours, torch_rate = (float(x) for x in sys.argv[1:])
L, C, T, V = 12, 768, 1024, 50257
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
flops = 6 * params + 6 * L * T * C
print(f"{ours / torch_rate if torch_rate else 0:.2f} {100 * flops * ours / peak:.1f} {100 * flops * torch_rate / peak:.1f}")
EOF
)
  printf 'bf16 GEMM peak measured: %.0f TFLOP/s\n' "$(python3 -c "print($PEAK / 1e12)")"
  row "training tokens/s (124M, T=1024)" "${OURS:-FAILED}" "PyTorch compiled ${TORCH:-FAILED}; ratio ${RATIO}x (target 1.3x)"
  row "training MFU" "${MFU_OURS}%" "PyTorch compiled ${MFU_TORCH}% (target 45%)"
fi

# 4. Decoding and serving on the GPU do not exist yet (docs/cuda.md).
row "decode batch 1 / 64, 256 clients" "NOT RUN" "serving is not on CUDA yet"

echo
echo "== gpu_check ($MODE) on ${GPU:-no GPU} =="
printf '%s\n' "${TABLE[@]}"
