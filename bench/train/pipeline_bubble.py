#!/usr/bin/env python3
"""Pipeline bubble and activation memory, measured against the model.

Runs build/bench/train/model_parallel_bench under mpirun (one rank per stage, one thread
each) for p stages, m micro-batches and both schedules, and prints per run: the stages' mean
idle share of the pipeline phase next to (p-1)/(m+p-1), and each schedule's resident-memory
growth per stage (activations of the micro-batches in flight) next to `paraflow plan`'s
prediction. With more stages than cores the ranks share cores, so stages run at uneven speed:
the bubble then measures the machine as much as the schedule (the table says so).

  python3 bench/train/pipeline_bubble.py [--stages 2 4] [--micro-batches 1 2 4 8 16]
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def run(binary, stages, micro_batches, schedule, layers):
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(stages), "-x", "OMP_NUM_THREADS=1",
               binary, "--micro-batches", str(micro_batches), "--schedule", schedule, "--n-layer", str(layers)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{out.stderr}")
    rows = []
    for line in out.stdout.splitlines():
        if line.startswith("stage "):
            fields = line.split()
            rows.append({fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)})
    return rows


def per_stage(rows, key, form):
    return "/".join(form.format(float(r[key]) if "{:" in form else r[key]) for r in rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/bench/train/model_parallel_bench"))
    args = parser.parse_args()
    cores = os.cpu_count()
    print(f"CPU: {cpu_model()}, {cores} cores; one thread per rank; model: {args.layers} blocks of 256, T 128, "
          f"vocab 512, 16 sequences per step, blocks split evenly")
    print(f"{'p':>2} {'m':>3} {'schedule':>8} {'bubble model':>12} {'measured':>9} {'ratio':>6} "
          f"{'in flight/stage':>16} {'RSS growth MiB/stage':>22} {'predicted':>18} {'tokens/s':>8}")
    for stages in args.stages:
        for m in args.micro_batches:
            for schedule in ("gpipe", "1f1b"):
                rows = run(args.binary, stages, m, schedule, args.layers)
                model = float(rows[0]["bubble_model"])
                measured = sum(float(r["bubble_measured"]) for r in rows) / len(rows)
                note = " (oversubscribed)" if stages > cores else ""
                print(f"{stages:>2} {m:>3} {schedule:>8} {model:>12.3f} {measured:>9.3f} "
                      f"{measured / model if model else float('nan'):>6.2f} "
                      f"{per_stage(rows, 'in_flight', '{}'):>16} "
                      f"{per_stage(rows, 'rss_growth_mib', '{:.0f}'):>22} "
                      f"{per_stage(rows, 'predicted_step_mib', '{:.0f}'):>18} {rows[0]['tokens_per_s']:>8}{note}",
                      flush=True)


if __name__ == "__main__":
    main()
