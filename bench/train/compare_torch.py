"""gpt-small training throughput: paraflow vs PyTorch eager on the CPU, in one run.

    .venv-ref/bin/python bench/train/compare_torch.py [--steps 10] [--threads 2]

Runs build/bench/train/train_bench (paraflow), then the same model (transformers'
GPT2LMHeadModel, float32, AdamW) in PyTorch eager with the same threads and its best setting on
these machines (OMP_WAIT_POLICY=PASSIVE, set before torch loads), and prints tokens/s for both,
the ratio, paraflow's MFU, and the peak RSS of each.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_paraflow(args):
    out = subprocess.run([os.path.join(ROOT, "build/bench/train/train_bench"), "--steps", str(args.steps)],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(args.threads))).stdout
    return dict(line.split(" ", 1) for line in out.strip().splitlines())


def run_torch(args):
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    import torch
    import transformers
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=8192, n_positions=256, n_embd=384, n_layer=6, n_head=6,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = 8, 256

    def step():
        x = torch.randint(0, 8192, (B, T))
        y = torch.randint(0, 8192, (B, T))
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 8192), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return torch.__version__, B * T * args.steps / seconds, rss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    ours = run_paraflow(args)
    version, torch_tps, torch_rss = run_torch(args)
    ours_tps = float(ours["tokens_per_s"])
    print(f"threads                 {args.threads}")
    print(f"sgemm peak (2048^3)     openblas {ours['sgemm_gflops_openblas']} GFLOP/s, "
          f"onednn {ours['sgemm_gflops_onednn']} GFLOP/s")
    print(f"paraflow ({ours['gemm_engine']})       {ours_tps:8.1f} tokens/s   MFU {100 * float(ours['mfu']):.1f}%   "
          f"peak RSS {float(ours['peak_rss_mb']):.0f} MB")
    print(f"PyTorch {version} eager {torch_tps:8.1f} tokens/s   peak RSS {torch_rss:.0f} MB   (OMP_WAIT_POLICY=PASSIVE)")
    print(f"ratio paraflow/PyTorch  {ours_tps / torch_tps:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
