#!/usr/bin/env bash
# The main job on a fresh machine: install and build; turn the fortunes corpus (Debian's
# `fortunes` package) into text documents; train a byte-level BPE tokenizer on it; tokenize it
# into TFRecord shards; train a small GPT-2 for a few minutes with 2 data-parallel MPI processes
# (TensorBoard logs in runs/quickstart); then generate text with the KV-cache generator.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --target paraflow
paraflow=./build/src/cli/paraflow
rm -rf corpus runs/quickstart runs/quickstart-tokenizer runs/quickstart-data
mkdir -p corpus runs

# Fortunes are separated by lines holding a single '%': 100 fortunes per document.
awk '/^%$/ { if (++count % 100 == 0) file++; next } { print > sprintf("corpus/fortunes-%04d.txt", file) }' \
  /usr/share/games/fortunes/*.u8
$paraflow tokenizer train --vocab-size 4096 --input 'corpus/*.txt' --out runs/quickstart-tokenizer
$paraflow data prepare --tokenizer runs/quickstart-tokenizer --input 'corpus/*.txt' --out runs/quickstart-data \
  --val-fraction 0.05 2>&1 | tail -n 1

# OpenMPI refuses to run as root unless told; one thread per process on this 2-core machine.
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
  $paraflow train --config configs/quickstart.yaml "$@"
$paraflow generate --model runs/quickstart/export --prompt "The meaning of life is" \
  --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7
