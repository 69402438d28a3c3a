"""The data-parallel scaling model of docs/scaling.md: step time and efficiency of GPT-2 124M and
1.5B on 8 and 64 GPUs, from an alpha-beta model of NCCL's ring and tree all-reduce, with the
gradient dtype, ZeRO-1 and the bucket size as knobs. Prints the table docs/scaling.md shows.

    python3 bench/dist/scaling_model.py [--mfu 0.45] [--tokens-per-gpu 8192]
"""
import argparse
import math

# Assumptions (docs/scaling.md explains them): A100 bf16 dense peak; NCCL all_reduce bus
# bandwidth as NCCL's published nccl-tests give for DGX A100 inside a node (NVSwitch) and
# across nodes (8x200 Gb/s HDR InfiniBand per node); a per-hop latency of 5 us.
PEAK_FLOPS = 312e12
BUS_BANDWIDTH = {8: 230e9, 64: 185e9}
HOP_LATENCY = 5e-6
MODELS = {"GPT-2 124M": 124.4e6, "GPT-2 1.5B": 1.558e9}


def allreduce_seconds(size, p, bucket, algorithm):
    """NCCL all_reduce of `size` bytes in buckets: bandwidth term 2(p-1)/p * size / busbw, plus a
    latency per bucket of 2(p-1) hops (ring) or 2 log2(p) hops (tree)."""
    buckets = math.ceil(size / bucket)
    hops = 2 * (p - 1) if algorithm == "ring" else 2 * math.log2(p)
    return size * 2 * (p - 1) / p / BUS_BANDWIDTH[p] + buckets * hops * HOP_LATENCY


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mfu", type=float, default=0.45)
    parser.add_argument("--tokens-per-gpu", type=int, default=8192)
    args = parser.parse_args()
    print("| model | GPUs | grads | bucket | compute ms | all-reduce ms (ring / tree) | exposed ms | efficiency |"
          " optimizer state per GPU (plain / ZeRO-1) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n in MODELS.items():
        compute = 6 * n * args.tokens_per_gpu / (PEAK_FLOPS * args.mfu)
        backward = compute * 2 / 3
        for p in (8, 64):
            for grad_bytes, label in ((4, "fp32"), (2, "bf16")):
                for bucket in (1e6, 25e6, 200e6):
                    size = n * grad_bytes
                    ring = allreduce_seconds(size, p, bucket, "ring")
                    tree = allreduce_seconds(size, p, bucket, "tree")
                    best = min(ring, tree)
                    # Buckets overlap backward; the last one starts when backward ends.
                    last = allreduce_seconds(min(bucket, size), p, bucket, "tree")
                    exposed = max(0.0, best - backward) + last
                    # Adam moments + fp32 master weights: 12 bytes per parameter, / p with ZeRO-1.
                    state = 12 * n
                    print(f"| {name} | {p} | {label} | {bucket / 1e6:.0f} MB | {compute * 1e3:.1f} | {ring * 1e3:.1f} / "
                          f"{tree * 1e3:.1f} | {exposed * 1e3:.2f} | {compute / (compute + exposed):.3f} | "
                          f"{state / 2**30:.2f} / {state / p / 2**30:.3f} GiB |")


if __name__ == "__main__":
    main()
