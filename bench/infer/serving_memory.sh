#!/bin/sh
# What `paraflow generate` costs in memory on a GPT-2 124M-shaped model (random weights, float32,
# as transformers saves it; no tokenizer: bytes in and out): its peak RSS (/usr/bin/time) less
# the same command's on a near-empty model of the same context, for each --dtype, against the
# weights it decodes with. With BEFORE (another build's binary, e.g. one of a2ff548, which copied
# the file and then converted that copy), that binary's numbers too, in the same run. Best of 3
# runs each (peak RSS varies little; the load average is printed before and after). Then a
# Qwen2.5-0.5B-shaped model as transformers saves it in bf16 (q, k and v apart, names sorted; a
# 1024-position context) decoded in bfloat16 and q8_0, and with GGUF=FILE a GGUF file decoded in
# its own type (e.g. bench/.cache/qwen2.5-0.5b-random/gguf/model-q8_0.gguf, which
# bench/infer/compare_decode.py writes), against that file's near-empty twin: peak RSS only.
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
def qwen(name, **shape):
    config = transformers.Qwen2Config(max_position_embeddings=1024, tie_word_embeddings=True, **shape)
    transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1] + "/" + name)
qwen("qwen-0.5b", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
     num_attention_heads=14, num_key_value_heads=2)
qwen("qwen-near-empty", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
     num_attention_heads=2, num_key_value_heads=1)
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

# The Qwen2 shape in bf16: growth over the near-empty twin, against the file. Decoding reads the
# matrices in --dtype and the token embedding table in f32 (151936 x 896: 519.3 MiB).
printf '\n%-8s %-22s %-9s %12s %14s\n' binary file dtype "growth MiB" "file MiB"
for dtype in bfloat16 q8_0; do
  for binary in ${before:+"$before"} "$after"; do
    name=after
    [ "$binary" = "$before" ] && name=before
    growth=$(( $(peak "$binary" qwen-0.5b "$dtype") - $(peak "$binary" qwen-near-empty "$dtype") ))
    awk -v n="$name" -v d="$dtype" -v g="$growth" -v w="$(stat -c %s "$work/qwen-0.5b/model.safetensors")" \
      'BEGIN { printf "%-8s %-22s %-9s %12.1f %14.1f\n", n, "bf16 safetensors", d, g / 1024, w / 1048576 }'
  done
done
if [ -n "${GGUF:-}" ]; then
  type=$(basename "$GGUF" .gguf | sed 's/.*-//')
  for binary in ${before:+"$before"} "$after"; do
    name=after
    [ "$binary" = "$before" ] && name=before
    cp "$GGUF" "$work/model.gguf"
    kib=$(peak "$binary" model.gguf "$type")
    awk -v n="$name" -v d="$type" -v k="$kib" -v w="$(stat -c %s "$GGUF")" \
      'BEGIN { printf "%-8s %-22s %-9s %12s %14.1f   peak RSS %.1f MiB\n", n, "GGUF", d, "-", w / 1048576, k / 1024 }'
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
