#!/usr/bin/env bash
# The main job on a fresh machine: install and build; turn the fortunes corpus (Debian's
# `fortunes` package) into text files; train a byte-level BPE tokenizer on it; tokenize it
# into TFRecord shards; train a small GPT-2 for a few minutes with 2 data-parallel MPI processes
# (TensorBoard logs in runs/quickstart); generate text; then serve the model (OpenAI-compatible
# HTTP on 127.0.0.1), stream one completion with curl and stop the server cleanly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --target paraflow
paraflow=./build/src/cli/paraflow
rm -rf corpus runs/quickstart runs/quickstart-tokenizer runs/quickstart-data
mkdir -p corpus runs

# Fortunes are separated by lines holding a single '%', each one a document: 100 fortunes per file.
awk '{ print > sprintf("corpus/fortunes-%04d.txt", file) } /^%$/ && ++count % 100 == 0 { file++ }' \
  /usr/share/games/fortunes/*.u8
$paraflow tokenizer train --vocab-size 4096 --input 'corpus/*.txt' --document-separator '\n%\n' \
  --out runs/quickstart-tokenizer
$paraflow data prepare --tokenizer runs/quickstart-tokenizer --input 'corpus/*.txt' --document-separator '\n%\n' \
  --out runs/quickstart-data --val-fraction 0.05 2>&1 | tail -n 1

# OpenMPI refuses to run as root unless told; one thread per process on this 2-core machine.
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 \
  $paraflow train --config configs/quickstart.yaml "$@"
$paraflow generate --model runs/quickstart/export --prompt "The meaning of life is" \
  --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7

# Serve it, stream a completion through the OpenAI API with curl, then SIGTERM: the server drains
# and exits 0.
# --port 0: a free port, read back from the "ready on" line.
$paraflow serve --model runs/quickstart/export --port 0 > runs/quickstart/serve.log 2>&1 &
server=$!
for _ in $(seq 1 300); do
  grep -q "ready on" runs/quickstart/serve.log && break
  kill -0 $server 2>/dev/null || { cat runs/quickstart/serve.log; exit 1; }
  sleep 0.1
done
grep -q "ready on" runs/quickstart/serve.log || { echo "the server did not become ready" >&2; cat runs/quickstart/serve.log; exit 1; }
address=$(sed -n 's/.*ready on \(http:[^ ]*\).*/\1/p' runs/quickstart/serve.log)
curl -sN "$address"/v1/completions -H 'Content-Type: application/json' \
  -d '{"prompt": "The meaning of life is", "max_tokens": 40, "temperature": 0.8, "seed": 7, "stream": true}'
kill -TERM $server
wait $server
echo "[quickstart] the server drained and exited cleanly"
