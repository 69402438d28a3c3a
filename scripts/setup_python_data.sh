#!/usr/bin/env bash
# Creates .venv-data (repo root): the Python oracles of the data layer's interop tests
# (tests/reference/tf_*.py and the tokenizer's oracles). Not part of the product.
#
#   - Python: the interpreter `python3` on PATH (pyenv's 3.11 here); TensorFlow 2.20 wheels exist
#     for 3.9–3.13. Debian's /usr/bin/python3 is not used: .venv-ref owns that one.
#   - Everything is pinned; one line per package in PINS below (other helpers append theirs).
#   - Idempotent: when the venv already holds exactly these pins it only checks the imports.
#
# Usage: bash scripts/setup_python_data.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-data"
PY="${PARAFLOW_DATA_PYTHON:-python3}"

# TFRecord / tf.train.Example / TensorBoard interop (tests/reference/tf_*.py, bench/tfrecord).
# tensorflow-cpu 2.20.0 is ~260 MB of wheels (plus ~100 MB of dependencies).
PINS=(
  tensorflow-cpu==2.20.0
  tensorboard==2.20.0
  # Tokenizer interop (tests/reference/tokenizer_oracle.py, bench/tokenizer): tiktoken, HF
  # tokenizers, and transformers for GPT2TokenizerFast (4.57.6 pins tokenizers 0.22.x).
  tiktoken==0.12.0
  tokenizers==0.22.2
  transformers==4.57.6
  # Chat templates (tests/reference/chat_template_oracle.py): transformers renders them with
  # jinja2, which it does not install itself.
  jinja2==3.1.6
  markupsafe==3.0.4
  # deploy/kubernetes's manifests checked against the Kubernetes API's own JSON schemas
  # (tests/deploy/deploy_files_test.py).
  kubernetes-validate==1.37.0
  # llama.cpp's gguf-py: its numpy reference quantizers (tests/reference/gguf_quants.py).
  gguf==0.19.0
)
# TF Serving's gRPC client (tests/serve/tf_serving_grpc_check.py). Installed with --no-deps: it
# asks for `tensorflow`, which pip would fetch beside tensorflow-cpu; what it needs (tensorflow,
# grpcio, protobuf) the pins above bring.
NO_DEPS_PINS=(
  tensorflow-serving-api==2.20.0
)

log() { echo "[setup_python_data] $*" >&2; }

source "$ROOT/scripts/pinned_venv.sh"
ensure_pinned_venv

# GPT-2's byte-level BPE ranks (the same 50,256 tokens as encoder.json/vocab.bpe, in tiktoken's
# base64 format) from the one PyPI package that ships them: openai-whisper's sdist. pip download
# --no-deps fetches the tarball only (no torch); the file is checked by its sha256.
GPT2_TIKTOKEN="$VENV/assets/gpt2.tiktoken"
GPT2_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
if [[ ! -f "$GPT2_TIKTOKEN" ]] || ! echo "$GPT2_SHA256  $GPT2_TIKTOKEN" | sha256sum -c --status; then
  log "fetching gpt2.tiktoken from openai-whisper==20250625 (sdist, no dependencies)"
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip download --no-input -q --no-deps \
    --no-binary :all: openai-whisper==20250625 -d "$TMP"
  tar -xzf "$TMP"/openai_whisper-20250625.tar.gz -C "$TMP" --wildcards '*/whisper/assets/gpt2.tiktoken'
  mkdir -p "$VENV/assets"
  cp "$TMP"/openai_whisper-20250625/whisper/assets/gpt2.tiktoken "$GPT2_TIKTOKEN.tmp"
  echo "$GPT2_SHA256  $GPT2_TIKTOKEN.tmp" | sha256sum -c --status || { log "gpt2.tiktoken: sha256 mismatch"; exit 1; }
  mv "$GPT2_TIKTOKEN.tmp" "$GPT2_TIKTOKEN"
fi

# Report the versions (and fail here, not in a test, if an import is broken).
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" - <<'PYEOF'
import tensorflow as tf, tensorboard
print(f"tensorflow {tf.__version__}")
print(f"tensorboard {tensorboard.__version__}")
import tiktoken, tokenizers, transformers, jinja2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc, model_service_pb2_grpc
import grpc
print(f"grpcio {grpc.__version__}, tensorflow-serving-api (predict_pb2, prediction_service_pb2_grpc)")
print(f"tiktoken {tiktoken.__version__}, tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, jinja2 {jinja2.__version__}")
PYEOF
