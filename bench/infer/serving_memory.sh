#!/bin/sh
# What `paraflow generate` costs in memory on a GPT-2 124M-shaped model (random weights, float32,
# as transformers saves it; no tokenizer: bytes in and out): its peak RSS (/usr/bin/time) less
# the same command's on a near-empty model of the same context, for each --dtype, against the
# weights it decodes with. With BEFORE (another build's binary, e.g. one of a2ff548, which copied
# the file and then converted that copy), that binary's numbers too, in the same run. Best of 3
# runs each (peak RSS varies little; the load average is printed before and after).
#
#     bench/infer/serving_memory.sh [BEFORE]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
after=$root/build/src/cli/paraflow
before=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$root/.venv-ref/bin/python" - "$work" <<'EOF'
import sys, torch, transformers
torch.manual_seed(0)
transformers.GPT2LMHeadModel(transformers.GPT2Config(n_ctx=1024)).eval().save_pretrained(sys.argv[1] + "/gpt2-124m")
transformers.GPT2LMHeadModel(transformers.GPT2Config(n_ctx=1024, n_embd=32, n_layer=1, n_head=2)).save_pretrained(
    sys.argv[1] + "/near-empty")
EOF

isa=$(for flag in amx_tile avx512_bf16 avx512f avx2; do grep -qw "$flag" /proc/cpuinfo && echo "$flag" && break; done)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); ISA: ${isa:-below avx2}"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
weights=$(stat -c %s "$work/gpt2-124m/model.safetensors")

# Peak RSS in KiB of one generate run, the least of 3.
peak() {
  best=
  for run in 1 2 3; do
    env MALLOC_MMAP_THRESHOLD_=131072 OMP_NUM_THREADS=1 /usr/bin/time -o "$work/rss" -f %M \
      "$1" generate --model "$work/$2" --prompt ab --max-tokens 2 --temperature 0 --dtype "$3" > "$work/log" 2>&1 ||
      { cat "$work/log"; exit 1; }
    kib=$(cat "$work/rss")
    if [ -z "$best" ] || [ "$kib" -lt "$best" ]; then best=$kib; fi
  done
  echo "$best"
}

# The KV cache generate sizes for one sequence of the whole context (12 layers, 768 wide, 1024 + 16
# positions; bf16 beside bf16 and q8_0 weights): part of the growth, apart from the weights.
printf '%-8s %-9s %12s %14s %14s %22s\n' binary dtype "growth MiB" "KV cache MiB" "f32 file MiB" "(growth - KV) / file"
for dtype in float32 bfloat16 q8_0; do
  kv_bytes=2
  [ "$dtype" = float32 ] && kv_bytes=4
  kv=$((2 * 12 * 768 * 1040 * kv_bytes))
  for binary in ${before:+"$before"} "$after"; do
    name=after
    [ "$binary" = "$before" ] && name=before
    growth=$(( $(peak "$binary" gpt2-124m "$dtype") - $(peak "$binary" near-empty "$dtype") ))
    awk -v n="$name" -v d="$dtype" -v g="$growth" -v w="$weights" -v kv="$kv" \
      'BEGIN { printf "%-8s %-9s %12.1f %14.1f %14.1f %22.2f\n", n, d, g / 1024, kv / 1048576, w / 1048576, (g * 1024 - kv) / w }'
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
