#!/usr/bin/env bash
# The cost of dist.exact_reduction (fixed-point gradient sums, results independent of ranks x
# accumulation) on a training step: gpt-small, 2 MPI processes of one thread each, float sums vs
# exact sums in one run. Prints tokens/s of both and the ratio.
#   bench/dist/exact_reduction.sh [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
steps=${1:-6}
bench="$ROOT/build/bench/train/train_bench --steps $steps --warmup 2"
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
value() { grep "^$1 " <<<"$2" | cut -d' ' -f2; }
grep -m1 'model name' /proc/cpuinfo
floats=$(mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 $bench --exact-reduction false)
exact=$(mpirun $as_root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 $bench --exact-reduction true)
t_float=$(value tokens_per_s "$floats"); t_exact=$(value tokens_per_s "$exact")
echo "float sums  $t_float tokens/s  step $(value step_ms "$floats") ms  exposed all-reduce wait $(value communication_wait_ms "$floats") ms/step"
echo "exact sums  $t_exact tokens/s  step $(value step_ms "$exact") ms  exposed all-reduce wait $(value communication_wait_ms "$exact") ms/step"
python3 -c "print(f'exact / float throughput: {$t_exact / $t_float:.3f}')"
