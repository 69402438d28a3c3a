#!/usr/bin/env bash
# Data-parallel scaling on this machine: gpt-small with one thread per process, 1 process vs 2
# MPI processes (batch 8 per rank), with gradient all-reduce overlapped with backward and not.
# Prints tokens/s, scaling efficiency, and the share of all-reduce time hidden behind backward
# (1 - exposed wait with overlap / exposed wait without).
#   bench/dist/dp_scaling.sh [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
steps=${1:-6}
bench="$ROOT/build/bench/train/train_bench --steps $steps --warmup 2"
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
value() { grep "^$1 " <<<"$2" | cut -d' ' -f2; }

one=$(OMP_NUM_THREADS=1 $bench)
on=$(mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 $bench --overlap true)
off=$(mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 $bench --overlap false)
t1=$(value tokens_per_s "$one"); t_on=$(value tokens_per_s "$on"); t_off=$(value tokens_per_s "$off")
w_on=$(value communication_wait_ms "$on"); w_off=$(value communication_wait_ms "$off")
echo "1 process              $t1 tokens/s  step $(value step_ms "$one") ms"
echo "2 processes, overlap   $t_on tokens/s  step $(value step_ms "$on") ms  exposed all-reduce wait $w_on ms/step"
echo "2 processes, no overlap $t_off tokens/s  step $(value step_ms "$off") ms  exposed all-reduce wait $w_off ms/step"
python3 -c "
t1, ton, toff, won, woff = $t1, $t_on, $t_off, $w_on, $w_off
print(f'scaling efficiency (overlap)    {ton / (2 * t1):.3f}')
print(f'scaling efficiency (no overlap) {toff / (2 * t1):.3f}')
print(f'all-reduce time hidden behind backward: {100 * (1 - won / woff):.1f}%' if woff > 0 else 'no all-reduce wait measured')
"
