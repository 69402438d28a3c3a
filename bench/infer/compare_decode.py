"""Batch-1 decode speed of paraflow vs llama.cpp on a random-weight model (bench/infer/bench_models.py:
GPT-2 124M's shape, or Qwen2.5-0.5B's with --shape qwen2.5-0.5b), in float32, bfloat16, float16,
q8_0 and q4_k (for q8_0 both engines read the same Q8_0 GGUF file, which
tests/reference/gguf_files.py writes for GPT-2 with gguf-py's quantizer under .venv-data and
`paraflow quantize --type q8_0` for the Llama family; for q4_k the same Q4_K file, which `paraflow
quantize --type q4_k` writes: gguf-py has no Q4_K quantizer; Qwen2.5-0.5B's is Q5_0 but for the
MLP's down projection, as llama-quantize falls back for rows that are not whole 256-value
super-blocks), against this machine's memory-bandwidth bound: at batch 1 each new token reads
every weight once, so tokens/s <= read bandwidth / packed weight bytes.

    python3 bench/infer/compare_decode.py [--shape gpt2-124m|qwen2.5-0.5b] [--threads 1 2] [--tokens 128]
        [--repetitions 3] [--model-dir DIR] [--paraflow-bin PATH] [--skip-build] [--dtypes q8_0,bfloat16]

Builds (unless --skip-build) paraflow and bandwidth_bench in build/ and llama-bench with
bench/infer/build_llama_cpp.sh; makes the model dir (bench/.cache/<shape>-random by default,
reused when it has a config.json) with the shape's maker under --ref-python, and its GGUF files
with llama.cpp's convert_hf_to_gguf.py under bench/.cache/venv-gguf. For each thread count the
bound uses the best of the read bandwidth measured before and after that count's runs. Prints the
CPU and its ISA, a table (threads, engine, dtype, best tokens/s, fraction of the bound, each run's
tokens/s) and paraflow/llama.cpp per thread count and dtype; paraflow's figure is the decode rate
`generate` prints apart from the prompt's pass. On a shared machine the figures swing with its
load (printed before and after): the engines take turns, and the best run counts, as other
processes only slow a run down.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "bench/infer")
sys.path.insert(0, HERE)
import bench_models  # noqa: E402

DTYPES = ["float32", "bfloat16", "float16", "q8_0", "q4_k"]
def read_bandwidth(threads):
    out = subprocess.run([os.path.join(ROOT, "build/bench/infer/bandwidth_bench")], check=True, capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
    return float(re.search(r"^read_gb_per_s ([0-9.]+)$", out, re.M).group(1)) * 1e9


def llama_tokens_per_s(llama_src, gguf, threads, tokens):
    out = subprocess.run([os.path.join(llama_src, "build/bin/llama-bench"), "-m", gguf, "-p", "0", "-n", str(tokens),
                          "-t", str(threads), "-r", "1", "-o", "json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def paraflow_tokens_per_s(binary, model_dir, dtype, threads, tokens):
    """The decode rate `paraflow generate` prints apart from the prompt's pass, as llama-bench's tg.
    `model_dir`: the Hugging Face dir, or for q8_0 and q4_k the GGUF file llama.cpp reads."""
    command = [binary, "generate", "--model", model_dir, "--prompt", "Hello", "--max-tokens", str(tokens),
               "--temperature", "0", "--dtype", dtype]
    err = subprocess.run(command, check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stderr
    generated = int(re.search(r"\+ (\d+) generated tokens", err).group(1))
    if generated != tokens:
        print(f"note: paraflow {dtype} generated {generated} of {tokens} tokens", file=sys.stderr)
    return float(re.search(r"decode ([0-9.]+) tokens/s", err).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="gpt2-124m", choices=["gpt2-124m", "qwen2.5-0.5b"])
    parser.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count()])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3, help="runs per engine and dtype (the best counts)")
    parser.add_argument("--paraflow-bin", default=os.path.join(ROOT, "build/src/cli/paraflow"))
    parser.add_argument("--model-dir", help="default: the shape's dir under bench/.cache")
    parser.add_argument("--ref-python", default=os.path.join(ROOT, ".venv-ref/bin/python"),
                        help="Python with torch and transformers that makes the model dir")
    parser.add_argument("--skip-build", action="store_true", help="use the built binaries as they are")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, of " + ", ".join(DTYPES))
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    assert set(dtypes) <= set(DTYPES), f"--dtypes: each of {DTYPES}"

    build_llama = [os.path.join(HERE, "build_llama_cpp.sh")] + (["--dir"] if args.skip_build else [])
    llama_src = subprocess.run(build_llama, check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    if not args.skip_build:
        subprocess.run(["cmake", "-S", ROOT, "-B", os.path.join(ROOT, "build"), "-DCMAKE_BUILD_TYPE=Release"], check=True,
                       stdout=subprocess.DEVNULL)
        targets = ["bandwidth_bench"] + (["paraflow"] if args.paraflow_bin == parser.get_default("paraflow_bin") else [])
        subprocess.run(["cmake", "--build", os.path.join(ROOT, "build"), "-j2", "--target", *targets], check=True,
                       stdout=subprocess.DEVNULL)
    if args.model_dir:
        model_dir = args.model_dir
    else:
        model_dir, _ = bench_models.ensure_model(args.shape, args.ref_python)
    ggufs = bench_models.ensure_ggufs(model_dir, llama_src, dtypes, args.paraflow_bin)
    with open(os.path.join(model_dir, "config.json")) as f:
        shape = bench_models.Shape(json.load(f))

    model, isa = bench_models.cpu_description()
    print(f"cpu: {model} ({os.cpu_count()} cpus); ISA: {' '.join(isa)}")
    print(f"model: {args.shape} ({shape}), {os.path.relpath(model_dir, ROOT)}; batch 1, {args.tokens} new tokens, "
          f"greedy; best of {args.repetitions} runs, the engines taking turns")
    weights = bench_models.weight_bytes_per_token(model_dir)
    best = {}
    for threads in args.threads:
        print(f"\n== {threads} threads; load average before {os.getloadavg()[0]:.1f}")
        bandwidths = [read_bandwidth(threads)]
        runs = {(engine, dtype): [] for dtype in dtypes for engine in ("llama.cpp", "paraflow")}
        for _ in range(args.repetitions):
            for dtype in dtypes:
                runs["llama.cpp", dtype].append(llama_tokens_per_s(llama_src, ggufs[dtype], threads, args.tokens))
                source = ggufs[dtype] if dtype in bench_models.GGUF_READ else model_dir
                runs["paraflow", dtype].append(paraflow_tokens_per_s(args.paraflow_bin, source, dtype, threads, args.tokens))
        bandwidths.append(read_bandwidth(threads))
        bandwidth = max(bandwidths)
        print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (bench/infer/bandwidth_bench, {threads} threads; best of "
              f"before {bandwidths[0] / 1e9:.1f} and after {bandwidths[1] / 1e9:.1f}); load average after "
              f"{os.getloadavg()[0]:.1f}")
        for dtype in dtypes:
            print(f"{dtype}: {weights[dtype] / 1e6:.1f} MB of weights per token -> bound {bandwidth / weights[dtype]:.1f} "
                  "tokens/s")
        print(f"\n{'threads':>7} {'engine':<10} {'dtype':<9} {'tokens/s':>9} {'of bound':>9}  runs")
        for (engine, dtype), rates in runs.items():
            rate = best[threads, engine, dtype] = max(rates)
            print(f"{threads:>7} {engine:<10} {dtype:<9} {rate:9.1f} {rate / (bandwidth / weights[dtype]):9.2f}  "
                  + " ".join(f"{r:.1f}" for r in rates))
    print()
    for threads in args.threads:
        for dtype in dtypes:
            ours, theirs = best[threads, "paraflow", dtype], best[threads, "llama.cpp", dtype]
            print(f"ratio paraflow/llama.cpp {dtype}, {threads} threads: {ours / theirs:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
