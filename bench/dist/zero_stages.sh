#!/usr/bin/env bash
# The price of ZeRO-3's per-layer gathers, and what each ZeRO stage holds per rank: the same data-
# parallel layout (ranks MPI processes of one thread, 2 micro-batches of 2 sequences each per
# step) with dist.zero 0, 1, 2 and 3, the four interleaved `repeats` times in one run (the best
# tokens/s of each counts: on a shared machine the slow runs are the ones other work slowed).
# Prints each stage's tokens/s, rank 0's peak RSS and the largest rank's (start-up included), the
# largest resident set after the steps (what a rank holds between steps), and ZeRO-3's
# throughput over ZeRO-1's.
#   bench/dist/zero_stages.sh [ranks] [steps] [repeats] [train_bench options, e.g. --n-layer 12]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ranks=${1:-2}
steps=${2:-4}
repeats=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
bench="$ROOT/build/bench/train/train_bench --steps $steps --warmup 2 --grad-accumulation 2 --batch 2 $*"
as_root=$([[ "$(id -u)" == 0 ]] && echo --allow-run-as-root || true)
value() { grep "^$1 " <<<"$2" | cut -d' ' -f2; }
grep -m1 'model name' /proc/cpuinfo
declare -A best memory
for repeat in $(seq "$repeats"); do
  for zero in 0 1 2 3; do
    out=$(mpirun $as_root --oversubscribe -np "$ranks" -x OMP_NUM_THREADS=1 $bench --zero $zero)
    [[ $repeat == 1 && $zero == 0 ]] && echo "isa $(value onednn_isa "$out"); parameters $(value parameters "$out"); $ranks ranks"
    tokens=$(value tokens_per_s "$out")
    echo "  run $repeat dist.zero $zero: $tokens tokens/s"
    best[$zero]=$(python3 -c "print(max($tokens, ${best[$zero]:-0}))")
    memory[$zero]="peak RSS rank 0 $(value peak_rss_mb "$out") MiB, largest $(value peak_rss_mb_largest "$out") MiB (rank $(value peak_rss_largest_rank "$out")); after the steps, largest $(value rss_after_steps_mb_largest "$out") MiB"
  done
done
for zero in 0 1 2 3; do echo "dist.zero $zero  best ${best[$zero]} tokens/s  ${memory[$zero]}"; done
python3 -c "print(f'ZeRO-3 / ZeRO-1 throughput (best of $repeats each): {${best[3]} / ${best[1]}:.3f}')"
