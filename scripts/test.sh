#!/usr/bin/env bash
# The test command: set-up from scratch (system packages, Python reference environments, build),
# then every test through CTest. Tests that compare with PyTorch / transformers / TensorFlow run
# their oracles from the virtual environments that scripts/setup.sh creates.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
cd build
ctest --output-on-failure --timeout 1200 "$@"
