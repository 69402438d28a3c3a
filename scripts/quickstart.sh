#!/usr/bin/env bash
# The main job on a fresh machine: install and build, train a small model on the fortunes corpus
# (Debian's `fortunes` package, text files under /usr/share/games/fortunes) for a few minutes
# with 2 data-parallel processes over MPI, then generate text from it with the KV-cache generator.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
rm -rf runs/quickstart
# OpenMPI refuses to run as root unless told; one thread per process on this 2-core machine.
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
  ./build/src/cli/paraflow train --config configs/quickstart.yaml "$@"
./build/src/cli/paraflow generate --model runs/quickstart/export --prompt "The meaning of life is" \
  --max-tokens 200 --temperature 0.8 --top-k 40 --seed 7
