#!/usr/bin/env python3
"""Each rank's peak memory over a whole `paraflow train` run of a GPT-2 Large shape (774M
parameters), layout by layout, against `paraflow plan`'s per-rank prediction and against the
rank's 1/N share of one process's peak; then a per-rank memory cap (a cgroup v1 memory limit per
process) under which one process is killed and a sharded layout trains.

Each rank runs under /usr/bin/time (peak RSS); its growth is that peak less the same layout's with
a near-empty model (what the binary, MPI and the runtime cost), as plan's figure is plan's for the
model less plan's for the near-empty one. Every run: 2 steps, the final checkpoint and the export.
A parameter-server layout ("ps4x1": 4 ps tasks, 1 worker and a chief, TF_CONFIG tasks on loopback
through tests/ps/launch_ps_job.sh) is measured task by task against `plan --ps-tasks --workers`,
its ps tasks against 1/P of one process (--one-growth-mib: one process's growth measured before,
when the "one" layout is not run again).

    bench/dist/per_rank_memory.py [--layouts one,tp2,...] [--cap-gib 6] [--n-layer 36 ...]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "src", "cli", "paraflow")
MPIRUN = "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np {} "
NEAR_EMPTY = "--set model.vocab_size=256 --set model.n_embd=40 --set model.n_layer=2 --set model.n_head=20"
# name: (ranks, settings); a parameter-server job: (ps tasks, workers), its tasks the chief, the
# workers and the ps tasks in that order
LAYOUTS = {
    "one": (1, ""),
    "tp2": (2, "--set dist.tensor_parallel=2"),
    "tp4": (4, "--set dist.tensor_parallel=4"),
    "pp2": (2, "--set dist.pipeline_parallel=2 --set dist.schedule=1f1b"),
    "tp2_pp2": (4, "--set dist.tensor_parallel=2 --set dist.pipeline_parallel=2"),
    "zero1": (4, "--set dist.zero=1"),
    "zero2": (4, "--set dist.zero=2"),
    "zero3": (4, "--set dist.zero=3"),
    # Two replicas: ZeRO-1/2 x4 on the whole 36 layers need 30.4 and 22.7 GiB together (each replica
    # holds every weight, ZeRO-1 every gradient too), more than a 24 GiB machine has; x2 fits.
    "zero1_x2": (2, "--set dist.zero=1"),
    "zero2_x2": (2, "--set dist.zero=2"),
    "zero3_x2": (2, "--set dist.zero=3"),
    # Each ps task holds a quarter of the weights, gradients and moments; the worker every weight and
    # gradient (it computes every layer): 19 GiB together.
    "ps4x1": ((4, 1), ""),
}


def task_count(ranks):
    """Processes of a layout: mpirun ranks, or a ps job's chief, workers and ps tasks."""
    return 1 + ranks[0] + ranks[1] if isinstance(ranks, tuple) else ranks


def task_names(ranks):
    """A ps job's tasks in order, as their TF_CONFIG type and index ("ps1"); ranks' numbers otherwise."""
    if not isinstance(ranks, tuple):
        return [str(r) for r in range(ranks)]
    ps, workers = ranks
    return ["chief0"] + [f"worker{i}" for i in range(workers)] + [f"ps{i}" for i in range(ps)]
CAPPED_SHARDED = "tp4"


def load():
    return open("/proc/loadavg").read().split()[0:3]


def mem_available_gib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def cpu_description():
    model = flags = ""
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model} ({os.cpu_count()} cores; {' '.join(isa)})"


def memory_cgroup():
    for line in open("/proc/self/cgroup"):
        parts = line.strip().split(":", 2)
        if parts[1] == "memory":
            return "/sys/fs/cgroup/memory" + parts[2]
    sys.exit("no cgroup v1 memory controller in /proc/self/cgroup")


class Bench:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.config = os.path.join(work, "config.yaml")
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w") as f:  # letters: any vocabulary covers their bytes
            f.write("".join(chr(97 + (i * 7919 % 26)) for i in range(200000)))
        with open(self.config, "w") as f:
            f.write(f"""model: {{vocab_size: {args.vocab}, n_positions: 1024, n_embd: {args.n_embd}, n_layer: {args.n_layer}, n_head: {args.n_head}}}
data: {{train: "{corpus}", format: text}}
train: {{batch_size: {args.batch}, sequence_length: {args.sequence}, steps: {args.steps}, lr: 1.0e-4, log_every: 1}}
dist: {{timeout_seconds: 600}}
""")

    def plan(self, ranks, settings):
        """plan's whole-run peak of every rank (or ps job's task, in task_names' order), MiB."""
        job = f"--ps-tasks {ranks[0]} --workers {ranks[1]}" if isinstance(ranks, tuple) else f"--ranks {ranks}"
        text = subprocess.run(f"{BINARY} plan --config {self.config} --threads 1 --peak-tflops 1 {job} {settings}",
                              shell=True, check=True, capture_output=True, text=True).stdout
        peaks = {}
        for line in text.splitlines():
            m = re.match(r"^([0-9][0-9,\-]*)\s+(\S+).*\s([0-9.]+)\s+(start-up|step|checkpoint|export)$", line)
            if not m:
                continue
            # A ps job's rows number the tasks within their role.
            offset = {"worker": 1, "ps": 1 + ranks[1]}.get(m.group(2), 0) if isinstance(ranks, tuple) else 0
            for part in m.group(1).split(","):
                first, _, last = part.partition("-")
                for rank in range(int(first), int(last or first) + 1):
                    peaks[offset + rank] = (float(m.group(3)), m.group(4))
        return [peaks[r] for r in range(task_count(ranks))]

    def measure(self, name, ranks, settings, cgroup_limit=None):
        """Every rank's peak RSS (MiB) and the job's exit status; with cgroup_limit (bytes), each
        rank in a memory cgroup of its own with that limit."""
        out = os.path.join(self.work, name)
        rss = os.path.join(self.work, name + ".rss.")
        train = f"{BINARY} train --config {self.config} --threads 1 --set train.out_dir={out} {settings}"
        rank = "0" if ranks == 1 else "$OMPI_COMM_WORLD_RANK"
        prefix = ""
        if isinstance(ranks, tuple):  # a ps job's task: named by its type and index, cut out of its TF_CONFIG
            rank = "$type$index"
            prefix = (r'type=${TF_CONFIG##*\"type\":\"}; type=${type%%\"*}; '
                      r'index=${TF_CONFIG##*\"index\":}; index=${index%%\}*}; ')
        enter = ""
        if cgroup_limit:
            base = memory_cgroup()
            for r in range(ranks):
                group = f"{base}/paraflow_cap_{os.getpid()}_{r}"
                os.makedirs(group, exist_ok=True)
                with open(group + "/memory.limit_in_bytes", "w") as f:
                    f.write(str(cgroup_limit))
            enter = f"echo $$ > {base}/paraflow_cap_{os.getpid()}_{rank}/cgroup.procs && "
        command = f"{prefix}{enter}exec /usr/bin/time -o {rss}{rank} -f %M {train}"
        if isinstance(ranks, tuple):
            command = f"{ROOT}/tests/ps/launch_ps_job.sh {ranks[0]} {ranks[1]} sh -c '{command}'"
        else:
            command = f"sh -c '{command}'" if ranks == 1 else MPIRUN.format(ranks) + f"sh -c '{command}'"
        start = time.time()
        result = subprocess.run(command, shell=True, capture_output=True, text=True)
        seconds = time.time() - start
        peaks = []
        for task in task_names(ranks):
            try:
                peaks.append(int(open(rss + task).read().split()[-1]) / 1024)
            except (OSError, ValueError, IndexError):
                peaks.append(float("nan"))  # killed before /usr/bin/time could write
        if cgroup_limit:
            for r in range(ranks):
                group = f"{memory_cgroup()}/paraflow_cap_{os.getpid()}_{r}"
                kills = open(group + "/memory.oom_control").read().split()
                peaks_note = dict(zip(kills[::2], kills[1::2])).get("oom_kill", "?")
                print(f"    rank {r}: cgroup oom_kill {peaks_note}", flush=True)
                try:
                    os.rmdir(group)
                except OSError:
                    pass
        shutil.rmtree(out, ignore_errors=True)
        if result.returncode != 0 and not cgroup_limit:
            print(result.stderr[-2000:], file=sys.stderr)
        memory_line = [l for l in result.stderr.splitlines() if l.startswith("memory: ") and "whole run" in l]
        return peaks, result.returncode, seconds, memory_line

    def layouts(self):
        rows = []
        one_growth = self.args.one_growth_mib
        for name in self.args.layouts.split(","):
            ranks, settings = LAYOUTS[name]
            planned, planned_empty = self.plan(ranks, settings), self.plan(ranks, settings + " " + NEAR_EMPTY)
            need = sum(p for p, _ in planned) / 1024 + 1
            if mem_available_gib() < need:
                print(f"{name}: skipped: the ranks together need {need:.1f} GiB (plan + 1), this machine has {mem_available_gib():.1f} GiB available", flush=True)
                continue
            empty, _, _, _ = self.measure(name + "_empty", ranks, settings + " " + NEAR_EMPTY)
            full, status, seconds, line = self.measure(name, ranks, settings)
            print(f"{name}: {task_count(ranks)} task(s), exit {status}, {seconds:.0f} s; {line[0] if line else ''}", flush=True)
            for r, task in enumerate(task_names(ranks)):
                growth = full[r] - empty[r]
                predicted = planned[r][0] - planned_empty[r][0]
                if name == "one":
                    one_growth = growth
                # A ps job's share is a ps task's: 1/P of the model's state (its chief and workers
                # are no shares of one process: a worker computes every layer).
                parts = ranks[0] if isinstance(ranks, tuple) else ranks
                is_share = not isinstance(ranks, tuple) or task.startswith("ps")
                share = one_growth / parts if one_growth and is_share else float("nan")
                rows.append((name, task, predicted, planned[r][1], growth, share))
                print(f"  rank {task}: measured {growth:9.1f} MiB  plan {predicted:9.1f} MiB ({planned[r][1]}, "
                      f"{100 * (growth - predicted) / predicted:+.1f}%)  1/{parts} of one process {share:9.1f} MiB "
                      f"(over it: {growth - share:+.1f} MiB)", flush=True)
        return rows

    def cap(self):
        limit = int(self.args.cap_gib * (1 << 30))
        print(f"memory cap {self.args.cap_gib} GiB per process (cgroup v1 memory.limit_in_bytes, one cgroup per rank):",
              flush=True)
        for name in ("one", CAPPED_SHARDED):
            ranks, settings = LAYOUTS[name]
            peaks, status, seconds, _ = self.measure(name + "_capped", ranks, settings, limit)
            verdict = "trained" if status == 0 else f"failed (exit {status}: killed by the cap)"
            print(f"  {name}: {ranks} rank(s), {verdict} in {seconds:.0f} s; peak RSS per rank (MiB): "
                  + ", ".join(f"{p:.0f}" for p in peaks), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--cap-gib", type=float, default=6.0, help="per-process cap of the cap run (0: no cap run)")
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--n-embd", type=int, default=1280)
    parser.add_argument("--n-layer", type=int, default=36)
    parser.add_argument("--n-head", type=int, default=20)
    parser.add_argument("--sequence", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--one-growth-mib", type=float, default=None,
                        help="one process's measured growth, for the shares when the 'one' layout is not run")
    args = parser.parse_args()
    print(f"CPU: {cpu_description()}; load before {' '.join(load())}; {mem_available_gib():.1f} GiB available", flush=True)
    print(f"model: vocab {args.vocab}, n_embd {args.n_embd}, {args.n_layer} layers, {args.n_head} heads; batch "
          f"{args.batch} x {args.sequence}, {args.steps} steps, the final checkpoint and the export", flush=True)
    with tempfile.TemporaryDirectory(prefix="per_rank_memory.") as work:
        bench = Bench(args, work)
        rows = bench.layouts()
        over = [growth - share for name, _, _, _, growth, share in rows if name != "one" and share == share]
        if over:
            print(f"largest excess of a rank over its 1/N share of one process: {max(over):+.1f} MiB", flush=True)
        if args.cap_gib > 0:
            bench.cap()
    print(f"load after {' '.join(load())}", flush=True)


if __name__ == "__main__":
    main()
