"""GPT and Llama training throughput on the CPU: paraflow against PyTorch and TensorFlow/Keras, in one run.

    python3 bench/train/compare_peers.py [--shape small|124m|llama-small] [--steps 10] [--warmup 2] [--threads N]
                                         [--batch B] [--only paraflow,torch,tf]

Same model (GPT-2, tied lm_head, no dropout; or llama-small: a Llama with grouped k/v heads, SwiGLU,
an untied lm_head), AdamW(6e-4, betas 0.9/0.95, wd 0.1), clipping at
1.0, random tokens and threads for every engine. Runs, one process each:
  paraflow  build/bench/train/train_bench, --precision float32 and mixed_bfloat16
  torch     bench/train/peer_torch.py in .venv-ref (Debian's torch 1.13): eager float32, bf16 autocast
  tf        bench/train/peer_tf.py in .venv-data (tensorflow-cpu 2.20, Keras 3): float32 with XLA,
            mixed_bfloat16 without and with XLA
First it prints the CPU, and the ISA and oneDNN implementations paraflow's matmuls get (one
train_bench step under ONEDNN_VERBOSE=1). Then one table: tokens/s of each, the ratio of
paraflow mixed_bfloat16 (and float32) to each, the parameter counts (which must all match), and
paraflow's MFU. The driver itself only starts processes: any python3 runs it.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "bench", "train")
SHAPES = {
    "small": {"n-layer": 6, "n-embd": 384, "n-head": 6, "n-ctx": 256, "vocab": 8192, "batch": 8},
    "124m": {"n-layer": 12, "n-embd": 768, "n-head": 12, "n-ctx": 1024, "vocab": 50257, "batch": 1},
    # gpt-small's width in the Llama family's shape: grouped-query attention (6 q heads, 2 k/v),
    # SwiGLU of 1024 (about 4·C·2/3, as Llama sizes it), an untied head.
    "llama-small": {"arch": "llama", "n-layer": 6, "n-embd": 384, "n-head": 6, "n-kv-head": 2, "intermediate": 1024,
                    "n-ctx": 256, "vocab": 8192, "batch": 8},
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (XLA compiles in the first)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--batch", type=int, help="sequences per step (default: the shape's)")
    parser.add_argument("--only", default="paraflow,torch,tf", help="comma list of engines")
    parser.add_argument("--paraflow-bin", default=os.path.join(ROOT, "build/bench/train/train_bench"))
    parser.add_argument("--torch-python", default=os.path.join(ROOT, ".venv-ref/bin/python"))
    parser.add_argument("--tf-python", default=os.path.join(ROOT, ".venv-data/bin/python"))
    return parser.parse_args()


def shape_options(args):
    shape = dict(SHAPES[args.shape], batch=args.batch or SHAPES[args.shape]["batch"])
    return [f"--{key}={value}" for key, value in shape.items()]


def runs(args):
    """(engine, mode, command) of every measured process."""
    common = [f"--steps={args.steps}", f"--warmup={args.warmup}"] + shape_options(args)
    torch = [args.torch_python, os.path.join(HERE, "peer_torch.py"), f"--threads={args.threads}"] + common
    tf = [args.tf_python, os.path.join(HERE, "peer_tf.py"), f"--threads={args.threads}"] + common
    return [
        ("paraflow", "float32", [args.paraflow_bin, "--precision=float32"] + common),
        ("paraflow", "mixed_bfloat16", [args.paraflow_bin, "--precision=mixed_bfloat16"] + common),
        ("torch", "float32 eager", torch + ["--precision=float32"]),
        ("torch", "bf16 autocast", torch + ["--precision=mixed_bfloat16"]),
        ("tf", "float32 XLA", tf + ["--precision=float32", "--xla"]),
        ("tf", "mixed_bfloat16", tf + ["--precision=mixed_bfloat16"]),
        ("tf", "mixed_bfloat16 XLA", tf + ["--precision=mixed_bfloat16", "--xla"]),
    ]


def environment(args, **extra):
    return dict(os.environ, OMP_NUM_THREADS=str(args.threads), **extra)


def cpu_model():
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def print_onednn(args):
    """One paraflow mixed_bfloat16 step (and its sgemm peak probe) under ONEDNN_VERBOSE=1 (oneDNN
    2.6 reads DNNL_VERBOSE too): the ISA oneDNN dispatches to, and each primitive's
    implementations by source data type. oneDNN 2.6 logs primitives only, not its dnnl_sgemm
    function (paraflow's GEMMs without a fused bias)."""
    command = [args.paraflow_bin, "--precision=mixed_bfloat16", "--steps=1", "--warmup=0"] + shape_options(args)
    result = subprocess.run(command, capture_output=True, text=True,
                            env=environment(args, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1"))
    implementations = {}
    for line in result.stdout.splitlines():
        fields = line.split(",")
        if fields[0] not in ("onednn_verbose", "dnnl_verbose") or len(fields) < 4:
            continue
        if fields[1] == "info" and fields[3].startswith("isa:"):
            print(f"oneDNN ISA (paraflow)   {fields[3][4:]}")
        elif fields[1] == "exec" and len(fields) > 6:
            src = next((word for word in fields[6].split() if word.startswith("src_")), "src_?:")
            key = f"{fields[3]} {src[4:].split(':')[0]}"
            implementations.setdefault(key, set()).add(fields[4])
    if result.returncode:
        print(f"oneDNN probe failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    for dtype in ("f32", "bf16"):
        found = {key: impls for key, impls in implementations.items() if key.endswith(" " + dtype)}
        text = "; ".join(f"{key.split()[0]} {', '.join(sorted(impls))}" for key, impls in sorted(found.items()))
        print(f"oneDNN {dtype + ' primitives':16} {text or 'none'}")
    print("                        (primitives only: oneDNN 2.6 does not log dnnl_sgemm calls)")


def measure(args, engine, mode, command):
    result = subprocess.run(command, capture_output=True, text=True, env=environment(args))
    if result.returncode:
        print(f"{engine} {mode} failed ({result.returncode}): {result.stderr.strip()[-1000:]}", file=sys.stderr)
        return None
    return dict(line.split(" ", 1) for line in result.stdout.strip().splitlines() if " " in line)


def main():
    args = parse_args()
    engines = args.only.split(",")
    selected = [run for run in runs(args) if run[0] in engines]
    missing = sorted({command[0] for _, _, command in selected if not os.path.exists(command[0])})
    if missing:
        sys.exit(f"not found: {', '.join(missing)} (see --paraflow-bin, --torch-python, --tf-python)")
    print(f"CPU                     {cpu_model()}")
    print(f"threads                 {args.threads}")
    print(f"shape                   {args.shape}: {' '.join(shape_options(args))}")
    if "paraflow" in engines:
        print_onednn(args)
    results = []
    for engine, mode, command in selected:
        report = measure(args, engine, mode, command)
        if report:
            results.append((engine, mode, report))
            if engine == "torch" and mode == "float32 eager":
                print(f"PyTorch ISA             {report['isa']}")
            if engine == "paraflow":
                bf16 = (f"; {100 * float(report['mfu_bf16_peak']):.1f}% of the bf16 GEMM peak "
                        f"({report['bf16_gemm_gflops_onednn']} GFLOP/s)" if "mfu_bf16_peak" in report else "")
                print(f"paraflow {mode:14} GEMMs in {report['gemm_dtype']}: MFU {100 * float(report['mfu']):.1f}% of "
                      f"the f32 sgemm peak (openblas {report['sgemm_gflops_openblas']}, onednn "
                      f"{report['sgemm_gflops_onednn']}, onednn_matmul {report['sgemm_gflops_onednn_matmul']} "
                      f"GFLOP/s){bf16}, gemm engine {report['gemm_engine']}")
    speed = {(engine, mode): float(report["tokens_per_s"]) for engine, mode, report in results}
    ours_bf16 = speed.get(("paraflow", "mixed_bfloat16"))
    ours_f32 = speed.get(("paraflow", "float32"))

    def ratio(ours, theirs):
        return f"{ours / theirs:.2f}x" if ours else "-"

    print()
    print(f"{'engine':9} {'mode':19} {'version':26} {'parameters':>11} {'tokens/s':>9} {'step ms':>8} "
          f"{'1st step s':>10} {'peak RSS MB':>11} {'pf bf16 /':>9} {'pf f32 /':>9}")
    for engine, mode, report in results:
        version = report.get("version", "")
        first = report.get("first_step_s", "-")
        print(f"{engine:9} {mode:19} {version[:26]:26} {report['parameters']:>11} {speed[engine, mode]:9.1f} "
              f"{float(report['step_ms']):8.1f} {first:>10} {float(report['peak_rss_mb']):11.0f} "
              f"{ratio(ours_bf16, speed[engine, mode]):>9} {ratio(ours_f32, speed[engine, mode]):>9}")
    if len({report["parameters"] for _, _, report in results}) > 1:
        print("WARNING: the parameter counts differ: the models are not the same")
    peers = [(value, engine, mode) for (engine, mode), value in speed.items() if engine != "paraflow"]
    if peers:
        fastest, engine, mode = max(peers)
        print(f"\nfastest peer: {engine} {mode}, {fastest:.1f} tokens/s; paraflow mixed_bfloat16 / fastest peer "
              f"{ratio(ours_bf16, fastest)}, paraflow float32 / fastest peer {ratio(ours_f32, fastest)}")
    return 0 if len(results) == len(selected) else 1


if __name__ == "__main__":
    sys.exit(main())
