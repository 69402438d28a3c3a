"""What the peer training benchmarks share (peer_torch.py, peer_tf.py): the GPT or Llama shape
options (train_bench's names and gpt-small defaults), the timing loop and the `key value` report
that compare_peers.py reads."""
import argparse
import resource
import time


def parser(description):
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--steps", type=int, default=10)
    result.add_argument("--warmup", type=int, default=2)
    result.add_argument("--threads", type=int, required=True)
    result.add_argument("--n-layer", type=int, default=6)
    result.add_argument("--n-embd", type=int, default=384)
    result.add_argument("--n-head", type=int, default=6)
    result.add_argument("--n-ctx", type=int, default=256)
    result.add_argument("--vocab", type=int, default=8192)
    result.add_argument("--batch", type=int, default=8)
    result.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    result.add_argument("--n-kv-head", type=int, default=0, help="llama: k/v heads (0: --n-head)")
    result.add_argument("--intermediate", type=int, default=0, help="llama: SwiGLU width (0: 4 * --n-embd)")
    result.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32")
    return result


def llama_sizes(args):
    """(k/v heads, SwiGLU width) of a Llama shape, the defaults filled in."""
    return args.n_kv_head or args.n_head, args.intermediate or 4 * args.n_embd


def measure(step, args, version, parameters):
    """Runs `step` (one full training step, returning when it is done) `warmup` then `steps`
    times and prints the report; the first warm-up step's time includes tracing/compiling."""
    first_step = 0.0
    for i in range(args.warmup):
        start = time.perf_counter()
        step()
        if i == 0:
            first_step = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    print(f"version {version}")
    print(f"parameters {parameters}")
    print(f"tokens_per_s {args.batch * args.n_ctx * args.steps / seconds:.1f}")
    print(f"step_ms {1000 * seconds / args.steps:.1f}")
    print(f"first_step_s {first_step:.2f}")
    print(f"peak_rss_mb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0:.1f}")
