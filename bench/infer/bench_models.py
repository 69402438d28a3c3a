"""The random-weight models the decode and serving benchmarks share (bench/infer/compare_decode.py,
bench/serve/compare_servers.py, bench/serve/predict_batching_bench.py): where each lives under
bench/.cache/, the script that makes it, its GGUF files for llama.cpp, and its shape as the
benchmarks need it (layers, the KV cache's width, context, vocabulary, the bytes of weights a
decode step reads), for GPT-2's and the Llama family's config.json alike.

Models:
  - gpt-small: configs/gpt-small.yaml's shape (6 layers, 384 wide, 6 heads, context 256,
    vocabulary 8192), bench/serve/make_gpt_small.py;
  - gpt2-124m: GPT-2 124M's shape, bench/infer/make_gpt2_124m.py;
  - qwen2.5-0.5b: Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, intermediate
    4864, vocabulary 151936, tied), bench/infer/make_qwen2_0_5b.py.
"""
import json
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, "bench/.cache")
GGUF_PYTHON = os.path.join(CACHE, "venv-gguf/bin/python")
GGUF_OUTTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
MODELS = {
    "gpt-small": {"dir": os.path.join(CACHE, "gpt-small-random"), "maker": os.path.join(ROOT, "bench/serve/make_gpt_small.py")},
    "gpt2-124m": {"dir": os.path.join(CACHE, "gpt2-124m-random"), "maker": os.path.join(ROOT, "bench/infer/make_gpt2_124m.py")},
    "qwen2.5-0.5b": {"dir": os.path.join(CACHE, "qwen2.5-0.5b-random"),
                     "maker": os.path.join(ROOT, "bench/infer/make_qwen2_0_5b.py")},
}
ISA_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8"]


def cpu_description():
    """This machine's CPU model and the vector ISA flags that decide the kernels' speed."""
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1)
    flags = set(re.search(r"^flags\s*:\s*(.*)$", info, re.M).group(1).split())
    return model, [flag for flag in ISA_FLAGS if flag in flags]


def ensure_model(name, ref_python):
    """The model's Hugging Face dir (made on first use with `ref_python`, else venv-gguf's Python:
    both have torch and transformers) and its config.json."""
    directory = MODELS[name]["dir"]
    if not os.path.exists(os.path.join(directory, "config.json")):
        python = ref_python if os.path.exists(ref_python) else GGUF_PYTHON
        subprocess.run([python, MODELS[name]["maker"], directory], check=True)
    with open(os.path.join(directory, "config.json")) as f:
        return directory, json.load(f)


def ensure_gguf(llama_src, model_dir, dtype):
    """model_dir's GGUF at `dtype` (float32, bfloat16, float16), made on first use by llama.cpp's own
    convert_hf_to_gguf.py through bench/serve/convert_gguf.py."""
    outtype = GGUF_OUTTYPE[dtype]
    path = os.path.join(model_dir, f"gguf/model-{outtype}.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        done = subprocess.run([GGUF_PYTHON, os.path.join(ROOT, "bench/serve/convert_gguf.py"), llama_src, model_dir,
                               "--outtype", outtype, "--outfile", path], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"convert_hf_to_gguf.py failed on {model_dir} ({outtype}):\n{done.stderr[-3000:]}")
    return path


GGUF_READ = ("q8_0", "q4_k")  # the dtypes paraflow decodes from the GGUF file itself


def ensure_ggufs(model_dir, llama_src, dtypes, paraflow_bin):
    """model_dir's GGUF files at `dtypes`: float ones by llama.cpp's converter (ensure_gguf), the Q8_0
    one of GPT-2 by gguf-py's quantizer (tests/reference/gguf_files.py), the others by `paraflow
    quantize` (gguf-py has no Q4_K quantizer); both engines read these same files."""
    ggufs = {}
    for dtype in dtypes:
        if dtype not in GGUF_READ:
            ggufs[dtype] = ensure_gguf(llama_src, model_dir, dtype)
            continue
        ggufs[dtype] = os.path.join(model_dir, f"gguf/model-{dtype}.gguf")
        if os.path.exists(ggufs[dtype]):
            continue
        os.makedirs(os.path.dirname(ggufs[dtype]), exist_ok=True)
        with open(os.path.join(model_dir, "config.json")) as f:
            gpt2 = json.load(f).get("model_type") == "gpt2"
        if dtype == "q8_0" and gpt2:
            command = [os.path.join(ROOT, ".venv-data/bin/python"), os.path.join(ROOT, "tests/reference/gguf_files.py"), "convert", model_dir, ggufs[dtype]]
        else:  # e.g. Qwen2.5-0.5B's q4_k: its rows of 896 are not whole super-blocks of 256, Q5_0 (paraflow says which)
            command = [paraflow_bin, "quantize", "--model", model_dir, "--type", dtype, "--out", ggufs[dtype]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"making the {dtype} GGUF of {model_dir} failed: {done.stderr.strip()[-2000:]}")
    return ggufs


class Shape:
    """What the benchmarks need of a config.json, GPT-2's keys or the Llama family's."""

    def __init__(self, config):
        if config.get("model_type") == "gpt2":
            self.layers, self.width = config["n_layer"], config["n_embd"]
            self.kv_width = self.width
            self.context = config["n_positions"]
        else:
            self.layers, self.width = config["num_hidden_layers"], config["hidden_size"]
            heads = config["num_attention_heads"]
            head_dim = config.get("head_dim") or self.width // heads
            self.kv_width = config.get("num_key_value_heads", heads) * head_dim
            self.context = config["max_position_embeddings"]
        self.vocab = config["vocab_size"]

    def kv_bytes_per_token(self, element_bytes=4):
        return 2 * self.layers * self.kv_width * element_bytes

    def __str__(self):
        kv = f", KV width {self.kv_width}" if self.kv_width != self.width else ""
        return f"{self.layers} layers, {self.width} wide{kv}, vocabulary {self.vocab}"


def weight_bytes_per_token(model_dir):
    """Bytes of weights one decode step reads, per dtype: every tensor but the position table (one
    row is looked up) and an untied input embedding (one row too); a tied embedding once (as the
    head); matrices at the dtype's width (Q8_0's and Q4_K's packed blocks; for q4_k, a matrix whose
    input features are not whole 256-value super-blocks at Q5_0's, as both engines fall back),
    vectors (biases, norms) in float32 as both engines keep them."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    untied = any(name.endswith("lm_head.weight") for name in header)
    matrix = vector = q4_k_bytes = 0
    for name, tensor in header.items():
        if name.endswith("wpe.weight") or (untied and name.endswith(("wte.weight", "embed_tokens.weight"))):
            continue
        count = 1
        for size in tensor["shape"]:
            count *= size
        if len(tensor["shape"]) == 2:
            matrix += count
            conv1d = name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))  # GPT-2's [in, out]
            in_features = tensor["shape"][0 if conv1d else 1]
            q4_k_bytes += count * 144 // 256 if in_features % 256 == 0 else count * 22 // 32  # Q4_K, else Q5_0
        else:
            vector += count
    return {"float32": 4 * (matrix + vector), "bfloat16": 2 * matrix + 4 * vector, "float16": 2 * matrix + 4 * vector,
            "q8_0": matrix * 34 // 32 + 4 * vector,  # Q8_0: 34 bytes per block of 32
            "q4_k": q4_k_bytes + 4 * vector}  # Q4_K: 144 bytes per super-block of 256; Q5_0: 22 per 32
