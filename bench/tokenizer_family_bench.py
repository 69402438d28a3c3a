#!/usr/bin/env python3
"""Tokenizer speed for the Llama family, paraflow vs Hugging Face tokenizers, in one run: encode
MB/s on one thread and on all, for tokenizer.json files with Llama 3's, Qwen2's and Llama 2's exact
components (built by tests/reference/tokenizer_family_oracle.py on a BPE trained on the corpus).

    .venv-data/bin/python bench/tokenizer_family_bench.py [--bench build/bench/tokenizer/tokenizer_bench] \
        [--corpus ../shared/data/sotu.jsonl.gz] [--vocab-size 32000] [--repeats 3]

Both encoders must give the same ids on the whole corpus; the script checks that before timing.
"""
import argparse
import array
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tokenizer_bench import median, read_corpus, run_paraflow, timed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, "tests/reference/tokenizer_family_oracle.py")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", default=os.path.join(ROOT, "build/bench/tokenizer/tokenizer_bench"))
    p.add_argument("--corpus", default=os.path.join(ROOT, "../shared/data/sotu.jsonl.gz"))
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--families", default="llama3,qwen2,llama2")
    args = p.parse_args()

    import tokenizers
    from tokenizers import Tokenizer

    texts, mb = read_corpus(args.corpus)
    threads = os.cpu_count()
    print(f"corpus: {len(texts)} documents, {mb:.2f} MB; {threads} threads; tokenizers {tokenizers.__version__}; "
          f"vocabulary {args.vocab_size}", flush=True)
    work = tempfile.mkdtemp(prefix="paraflow_tok_family_bench_")
    train = os.path.join(work, "train.txt")
    with open(train, "w", encoding="utf-8") as f:
        f.write("\n\n".join(t.replace("\n\n", "\n") for t in texts))
    rows = []
    same = True
    cpu = "unknown"
    for family in args.families.split(","):
        directory = os.path.join(work, family)
        subprocess.run([sys.executable, ORACLE, "build", "--family", family, "--train", train, "--vocab-size",
                        str(args.vocab_size), "--out", directory], check=True)
        ours, our_ids = run_paraflow(args.bench, args.corpus, directory, args.repeats, 300)
        hf = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        hf_ids = array.array("i", (i for e in hf.encode_batch(texts, add_special_tokens=False) for i in e.ids))
        equal = hf_ids == our_ids
        same = same and equal
        one = mb / median(timed(lambda: [hf.encode(t, add_special_tokens=False) for t in texts], args.repeats))
        batch = mb / median(timed(lambda: hf.encode_batch(texts, add_special_tokens=False), args.repeats))
        rows.append((family, ours["encode_1thread_MBps_median"], ours["encode_batch_all_threads_MBps_median"], one,
                     batch, len(our_ids), equal))
        cpu = ours["cpu"]

    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    isa = [x for x in ("sse4_2", "avx2", "bmi2", "avx512f", "avx512bw") if x in flags]
    print(f"cpu: {cpu}; ISA extensions: {' '.join(isa)} (the encoders are scalar code)")
    print(f"\nencode, median of {args.repeats} (MB/s of UTF-8 text); ratio = paraflow / tokenizers")
    print(f"{'':8} {'paraflow 1t':>12} {'tokenizers 1t':>14} {'ratio':>6}   {'paraflow ' + str(threads) + 't':>12} "
          f"{'tokenizers ' + str(threads) + 't':>14} {'ratio':>6}   ids equal")
    for family, p1, pn, h1, hn, tokens, equal in rows:
        print(f"{family:8} {p1:12.2f} {h1:14.2f} {p1 / h1:6.1f}x  {pn:12.2f} {hn:14.2f} {pn / hn:6.1f}x  "
              f"{equal} ({tokens} tokens)")
    shutil.rmtree(work)
    if not same:
        print("ERROR: ids differ between encoders", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
