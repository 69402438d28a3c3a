"""Runs two benchmark commands taking turns and compares one figure they print: on a shared machine
whose speed drifts, only runs interleaved in time compare two binaries fairly.

    python3 bench/take_turns.py --runs 10 --key decode_tokens_per_s \\
        --a "OLD/decode_bench --model M --dtype bfloat16" --b "build/bench/infer/decode_bench --model M --dtype bfloat16"

Each command runs --runs times, A then B, with OMP_NUM_THREADS=2 unless set; the figure is the
number after `--key` on its output line ("key value"), a rate (higher is better). Prints each
side's runs, median and best, and B/A for both.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys


def figure(command, key, env):
    result = subprocess.run(shlex.split(command), capture_output=True, text=True, env=env)
    match = re.search(rf"^{re.escape(key)}\s+([-+\d.eE]+)\s*$", result.stdout, re.M)
    if result.returncode != 0 or match is None:
        sys.exit(f"{command!r} exited {result.returncode} without a '{key} <value>' line:\n{result.stdout}{result.stderr}")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="the reference command")
    parser.add_argument("--b", required=True, help="the command compared with it")
    parser.add_argument("--key", required=True, help="the figure to compare, as the commands print it")
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    runs = {"A": [], "B": []}
    for _ in range(args.runs):
        runs["A"].append(figure(args.a, args.key, env))
        runs["B"].append(figure(args.b, args.key, env))
    for side, values in runs.items():
        print(f"{side}: median {statistics.median(values):.2f} best {max(values):.2f} runs "
              + " ".join(f"{v:.1f}" for v in values))
    print(f"B/A: median {statistics.median(runs['B']) / statistics.median(runs['A']):.3f} "
          f"best {max(runs['B']) / max(runs['A']):.3f}")


if __name__ == "__main__":
    main()
