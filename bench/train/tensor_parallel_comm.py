#!/usr/bin/env python3
"""Tensor parallelism's communication and each layout's throughput, next to data parallelism.

Runs build/bench/train/model_parallel_bench under mpirun (one thread per rank) for tensor,
pipeline and mixed layouts of one model and global batch, and build/bench/train/train_bench for
pure data parallelism on the same ranks. Prints per layout: the bytes each shard hands to the
tensor-parallel all-reduces per step, measured (counted by the communicator) and modelled
(src/train/step_time_model.h), the time those all-reduces took, and tokens/s. On a machine with
fewer cores than ranks the layouts share cores: the point is that they train (and equal one
process: tests/dist/), and what they move, not their speed here.

  python3 bench/train/tensor_parallel_comm.py
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build/bench/train")
MODEL = ["--n-layer", "8", "--n-embd", "256", "--n-head", "4", "--n-ctx", "128", "--vocab", "512"]


def mpirun(ranks, command):
    full = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS=1"] + command
    out = subprocess.run(full, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        sys.exit(f"{' '.join(full)} failed:\n{out.stderr}")
    return out.stdout


def model_parallel(ranks, shards, micro_batches):
    stdout = mpirun(ranks, [os.path.join(BUILD, "model_parallel_bench"), "--tensor-parallel", str(shards),
                            "--micro-batches", str(micro_batches)] + MODEL)
    rows = []
    for line in stdout.splitlines():
        if line.startswith("stage "):
            fields = line.split()
            rows.append({fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)})
    return rows


def data_parallel(ranks):
    stdout = mpirun(ranks, [os.path.join(BUILD, "train_bench"), "--steps", "3", "--warmup", "1",
                            "--batch", str(16 // ranks)] + MODEL)
    for line in stdout.splitlines():
        if line.startswith("tokens_per_s"):
            return float(line.split()[1])
    sys.exit("train_bench printed no tokens_per_s")


def main():
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    print(f"CPU: {cpu}, {os.cpu_count()} cores; one thread per rank; model: 8 blocks of 256, 4 heads, T 128, "
          f"vocab 512, 16 sequences per step, 1F1B")
    print(f"{'ranks':>5} {'layout':<22} {'TP MB/step/shard measured':>26} {'model':>8} {'TP all-reduce ms':>17} "
          f"{'tokens/s':>9} {'vs data parallel':>17}")
    for ranks, layouts in ((2, [(2, 1)]), (4, [(4, 1), (2, 4), (1, 8)])):
        baseline = data_parallel(ranks)
        print(f"{ranks:>5} {'data parallel':<22} {'-':>26} {'-':>8} {'-':>17} {baseline:>9.0f} {1.0:>17.2f}")
        for shards, micro_batches in layouts:
            stages = ranks // shards
            rows = model_parallel(ranks, shards, micro_batches)
            name = f"{shards} shards x {stages} stages" if stages > 1 else f"{shards} shards"
            if shards == 1:
                name = f"{stages} stages, m {micro_batches}"
            measured = max(int(r["tp_bytes_measured"]) for r in rows) / 1e6
            modelled = max(float(r["tp_bytes_model"]) for r in rows) / 1e6
            milliseconds = max(float(r["tp_ms"]) for r in rows)
            tokens = float(rows[0]["tokens_per_s"])
            print(f"{ranks:>5} {name:<22} {measured:>26.2f} {modelled:>8.2f} {milliseconds:>17.1f} {tokens:>9.0f} "
                  f"{tokens / baseline:>17.2f}", flush=True)


if __name__ == "__main__":
    main()
