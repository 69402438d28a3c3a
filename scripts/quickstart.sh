#!/usr/bin/env bash
# The main job on a fresh machine: install and build, train a small model on the fortunes corpus
# (Debian's `fortunes` package, text files under /usr/share/games/fortunes) for a few minutes,
# then generate text from it with the KV-cache generator.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
rm -rf runs/quickstart
./build/src/cli/paraflow train --config configs/quickstart.yaml "$@"
./build/src/cli/paraflow generate --model runs/quickstart/export --prompt "The meaning of life is" \
  --max-tokens 200 --temperature 0.8 --top-k 40 --seed 7
