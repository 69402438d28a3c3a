"""Batch-1 decode speed of paraflow vs llama.cpp on a GPT-2 124M-shaped model (random weights),
in float32, bfloat16, float16, q8_0 and q4_k (for q8_0 both engines read the same Q8_0 GGUF file,
which tests/reference/gguf_files.py writes with gguf-py's quantizer under .venv-data; for q4_k the
same Q4_K file, which `paraflow quantize --type q4_k` writes: gguf-py has no Q4_K quantizer), against this machine's memory-bandwidth bound: at batch 1 each new token
reads every weight once, so tokens/s <= read bandwidth / weight bytes.

    python3 bench/infer/compare_decode.py [--threads 2] [--tokens 128] [--repetitions 3]
        [--model-dir DIR] [--paraflow-bin PATH] [--skip-build] [--dtypes q8_0,bfloat16]

Builds (unless --skip-build) paraflow and bandwidth_bench in build/ and llama-bench with
bench/infer/build_llama_cpp.sh; makes the model dir (bench/.cache/gpt2-124m-random by default, reused
when it has a config.json) with bench/infer/make_gpt2_124m.py under --ref-python, and its GGUF files
with llama.cpp's convert_hf_to_gguf.py under bench/.cache/venv-gguf. The bound uses the best of the
read bandwidth measured before and after the runs. Prints a table (engine, dtype, best tokens/s,
fraction of the bound, each run's tokens/s) and paraflow/llama.cpp per dtype; paraflow's figure is
the decode rate `generate` prints apart from the prompt's pass. On a shared machine the figures swing with its load
(printed before and after): the engines take turns, and the best run counts, as other processes
only slow a run down.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "bench/infer")
GGUF_PYTHON = os.path.join(ROOT, "bench/.cache/venv-gguf/bin/python")
DATA_PYTHON = os.path.join(ROOT, ".venv-data/bin/python")
DTYPES = ["float32", "bfloat16", "float16", "q8_0", "q4_k"]
GGUF_OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "q8_0": "q8_0", "q4_k": "q4_k"}
GGUF_READ = ("q8_0", "q4_k")  # the dtypes paraflow decodes from the GGUF file itself


def cpu_model():
    with open("/proc/cpuinfo") as f:
        return re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M).group(1)


def weight_bytes_per_token(model_dir):
    """Bytes of weights one decode step reads: every tensor but wpe (one row is looked up), the tied
    wte once (as lm_head); matrices at the dtype's width (Q8_0's packed blocks), vectors (biases,
    layer norms) in float32 as both engines keep them."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    matrix = vector = 0
    for name, tensor in header.items():
        if name.endswith("wpe.weight"):
            continue
        count = 1
        for size in tensor["shape"]:
            count *= size
        if len(tensor["shape"]) == 2:
            matrix += count
        else:
            vector += count
    return {"float32": 4 * (matrix + vector), "bfloat16": 2 * matrix + 4 * vector, "float16": 2 * matrix + 4 * vector,
            "q8_0": matrix * 34 // 32 + 4 * vector,  # Q8_0: 34 bytes per block of 32
            "q4_k": matrix * 144 // 256 + 4 * vector}  # Q4_K: 144 bytes per super-block of 256


def ensure_model(model_dir, ref_python, llama_src, dtypes, paraflow_bin):
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        subprocess.run([ref_python, os.path.join(HERE, "make_gpt2_124m.py"), model_dir], check=True)
    ggufs = {}
    os.makedirs(os.path.join(model_dir, "gguf"), exist_ok=True)
    for dtype in dtypes:
        outtype = GGUF_OUTTYPE[dtype]
        ggufs[dtype] = os.path.join(model_dir, f"gguf/model-{outtype}.gguf")
        if os.path.exists(ggufs[dtype]):
            continue
        if dtype == "q8_0":
            subprocess.run([DATA_PYTHON, os.path.join(ROOT, "tests/reference/gguf_files.py"), "convert", model_dir,
                            ggufs[dtype]], check=True, capture_output=True)
        elif dtype == "q4_k":
            subprocess.run([paraflow_bin, "quantize", "--model", model_dir, "--type", "q4_k", "--out", ggufs[dtype]],
                           check=True, capture_output=True)
        else:
            subprocess.run([GGUF_PYTHON, os.path.join(llama_src, "convert_hf_to_gguf.py"), model_dir, "--outtype", outtype,
                            "--outfile", ggufs[dtype]], check=True, capture_output=True)
    return ggufs


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
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3, help="runs per engine and dtype (the best counts)")
    parser.add_argument("--paraflow-bin", default=os.path.join(ROOT, "build/src/cli/paraflow"))
    parser.add_argument("--model-dir", default=os.path.join(ROOT, "bench/.cache/gpt2-124m-random"))
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
    ggufs = ensure_model(args.model_dir, args.ref_python, llama_src, dtypes, args.paraflow_bin)

    print(f"cpu: {cpu_model()} ({os.cpu_count()} cpus), load average {os.getloadavg()[0]:.1f}; threads {args.threads}, "
          f"batch 1, {args.tokens} new tokens, greedy; best of {args.repetitions} runs, the engines taking turns")
    weights = weight_bytes_per_token(args.model_dir)
    bandwidths = [read_bandwidth(args.threads)]
    runs = {(engine, dtype): [] for dtype in dtypes for engine in ("llama.cpp", "paraflow")}
    for _ in range(args.repetitions):
        for dtype in dtypes:
            runs["llama.cpp", dtype].append(llama_tokens_per_s(llama_src, ggufs[dtype], args.threads, args.tokens))
            model = ggufs[dtype] if dtype in GGUF_READ else args.model_dir
            runs["paraflow", dtype].append(paraflow_tokens_per_s(args.paraflow_bin, model, dtype, args.threads, args.tokens))
    bandwidths.append(read_bandwidth(args.threads))
    bandwidth = max(bandwidths)
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (bench/infer/bandwidth_bench, {args.threads} threads; best of "
          f"before {bandwidths[0] / 1e9:.1f} and after {bandwidths[1] / 1e9:.1f}); load average after "
          f"{os.getloadavg()[0]:.1f}")
    for dtype in dtypes:
        print(f"{dtype}: {weights[dtype] / 1e6:.1f} MB of weights per token -> bound {bandwidth / weights[dtype]:.1f} tokens/s")

    print(f"\n{'engine':<10} {'dtype':<9} {'tokens/s':>9} {'of bound':>9}  runs")
    best = {key: max(rates) if rates else None for key, rates in runs.items()}
    for (engine, dtype), rates in runs.items():
        bound = bandwidth / weights[dtype]
        rate = best[engine, dtype]
        print(f"{engine:<10} {dtype:<9} {rate:9.1f} {rate / bound:9.2f}  " + " ".join(f"{r:.1f}" for r in rates))
    print()
    for dtype in dtypes:
        ours, theirs = best["paraflow", dtype], best["llama.cpp", dtype]
        print(f"ratio paraflow/llama.cpp {dtype}: {ours / theirs:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
