#!/usr/bin/env bash
# Creates .venv-serve (repo root): the clients of the server's interop tests (tests/serve/*.py):
# the official `openai` Python client, `prometheus_client`'s text-format parser and `selenium`,
# which drives Debian's headless Chromium (installed here with its chromedriver, from apt, when
# missing) through the web page. Not part of the product.
#
#   - Python: the interpreter `python3` on PATH (pyenv's 3.11 here).
#   - Everything is pinned: the three clients and their dependency closure.
#   - Idempotent: when the venv already holds exactly these pins it only checks the imports.
#
# Usage: bash scripts/setup_python_serve.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-serve"
PY="${PARAFLOW_SERVE_PYTHON:-python3}"

# The browser of the web page's test (tests/serve/web_page_check.py): Debian 12's chromium
# and its chromedriver of the same version, which selenium uses instead of downloading one.
bash "$ROOT/scripts/apt_install_missing.sh" chromium chromium-driver

PINS=(
  openai==3.57.0
  prometheus_client==0.26.0
  selenium==4.51.0
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
  # selenium's, beyond those above
  attrs==26.1.0
  certifi==2026.10.19.post1
  outcome==1.3.0.post0
  PySocks==1.7.1
  sortedcontainers==2.4.0
  trio==0.35.0
  trio-websocket==0.12.2
  urllib3==2.8.0
  websocket-client==1.9.2
  wsproto==1.3.2
)

log() { echo "[setup_python_serve] $*" >&2; }

source "$ROOT/scripts/pinned_venv.sh"
ensure_pinned_venv

"$VENV/bin/python" -c 'import openai, prometheus_client.parser, selenium; print("openai", openai.__version__, "selenium", selenium.__version__)'
