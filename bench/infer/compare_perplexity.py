"""What quantizing costs in perplexity, paraflow vs llama.cpp on the same GGUF files, the same text
and the same scored tokens (issue #48): the trained model of bench/RESULTS.md "Q4_K: quantizer,
accuracy ..." (README's Getting started recipe, 256 wide: `configs/my-text.yaml` on Debian's GPL-3
with a tokenizer of 2048), written by
`paraflow quantize` as an F32, a Q8_0 and a Q4_K GGUF file (every matrix, as `llama-quantize --pure`);
each file's perplexity on GPL-2 by `paraflow eval --score-second-half --context C` (its own blocks:
--dtype q8_0 / q4_k for the quantized files) and by `llama-perplexity -c C`, which both score the
second half of each whole window of C tokens: the same tokens (GPT-2's tokenizer adds no BOS).

    python3 bench/infer/compare_perplexity.py [--context 128] [--threads 1] [--skip-build]

Trains the model into runs/my-text-256 unless its export exists (a few minutes on 2 cores), builds
paraflow (unless --skip-build) and llama-perplexity (bench/infer/build_llama_cpp.sh). Prints the
CPU, a table (file, each tool's perplexity, tokens scored and increase over its own float32) and
the difference of the two tools' increases. Timing plays no part: the load does not matter.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNS = os.path.join(ROOT, "runs")
MODEL = os.path.join(RUNS, "my-text-256")
TRAIN_TEXT, HELD_OUT = "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2"
FILES = {"float32": "f32", "q8_0": "q8_0", "q4_k": "q4_k"}  # the paraflow --dtype each file is read in


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, **kwargs)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout + done.stderr


def train_model(paraflow):
    """README's Getting started, 256 wide (rows of whole Q4_K super-blocks)."""
    if os.path.exists(os.path.join(MODEL, "export/config.json")):
        return
    text_dir = os.path.join(RUNS, "q4k-text")
    os.makedirs(text_dir, exist_ok=True)
    shutil.copy(TRAIN_TEXT, os.path.join(text_dir, "gpl-3.txt"))
    texts = os.path.join(text_dir, "*.txt")
    run([paraflow, "tokenizer", "train", "--vocab-size", "2048", "--input", texts, "--out", "runs/my-tokenizer"])
    run([paraflow, "data", "prepare", "--tokenizer", "runs/my-tokenizer", "--input", texts, "--out", "runs/my-data",
         "--val-fraction", "0.1"])
    run([paraflow, "train", "--config", "configs/my-text.yaml", "--set", "model.n_embd=256", "--set",
         f"train.out_dir={MODEL}"])


def make_files(paraflow):
    paths = {}
    for dtype, name in FILES.items():
        paths[dtype] = f"{MODEL}-{name}.gguf"
        if os.path.exists(paths[dtype]):
            continue
        # All three by paraflow quantize, so that llama.cpp reads the same tokenizer metadata in each
        # (its converter does not know our tokenizer's pre-tokenizer; gguf_files.py convert-f32
        # writes other metadata, which llama.cpp tokenizes into other chunks).
        run([paraflow, "quantize", "--model", os.path.join(MODEL, "export"), "--type", name, "--out", paths[dtype]])
    return paths


def ours(paraflow, path, dtype, context, threads):
    out = run([paraflow, "eval", "--model", path, "--text", HELD_OUT, "--dtype", dtype, "--context", str(context),
               "--score-second-half", "--threads", str(threads)])
    found = re.search(r"perplexity ([0-9.]+) \| .* (\d+) tokens scored in (\d+) windows", out)
    if not found:
        sys.exit(f"paraflow eval printed no perplexity:\n{out}")
    return float(found.group(1)), int(found.group(2))


def theirs(llama_perplexity, path, context, threads):
    out = run([llama_perplexity, "-m", path, "-f", HELD_OUT, "-c", str(context), "-b", str(context), "-t", str(threads)])
    # The perplexity so far after each chunk, "[i]P" (its log's "Final estimate" line may be lost at exit).
    running = re.findall(r"\[(\d+)\]([0-9.]+)", out)
    chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", out)
    if not running or not chunks or int(running[-1][0]) != int(chunks.group(1)):
        sys.exit(f"llama-perplexity printed no estimate over all its chunks:\n{out[-3000:]}")
    n_chunk, n_ctx = int(chunks.group(1)), int(chunks.group(2))
    return float(running[-1][1]), n_chunk * (n_ctx - 1 - n_ctx // 2)  # its scored tokens, as it counts them


def cpu():
    with open("/proc/cpuinfo") as info:
        text = info.read()
    model = re.search(r"model name\s*: (.*)", text).group(1)
    flags = re.search(r"flags\s*: (.*)", text).group(1).split()
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8") if f in flags]
    return f"{model} ({' '.join(isa)})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    if not args.skip_build:
        run(["cmake", "--build", "build", "--target", "paraflow", "-j2"])
    source = subprocess.run(["bash", "bench/infer/build_llama_cpp.sh"], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            check=True).stdout.strip().splitlines()[-1]
    llama_perplexity = os.path.join(source, "build/bin/llama-perplexity")
    paraflow = os.path.join(ROOT, "build/src/cli/paraflow")
    train_model(paraflow)
    paths = make_files(paraflow)
    print(f"CPU: {cpu()}; context {args.context}, threads {args.threads}, held-out text {HELD_OUT}")
    rows = {dtype: (ours(paraflow, path, dtype, args.context, args.threads),
                    theirs(llama_perplexity, path, args.context, args.threads)) for dtype, path in paths.items()}
    (base_ours, _), (base_theirs, _) = rows["float32"]
    counts = {n for (_, n), (_, m) in rows.values() for n in (n, m)}
    if len(counts) != 1:
        print(f"WARNING: the tools scored different numbers of tokens ({sorted(counts)}): not the same tokens")
    print("| file | paraflow eval --score-second-half (tokens) | increase | llama-perplexity (tokens) | increase |")
    print("|---|---|---|---|---|")
    for dtype, ((p, n), (q, m)) in rows.items():
        print(f"| {os.path.basename(paths[dtype])} | {p:.4f} ({n}) | {100 * (p / base_ours - 1):+.3f}% "
              f"| {q:.4f} ({m}) | {100 * (q / base_theirs - 1):+.3f}% |")
    for dtype in ("q8_0", "q4_k"):
        (p, _), (q, _) = rows[dtype]
        print(f"{dtype}: paraflow's increase minus llama.cpp's: "
              f"{100 * (p / base_ours - q / base_theirs):+.3f} points")


if __name__ == "__main__":
    main()
