"""TF Serving's dynamic batching on `:predict` (issue 11): `paraflow serve` with batching off and
on, at 1, 4, 16 and 64 concurrent clients; prints rows/s, p50/p99 latency, the batches the server
formed (from /metrics) and the on/off ratios.

    python3 bench/serve/predict_batching_bench.py [--quick] [--concurrency 1 4 16 64]
        [--batching-parameters FILE] [--rows-per-request 1] [--max-new-tokens 16] [--prompt-tokens 16:48]
        [--threads 2] [--requests-per-client N] [--max-seconds S] [--paraflow-arg ARG] [--json OUT]

For each concurrency C the two modes take turns, each on a fresh server (127.0.0.1, a free port,
ready when GET /health answers 200, warmed up with one :predict, stopped with SIGTERM):
  - off: `paraflow serve` (every Predict row goes straight to the continuous-batching engine);
  - on:  `paraflow serve --enable_batching --batching_parameters_file=FILE` (TF Serving's flags):
         Predicts wait in the batcher (serve/predict_batcher.h) until their batch runs.
FILE is --batching-parameters, by default TF Serving's batching guide's settings (max_batch_size
32, batch_timeout_micros 100000, num_batch_threads 4), written next to the server logs. A binary
whose `serve` has no --enable_batching is measured with batching off only, and says so.

Load: C clients, each sending its Predicts one after the other (columnar form, --rows-per-request
rows of random token ids of one length drawn from --prompt-tokens, max_new_tokens fixed; greedy),
a connection per request. Measured per request: latency from sending to the whole answer. rows/s
is the rows answered over the wall time from the first request sent to the last answered. With
batching on, the batch sizes come from the server's /metrics (paraflow_predict_batch_size, the
difference over the run). Requests refused with 503 (a full batch queue) are counted apart.
Bounded: every request has a timeout and every run a deadline (--max-seconds); what is left is
cancelled and counted as cut. --quick sends fewer requests per client (REQUESTS' second column)
and fewer new tokens: all of it in under two minutes on 2 cores. The load average is printed
before and after each run: on a shared machine other processes move the figures (and a server
whose OpenMP threads outnumber the idle cores stalls; --threads 1 there).

The model is bench/serve/make_gpt_small.py's (configs/gpt-small.yaml's shape, random weights),
made on first use under bench/.cache/ with --ref-python (torch + transformers).
"""
import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_servers  # noqa: E402
import load_generator  # noqa: E402
import bench_models  # noqa: E402  (on the path through compare_servers)

ROOT = compare_servers.ROOT
ARTICLE_SETTINGS = ("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 100000 }\n"
                    "num_batch_threads { value: 4 }\n")
# Requests per client at each concurrency: (full, --quick).
REQUESTS = {1: (32, 6), 4: (16, 4), 16: (8, 2), 64: (4, 1)}
MODEL_NAME = "gpt-small"


def make_requests(count, rows, low, high, vocab, seed):
    """`count` Predict inputs of `rows` rows each, one length per request; ids past the byte
    tokens and short of the last id (<|endoftext|>), as load_generator.make_prompts draws them."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        length = rng.randint(low, high)
        requests.append([[rng.randrange(256, vocab - 1) for _ in range(length)] for _ in range(rows)])
    return requests


async def run_load(url, requests, concurrency, per_client, max_new_tokens, max_seconds):
    """Client c sends requests[c * per_client + i] for i in 0..per_client-1, one after the other."""
    results = []  # (status, latency seconds, rows, error)

    async def client(index):
        for i in range(per_client):
            rows = requests[index * per_client + i]
            body = {"inputs": {"input_ids": rows, "max_new_tokens": max_new_tokens}}
            start = time.perf_counter()
            try:
                status, answer = await load_generator.post(url, body, timeout=max_seconds)
            except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                results.append((None, time.perf_counter() - start, len(rows), f"{type(e).__name__}: {e}"))
                continue
            latency = time.perf_counter() - start
            ok = status == 200 and isinstance(answer, dict) and len(answer.get("outputs", [])) == len(rows)
            results.append((status, latency, len(rows), None if ok else f"HTTP {status}: {str(answer)[:200]}"))

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(client(c)) for c in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=max_seconds)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - start
    ok = [r for r in results if r[3] is None]
    latencies = [r[1] for r in ok]
    errors = [r[3] for r in results if r[3] is not None and r[0] != 503]
    return {
        "concurrency": concurrency,
        "planned": concurrency * per_client,
        "completed": len(ok),
        "refused_503": sum(1 for r in results if r[0] == 503),
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "cut": concurrency * per_client - len(results),
        "wall_s": wall,
        "rows_per_s": sum(r[2] for r in ok) / wall if wall > 0 else float("nan"),
        "p50_s": load_generator.percentile(latencies, 50),
        "p99_s": load_generator.percentile(latencies, 99),
    }


def batch_sizes(url):
    """(sum, count) of paraflow_predict_batch_size from /metrics; None when the server has none."""
    status, text = asyncio.run(load_generator.get(url + "/metrics"))
    if status != 200:
        return None
    found = {key: float(value) for key, value in
             re.findall(r"^paraflow_predict_batch_size_(sum|count)(?:\{[^}]*\})? (\S+)$", text, re.M)}
    return (found["sum"], found["count"]) if len(found) == 2 else None


def run_one(mode, args, model_dir, config, concurrency, requests, per_client, log_dir):
    port = compare_servers.free_port()
    # The KV pool holds max_num_seqs sequences of the longest prompt plus the new tokens, in float32.
    shape = bench_models.Shape(config)
    tokens = max(args.max_num_seqs * (args.high + args.max_new_tokens), shape.context)
    kv_gb = round(tokens * shape.kv_bytes_per_token() * 1.25 / 2**30 + 0.005, 2)
    command = [args.paraflow_bin, "serve", "--model", model_dir, "--served-model-name", MODEL_NAME, "--host",
               "127.0.0.1", "--port", str(port), "--threads", str(args.threads), "--max-num-seqs",
               str(args.max_num_seqs), "--kv-cache-gb", str(kv_gb)] + args.paraflow_arg
    if mode == "on":
        command += ["--enable_batching", f"--batching_parameters_file={args.batching_parameters}"]
    log_path = os.path.join(log_dir, f"predict-batching-{mode}-c{concurrency}.log")
    server = compare_servers.Server(f"batching {mode}", command, port, log_path,
                                    dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    outcome = {"mode": mode, "concurrency": concurrency, "command": " ".join(command), "log": log_path}
    url = f"{server.url}/v1/models/{MODEL_NAME}:predict"
    try:
        server.wait_ready(args.start_timeout)
        warm_up = {"inputs": {"input_ids": requests[0], "max_new_tokens": 2}}
        status, answer = asyncio.run(load_generator.post(url, warm_up, timeout=args.max_seconds))
        if status != 200:
            raise RuntimeError(f"warm-up :predict answered {status}: {str(answer)[:300]}")
        before = batch_sizes(server.url)
        load_before = os.getloadavg()[0]
        metrics = asyncio.run(run_load(url, requests, concurrency, per_client, args.max_new_tokens, args.max_seconds))
        metrics["load_before"], metrics["load_after"] = load_before, os.getloadavg()[0]
        after = batch_sizes(server.url)
        if before and after and after[1] > before[1]:
            metrics["batches"] = after[1] - before[1]
            metrics["mean_batch_rows"] = (after[0] - before[0]) / (after[1] - before[1])
        outcome["metrics"] = metrics
    except (RuntimeError, OSError, asyncio.TimeoutError) as e:
        outcome["failure"] = str(e)
        print(f"  FAILED batching {mode} at {concurrency} clients: {e}", file=sys.stderr)
    finally:
        server.stop()
    return outcome


HEADER = (f"{'batching':<9} {'conc':>4} {'done':>7} {'503':>4} {'rows/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'batches':>7} {'rows/batch':>10} {'load':>9}")


def print_outcome(outcome):
    m = outcome.get("metrics")
    if not m:
        print(f"{outcome['mode']:<9} {outcome['concurrency']:>4}   FAILED (log {outcome['log']})", flush=True)
        return
    batches = f"{m['batches']}" if "batches" in m else "-"
    rows = f"{m['mean_batch_rows']:.1f}" if "mean_batch_rows" in m else "-"
    print(f"{outcome['mode']:<9} {m['concurrency']:>4} {m['completed']:>3}/{m['planned']:<3} {m['refused_503']:>4} "
          f"{m['rows_per_s']:8.1f} {m['p50_s'] * 1e3:8.1f} {m['p99_s'] * 1e3:8.1f} {batches:>7} {rows:>10} "
          f"{m['load_before']:4.1f}/{m['load_after']:.1f}", flush=True)
    for error in m["first_errors"]:
        print(f"    error: {error}")
    if m["cut"]:
        print(f"    note: {m['cut']} requests cut by the deadline")


def print_ratios(results, concurrencies):
    by = {(o["mode"], o["concurrency"]): o.get("metrics") for o in results}
    print(f"\n  {'conc':>4} {'rows/s on/off':>14} {'p50 on/off':>11} {'p99 on/off':>11}")
    for c in concurrencies:
        on, off = by.get(("on", c)), by.get(("off", c))
        ratio = lambda key: compare_servers.ratio(on and on[key], off and off[key])  # noqa: E731
        print(f"  {c:>4} {ratio('rows_per_s'):13.2f}x {ratio('p50_s'):10.2f}x {ratio('p99_s'):10.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests per client and new tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests-per-client", type=int, help="overrides REQUESTS at every concurrency")
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, help="default 16 (TF Serving's Predict signature here), "
                        "--quick 4")
    parser.add_argument("--prompt-tokens", default="16:48", help="MIN:MAX ids per row, drawn per request")
    parser.add_argument("--batching-parameters", help="a BatchingParameters text file (default: the article's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the engine's, the same in both modes")
    parser.add_argument("--max-seconds", type=float, help="deadline of each load run (default 120, --quick 20)")
    parser.add_argument("--start-timeout", type=float, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paraflow-bin", default=os.path.join(ROOT, "build/src/cli/paraflow"))
    parser.add_argument("--paraflow-arg", action="append", default=[], help="extra argument to paraflow serve")
    parser.add_argument("--ref-python", default=os.path.join(ROOT, ".venv-ref/bin/python"))
    parser.add_argument("--json", help="write every measurement here")
    args = parser.parse_args()
    args.low, args.high = (int(x) for x in args.prompt_tokens.split(":"))
    args.max_new_tokens = args.max_new_tokens or (4 if args.quick else 16)
    args.max_seconds = args.max_seconds or (20 if args.quick else 120)
    if not os.access(args.paraflow_bin, os.X_OK):
        sys.exit(f"no executable {args.paraflow_bin} (cmake --build build --target paraflow)")
    usage = subprocess.run([args.paraflow_bin, "serve", "--help"], capture_output=True, text=True)
    modes = ["off", "on"]
    if "--enable_batching" not in usage.stdout + usage.stderr:
        modes = ["off"]
        print(f"note: {args.paraflow_bin} serve has no --enable_batching: measuring batching off only")

    model_dir, config = bench_models.ensure_model(MODEL_NAME, args.ref_python)
    if args.high + args.max_new_tokens > config["n_positions"]:
        sys.exit(f"--prompt-tokens max {args.high} + max_new_tokens {args.max_new_tokens} exceed the model's context "
                 f"{config['n_positions']}")
    log_dir = os.path.join(compare_servers.CACHE, "serve-logs")
    os.makedirs(log_dir, exist_ok=True)
    if not args.batching_parameters:
        args.batching_parameters = os.path.join(log_dir, "batching_parameters.txt")
        with open(args.batching_parameters, "w") as f:
            f.write(ARTICLE_SETTINGS)
    with open(args.batching_parameters) as f:
        settings = " ".join(line.strip() for line in f if line.strip())

    cpu, isa = bench_models.cpu_description()
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    print(f"cpu: {cpu}, {os.cpu_count()} cpus; ISA: {' '.join(isa)}")
    print(f"paraflow: {commit}; model {MODEL_NAME} ({bench_models.Shape(config)}), "
          f"threads {args.threads}, max_num_seqs {args.max_num_seqs}")
    print(f"Predicts of {args.rows_per_request} row(s) of {args.low}-{args.high} ids, max_new_tokens "
          f"{args.max_new_tokens}; {'quick' if args.quick else 'full'} request counts; batching parameters: {settings}")
    print(f"load generator niceness {load_generator.raise_priority()} (servers: 0); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(HEADER)
    started = time.monotonic()
    results = []
    for concurrency in args.concurrency:
        per_client = args.requests_per_client or REQUESTS.get(concurrency, (4, 1))[1 if args.quick else 0]
        requests = make_requests(concurrency * per_client, args.rows_per_request, args.low, args.high,
                                 config["vocab_size"], args.seed + concurrency)
        for mode in modes:
            outcome = run_one(mode, args, model_dir, config, concurrency, requests, per_client, log_dir)
            results.append(outcome)
            print_outcome(outcome)
    if "on" in modes:
        print_ratios(results, args.concurrency)
    print(f"\nwall time {time.monotonic() - started:.0f} s; load average after {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "isa": isa, "paraflow": commit, "args": vars(args), "runs": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
