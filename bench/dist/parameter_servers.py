#!/usr/bin/env python3
"""Parameter-server training next to all-reduce data parallelism, and async against sync.

Part 1 (throughput): the quickstart model (configs/quickstart.yaml, its TFRecord data) trained
for --steps steps by 1 ps x 2 workers and 2 ps x 4 workers on loopback (tests/ps/launch_ps_job.sh),
synchronous and asynchronous, and by `mpirun -np <workers>` data parallelism: tokens/s over
the steps after the first five (from the times the chief prints its step lines), the bytes a step
moves over the network (all workers' pulls and pushes; a ring all-reduce's sends from every rank), and the seconds a worker's step spends pulling, computing and
pushing. One thread per process; with more processes than cores they share the cores (the table
says so).

Part 2 (convergence): 1 ps x 2 workers, --convergence-steps steps synchronous and asynchronous
(dist.max_staleness 4) on the same examples, at each of --convergence-lrs peak rates; each
export evaluated on the validation split (`paraflow eval`), and the ratio of the losses printed.

  python3 bench/dist/parameter_servers.py [--steps 40] [--convergence-steps 400] [--convergence-lrs 2e-3 6e-4] [--parts throughput convergence]
Needs the quickstart's data (runs/quickstart-data, runs/quickstart-tokenizer): scripts/quickstart.sh
makes them.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAFLOW = os.path.join(ROOT, "build/src/cli/paraflow")
LAUNCH = os.path.join(ROOT, "tests/ps/launch_ps_job.sh")
CONFIG = os.path.join(ROOT, "configs/quickstart.yaml")
OUT = os.path.join(ROOT, "runs/bench-ps")
# The quickstart model's parameters: wte + wpe + 4 blocks of 12C^2 + 13C + the final layernorm.
PARAMETERS = 4096 * 192 + 128 * 192 + 4 * (12 * 192 * 192 + 13 * 192) + 2 * 192
STEP = re.compile(r"^step (\d+)/\d+ \| loss ([\d.]+)")
PHASES = re.compile(r"pull ([\d.]+)s compute ([\d.]+)s push ([\d.]+)s \| ([\d.]+) MB/step")


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def train(prefix, name, steps, extra):
    """Runs one job; returns its step lines as (arrival time, step, loss, phases or None)."""
    out_dir = os.path.join(OUT, name)
    subprocess.run(["rm", "-rf", out_dir], check=True)
    command = prefix + [PARAFLOW, "train", "--config", CONFIG, "--threads", "1", "--set", f"train.out_dir={out_dir}",
                        "--set", f"train.steps={steps}", "--set", "train.log_every=1", "--set",
                        "train.checkpoint_every=0", "--set", "train.eval_every=0"] + extra
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines, log = [], []
    for line in process.stderr:
        log.append(line)
        match = STEP.match(line)
        if match:
            phases = PHASES.search(line)
            lines.append((time.monotonic(), int(match.group(1)), float(match.group(2)),
                          tuple(float(x) for x in phases.groups()) if phases else None))
    if process.wait() != 0:
        sys.exit(f"{' '.join(command)} failed:\n{''.join(log[-30:])}")
    return out_dir, lines


def tokens_per_second(lines, tokens_per_step, warmup=5):
    timed = [line for line in lines if line[1] >= warmup]
    first, last = timed[0], timed[-1]
    return (last[1] - first[1]) * tokens_per_step / (last[0] - first[0])


def evaluate(export):
    result = subprocess.run([PARAFLOW, "eval", "--config", CONFIG, "--checkpoint", export, "--set",
                             "train.eval_batches=16"], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(re.search(r"val loss ([\d.]+)", result.stderr + result.stdout).group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--convergence-steps", type=int, default=400)
    # The quickstart's peak rate, and a lower one (asynchronous updates are sensitive to it).
    parser.add_argument("--convergence-lrs", type=float, nargs="+", default=[2e-3, 6e-4])
    parser.add_argument("--parts", nargs="+", default=["throughput", "convergence"],
                        choices=["throughput", "convergence"])
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(ROOT, "runs/quickstart-data")):
        sys.exit("no runs/quickstart-data: run scripts/quickstart.sh first")
    tokens_per_step = 16 * 128  # the quickstart config's batch x sequence
    as_root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    cores = os.cpu_count()
    print(f"CPU: {cpu_model()}, {cores} cores; one thread per process; quickstart model (4 layers, 192 wide, "
          f"vocab 4096), batch 16 x 128 tokens; {args.steps} steps, tokens/s after step 5")
    if "throughput" in args.parts:
        throughput(args, tokens_per_step, as_root, cores)
    if "convergence" in args.parts:
        convergence(args, tokens_per_step)


def throughput(args, tokens_per_step, as_root, cores):
    print(f"{'layout':<24} {'processes':>9} {'tokens/s':>9} {'x all-reduce':>12} {'MB/step':>8} "
          f"{'pull s':>7} {'compute s':>9} {'push s':>7} {'final loss':>10}")
    for ps_tasks, workers in ((1, 2), (2, 4)):
        _, lines = train(["mpirun", *as_root, "--oversubscribe", "-np", str(workers), "-x", "OMP_NUM_THREADS=1"],
                         f"allreduce{workers}", args.steps, [])
        baseline = tokens_per_second(lines, tokens_per_step)
        # A ring all-reduce sends 2(n-1)/n of the gradients' bytes from every rank, each step.
        ring_mb = workers * 2 * (workers - 1) / workers * 4 * PARAMETERS / 1e6
        note = " (oversubscribed)" if workers > cores else ""
        print(f"{f'all-reduce x{workers}':<24} {workers:>9} {baseline:>9.0f} {1.0:>12.2f} {ring_mb:>8.1f} "
              f"{'':>7} {'':>9} {'':>7} {lines[-1][2]:>10.4f}{note}", flush=True)
        for mode in ("sync", "async"):
            _, lines = train([LAUNCH, str(ps_tasks), str(workers)], f"{mode}{ps_tasks}x{workers}", args.steps,
                             ["--set", f"dist.ps_mode={mode}"])
            speed = tokens_per_second(lines, tokens_per_step)
            phases = [line[3] for line in lines if line[3] and line[1] >= 5]
            mean = [sum(p[i] for p in phases) / len(phases) for i in range(4)]
            processes = ps_tasks + workers + 1
            note = " (oversubscribed)" if processes > cores else ""
            print(f"{f'{ps_tasks} ps x {workers} workers {mode}':<24} {processes:>9} {speed:>9.0f} "
                  f"{speed / baseline:>12.2f} {mean[3]:>8.1f} {mean[0]:>7.3f} {mean[1]:>9.3f} {mean[2]:>7.3f} "
                  f"{lines[-1][2]:>10.4f}{note}", flush=True)


def convergence(args, tokens_per_step):
    print(f"\nconvergence: 1 ps x 2 workers, {args.convergence_steps} steps of 16 sequences each (the same examples), "
          f"validation loss of the export (16 batches); min_lr = lr / 10")
    for lr in args.convergence_lrs:
        losses = {}
        for mode in ("sync", "async"):
            out_dir, lines = train([LAUNCH, "1", "2"], f"converge-{mode}-{lr:g}", args.convergence_steps,
                                   ["--set", f"dist.ps_mode={mode}", "--set", "dist.max_staleness=4", "--set",
                                    f"train.lr={lr}", "--set", f"train.min_lr={lr / 10}"])
            losses[mode] = evaluate(os.path.join(out_dir, "export"))
            print(f"  lr {lr:g} {mode:<5} train loss (last line) {lines[-1][2]:.4f}, validation loss "
                  f"{losses[mode]:.4f}, {tokens_per_second(lines, tokens_per_step):.0f} tokens/s", flush=True)
        print(f"  lr {lr:g}: async / sync validation loss {losses['async'] / losses['sync']:.4f} (target <= 1.03)",
              flush=True)


if __name__ == "__main__":
    main()
