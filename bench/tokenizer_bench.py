#!/usr/bin/env python3
"""Tokenizer speed, paraflow vs tiktoken vs Hugging Face tokenizers, on GPT-2's vocabulary, in one
run: encode MB/s single-threaded and with all threads, and the time to train an 8k vocabulary.

    .venv-data/bin/python bench/tokenizer_bench.py [--bench build/bench/tokenizer/tokenizer_bench] \
        [--corpus ../shared/data/sotu.jsonl.gz] [--repeats 5]

GPT-2's ranks: .venv-data/assets/gpt2.tiktoken (scripts/setup_python_data.sh). All three encoders
must produce the same ids on the whole corpus; the script checks that before timing.
"""
import argparse
import array
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def median(values):
    return sorted(values)[len(values) // 2]


def timed(fn, repeats):
    """Each run's seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def read_corpus(path):
    """The corpus's documents and their size in MB of UTF-8."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    return texts, sum(len(t.encode("utf-8")) for t in texts) / 1e6


def run_paraflow(bench, corpus, vocab, repeats, train_vocab, *extra):
    """paraflow's tokenizer_bench on the corpus: its JSON report and the ids it encoded."""
    ids_file = tempfile.NamedTemporaryFile(suffix=".ids", delete=False).name
    report = json.loads(subprocess.run([bench, "--corpus", corpus, "--vocab", vocab, "--repeats", str(repeats),
                                        "--train-vocab", str(train_vocab), "--ids-out", ids_file, *extra],
                                       check=True, capture_output=True, text=True).stdout)
    ids = array.array("i")
    with open(ids_file, "rb") as f:
        ids.frombytes(f.read())
    os.unlink(ids_file)
    return report, ids


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench", default=os.path.join(ROOT, "build/bench/tokenizer/tokenizer_bench"))
    p.add_argument("--corpus", default=os.path.join(ROOT, "../shared/data/sotu.jsonl.gz"))
    p.add_argument("--ranks", default=os.path.join(ROOT, ".venv-data/assets/gpt2.tiktoken"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train-vocab", type=int, default=8192)
    args = p.parse_args()

    import tiktoken
    import tokenizers
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, mb = read_corpus(args.corpus)
    threads = os.cpu_count()
    print(f"corpus: {len(texts)} documents, {mb:.2f} MB; {threads} threads; "
          f"tiktoken {tiktoken.__version__}, tokenizers {tokenizers.__version__}", flush=True)

    # paraflow (C++): prints JSON, writes its ids for the comparison below.
    train_dir = tempfile.mkdtemp(prefix="paraflow_tok_bench_")
    ours, our_ids = run_paraflow(args.bench, args.corpus, args.ranks, args.repeats, args.train_vocab,
                                 "--train-out", train_dir)
    print(f"cpu: {ours['cpu']}", flush=True)

    ranks = load_tiktoken_bpe(args.ranks)
    enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    # tokenizers BPE with the same vocabulary: save GPT-2 as HF files via byte-level spelling.
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    spell = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = {"".join(spell[b] for b in token): rank for token, rank in ranks.items()}
    inverse = {rank: token for token, rank in vocab.items()}
    # Merges from tiktoken's ranks: the split of each token that BPE of lower ranks leaves.
    merges = []
    for rank in range(256, len(ranks)):
        token = inverse[rank]
        parts = list(token)
        while len(parts) > 2:
            best = min(((vocab.get(parts[i] + parts[i + 1], 1 << 30), i) for i in range(len(parts) - 1)))
            if best[0] >= rank:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges.append(tuple(parts))
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()

    # Same ids on the whole corpus.
    tik_ids = enc.encode_ordinary_batch(texts)
    hf_ids = [e.ids for e in hf.encode_batch(texts)]
    flat = array.array("i", (i for ids in tik_ids for i in ids))
    same = tik_ids == hf_ids and flat == our_ids
    print(f"ids on the whole corpus ({len(flat)} tokens): paraflow == tiktoken: {flat == our_ids}, "
          f"tiktoken == tokenizers: {tik_ids == hf_ids}", flush=True)

    rows = []
    t1 = timed(lambda: [enc.encode_ordinary(t) for t in texts], args.repeats)
    tn = timed(lambda: enc.encode_ordinary_batch(texts, num_threads=threads), args.repeats)
    rows.append(("tiktoken", mb / median(t1), mb / median(tn)))
    h1 = timed(lambda: [hf.encode(t) for t in texts], max(1, args.repeats // 2))
    hn = timed(lambda: hf.encode_batch(texts), max(1, args.repeats // 2))
    rows.append(("tokenizers", mb / median(h1), mb / median(hn)))
    rows.insert(0, ("paraflow", ours["encode_1thread_MBps_median"], ours["encode_batch_all_threads_MBps_median"]))

    print(f"\nencode, GPT-2 vocabulary, median of {args.repeats} (MB/s of UTF-8 text)")
    print(f"{'':12} {'1 thread':>10} {f'{threads} threads':>12}")
    for name, one, all_ in rows:
        print(f"{name:12} {one:10.2f} {all_:12.2f}")

    # Training: tokenizers' BpeTrainer with GPT-2's pre-tokenizer and byte alphabet.
    trainer = trainers.BpeTrainer(vocab_size=args.train_vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    start = time.perf_counter()
    model.train_from_iterator(texts, trainer=trainer)
    hf_train = time.perf_counter() - start
    print(f"\ntrain {args.train_vocab}-token vocabulary ({threads} threads for word counting in both)")
    print(f"paraflow     {ours['train_total_s']:8.2f} s  ({ours['train_vocab_size']} tokens, "
          f"{ours['train_distinct_words']} distinct words, counting {ours['train_count_words_s']:.2f} s)")
    print(f"tokenizers   {hf_train:8.2f} s  ({model.get_vocab_size()} tokens)")
    # Our trained tokenizer, loaded by tokenizers, gives our ids on the corpus.
    trained = Tokenizer.from_file(os.path.join(train_dir, "tokenizer.json"))
    trained_ids = array.array("i", (i for e in trained.encode_batch(texts) for i in e.ids))
    ours_trained = array.array("i")
    with open(os.path.join(train_dir, "corpus.ids"), "rb") as f:
        ours_trained.frombytes(f.read())
    ours_vocab, hf_vocab = set(trained.get_vocab()), set(model.get_vocab())
    print(f"our 8k tokenizer in tokenizers: same ids on the corpus: {trained_ids == ours_trained} "
          f"({len(ours_trained)} tokens, {mb * 1e6 / len(ours_trained):.2f} bytes/token); "
          f"vocabulary shared with tokenizers' trainer: {len(ours_vocab & hf_vocab)} of {len(ours_vocab)}")
    same = same and trained_ids == ours_trained
    import shutil

    shutil.rmtree(train_dir)
    if not same:
        print("ERROR: ids differ between encoders", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
