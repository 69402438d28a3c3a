#!/usr/bin/env bash
# The test command: set-up from scratch (system packages, Python reference environments, build),
# then every test through CTest. Tests that compare with PyTorch / transformers / TensorFlow run
# their oracles from the virtual environments that scripts/setup.sh creates.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# /usr/bin/time: each MPI rank's peak RSS in tests/dist/sharded_checkpoint_test.
bash scripts/apt_install_missing.sh time
# Python environments for the reference and interop tests (not part of the product).
bash scripts/setup_python.sh
bash scripts/setup_python_data.sh
bash scripts/setup_python_serve.sh
cd build
ctest --output-on-failure --timeout 1200 "$@"
