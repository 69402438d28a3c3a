"""Generation speed at batch 1: paraflow's KV-cache generator vs transformers' (KV cache,
greedy), on the same export dir, in one run.

    .venv-ref/bin/python bench/infer/compare_generate.py [--tokens 200] [--threads 2]

Makes a gpt-small export (n_layer 6, n_embd 384, vocab 8192, context 256; one training step on
the fortunes corpus so the weights are a real export) unless --model is given.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAFLOW = os.path.join(ROOT, "build/src/cli/paraflow")


def make_export(directory):
    subprocess.run([PARAFLOW, "train", "--config", os.path.join(ROOT, "configs/gpt-small.yaml"), "--set", "train.steps=1",
                    "--set", f"train.out_dir={directory}"], check=True, capture_output=True)
    return os.path.join(directory, "export")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or make_export(tmp)
        prompt = "Fellow citizens"
        out = subprocess.run([PARAFLOW, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(args.tokens),
                              "--temperature", "0"], check=True, capture_output=True, text=True).stderr
        ours = float(re.search(r"([0-9.]+) tokens/s", out).group(1))

        import torch
        import transformers
        torch.set_num_threads(args.threads)
        hf = transformers.GPT2LMHeadModel.from_pretrained(model).eval()
        ids = torch.tensor([[b for b in prompt.encode()]])
        with torch.no_grad():
            past, tokens = None, ids
            start = time.perf_counter()
            for _ in range(args.tokens):
                result = hf(tokens, past_key_values=past, use_cache=True)
                past = result.past_key_values
                tokens = result.logits[:, -1:].argmax(-1)
            theirs = args.tokens / (time.perf_counter() - start)
    print(f"threads {args.threads}, batch 1, {args.tokens} new tokens, greedy")
    print(f"paraflow                     {ours:8.1f} tokens/s")
    print(f"transformers {transformers.__version__} (torch {torch.__version__}) {theirs:8.1f} tokens/s")
    print(f"ratio paraflow/transformers  {ours / theirs:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
