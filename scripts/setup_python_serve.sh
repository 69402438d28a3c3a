#!/usr/bin/env bash
# Creates .venv-serve (repo root): the clients of the server's interop tests (tests/serve/*.py):
# the official `openai` Python client and `prometheus_client`'s text-format parser. Not part of
# the product.
#
#   - Python: the interpreter `python3` on PATH (pyenv's 3.11 here).
#   - Everything is pinned: the two clients and their dependency closure.
#   - Idempotent: when the venv already holds exactly these pins it only checks the imports.
#
# Usage: bash scripts/setup_python_serve.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-serve"
PY="${PARAFLOW_SERVE_PYTHON:-python3}"

PINS=(
  openai==3.57.0
  prometheus_client==0.26.0
  # openai's dependency closure, as pip resolved it
  annotated-types==0.8.0
  anyio==4.16.0
  h11==0.16.0
  httpcore2==2.16.2
  httpx2==2.16.2
  idna==3.20
  jiter==0.19.0
  pydantic==2.14.4
  pydantic_core==2.50.5
  sniffio==1.3.1
  truststore==0.10.5
  typing-inspection==0.4.5
  typing_extensions==4.16.0
)

log() { echo "[setup_python_serve] $*" >&2; }

STAMP="$VENV/.setup-pins"
WANT="$(printf '%s\n' "${PINS[@]}")"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  log ".venv-serve is up to date"
else
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
  fi
  log "pip installing into $VENV: ${PINS[*]}"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input -q "${PINS[@]}"
  printf '%s\n' "$WANT" >"$STAMP"
fi

"$VENV/bin/python" -c 'import openai, prometheus_client.parser; print("openai", openai.__version__)'
