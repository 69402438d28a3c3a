#!/usr/bin/env bash
# Creates the Python reference environment (.venv-ref in the repo root) that the
# C++ tests use to run the PyTorch oracle tests/reference/gpt2_torch.py.
#
#   - torch and numpy come from Debian 12 (python3-torch 1.13.1, numpy 1.24):
#     PyPI's torch is never installed (it drags in gigabytes of CUDA wheels).
#   - .venv-ref is a venv of /usr/bin/python3 with --system-site-packages, so
#     it sees Debian's torch/numpy; pip only adds transformers & co. on top,
#     with a constraints file that pins torch and numpy to the Debian ones.
#   - transformers 4.49.0 is the newest release that works with torch 1.13:
#     4.50/4.51 fail importing GPT-2 (no torch.distributed.tensor), and 4.52+
#     refuse torch < 2 altogether ("requires the PyTorch library").
#
# Idempotent: when .venv-ref already holds exactly these pins it only prints
# the versions. Usage: bash scripts/setup_python.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-ref"
SYS_PY=/usr/bin/python3

# Everything pip installs, fully pinned (transformers 4.49.0's dependency
# closure, minus torch/numpy/pyyaml/requests which Debian provides).
PINS="transformers==4.49.0
safetensors==0.8.0
tokenizers==0.21.4
huggingface_hub==0.36.2
hf-xet==1.8.0
filelock==4.3.1
fsspec==2026.9.0
packaging==26.4
regex==2026.11.19
tqdm==4.70.1"

log() { echo "[setup_python] $*" >&2; }

# 1. Debian packages: torch, numpy, and venv (ensurepip).
if ! "$SYS_PY" -c "import torch, numpy, ensurepip" >/dev/null 2>&1; then
    log "installing python3-torch python3-venv python3-numpy with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends python3-torch python3-venv python3-numpy
fi

# 2. The venv, and the pip packages on top of it.
STAMP="$VENV/.setup-pins"
WANT="$(printf '%s\n' "$PINS"; "$SYS_PY" -c 'from importlib.metadata import version as v; print("torch", v("torch"), "numpy", v("numpy"))')"
# (step 3 below imports everything, so a broken venv still makes this script fail)
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log ".venv-ref is up to date"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV"
        rm -rf "$VENV"
        "$SYS_PY" -m venv --system-site-packages "$VENV"
    fi
    # Constraints: keep the Debian torch and numpy exactly as they are (if any
    # package asked for another torch/numpy, pip fails instead of fetching it).
    CONSTRAINTS="$VENV/constraints.txt"
    "$VENV/bin/python" - >"$CONSTRAINTS" <<'EOF'
from importlib.metadata import version
print("torch==" + version("torch"))
print("numpy==" + version("numpy"))
print("numpy<2")
EOF
    REQS="$VENV/requirements.txt"
    printf '%s\n' "$PINS" >"$REQS"
    log "pip installing into $VENV: $(tr '\n' ' ' <"$REQS")"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input -q \
        -c "$CONSTRAINTS" -r "$REQS"
    printf '%s\n' "$WANT" >"$STAMP"
fi

# 3. Report what the oracle will run with (also checks that it all imports).
"$VENV/bin/python" - <<'EOF'
import warnings
warnings.filterwarnings("ignore")
import torch, numpy, safetensors, safetensors.torch, transformers
from transformers import GPT2LMHeadModel  # noqa: F401 (fails if torch is unusable)
print(f"torch {torch.__version__}")
print(f"transformers {transformers.__version__}")
print(f"safetensors {safetensors.__version__}")
print(f"numpy {numpy.__version__}")
EOF
