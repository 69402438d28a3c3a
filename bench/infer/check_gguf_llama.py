"""Llama-family GGUF files written by `paraflow quantize`, checked with llama.cpp's own tools (issue
#48): llama-bench loads each file (-p 0 -n 8), and llama-server's greedy completion of a prompt is
the one `paraflow generate --temperature 0 --dtype float32` prints from the same file (each engine
tokenizing the prompt and detokenizing the output through the file's tokenizer.ggml.*). A bench-side check, not a unit test: llama.cpp is built only for the
benchmarks (bench/infer/build_llama_cpp.sh).

    .venv-ref/bin/python bench/infer/check_gguf_llama.py [--tokens 24] [--threads 2] [--types f32,q8_0,q4_k]
        [--hidden-size 256]

--hidden-size 192 makes rows that are not whole 256-value super-blocks: q4_k files are then Q5_0
but for the MLP's down projection (rows of 512), as llama-quantize writes them.

Models (random weights, 7.5x transformers' initial scale (0.15) so the greedy path has no near-ties; made
with transformers under .venv-ref): a Llama with grouped k/v heads (GGUF architecture `llama`:
the q/k rows are permuted for GGML's RoPE) and a Llama 2-style SentencePiece tokenizer (byte
fallback; tokenizer.ggml.model llama), and a Qwen2 (q/k/v biases, tied head) with a Qwen2-style
byte-level BPE (tokenizer.ggml.pre qwen2); both tokenizers trained on licence texts by
tests/reference/tokenizer_family_oracle.py under .venv-data. Exits 1 when a check fails.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PARAFLOW = os.path.join(ROOT, "build/src/cli/paraflow")
LLAMA_BIN = os.path.join(ROOT, "bench/.cache/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
DATA_PYTHON = os.path.join(ROOT, ".venv-data/bin/python")
PROMPT = "The licensee may copy and distribute the Program"
FAMILIES = {  # model_type, tokenizer family, transformers config
    "llama": ("llama", "llama2", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen2": ("qwen2", "qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
}


def make_model(directory, name, hidden_size):
    import torch
    import transformers
    model_type, family, extra = FAMILIES[name]
    subprocess.run([DATA_PYTHON, os.path.join(ROOT, "tests/reference/tokenizer_family_oracle.py"), "build", "--family",
                    family, "--vocab-size", "2000", "--out", directory, "--train", "/usr/share/common-licenses/GPL-2",
                    "/usr/share/common-licenses/Apache-2.0"], check=True)
    vocab = json.load(open(os.path.join(directory, "tokenizer.json")))
    vocab_size = max(list(vocab["model"]["vocab"].values()) + [t["id"] for t in vocab["added_tokens"]]) + 1
    config = transformers.AutoConfig.for_model(model_type, vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=512,
                                               num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
                                               rms_norm_eps=1e-6, initializer_range=0.15, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # norms and biases away from 1 and 0, as a trained model's are
        for parameter_name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(directory, safe_serialization=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def llama_server_completion(gguf, threads, tokens):
    """(prompt token count, continuation text) from llama-server, greedy."""
    port = free_port()
    server = subprocess.Popen([os.path.join(LLAMA_BIN, "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port",
                               str(port), "-t", str(threads), "-c", "256", "-np", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("llama-server did not become healthy")
        ids = post(url + "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
        result = post(url + "/completion", {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "top_k": 1,
                                            "cache_prompt": False, "ignore_eos": True})
        return len(ids), result["content"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--types", default="f32,q8_0")
    parser.add_argument("--hidden-size", type=int, default=256, help="4 heads of hidden-size / 4")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    failed = False
    work = tempfile.mkdtemp(prefix="check_gguf_llama-")
    try:
        for name in FAMILIES:
            directory = os.path.join(work, name)
            make_model(directory, name, args.hidden_size)
            for gguf_type in args.types.split(","):
                gguf = os.path.join(work, f"{name}-{gguf_type}.gguf")
                subprocess.run([PARAFLOW, "quantize", "--model", directory, "--type", gguf_type, "--out", gguf],
                               check=True, capture_output=True)
                bench = subprocess.run([os.path.join(LLAMA_BIN, "llama-bench"), "-m", gguf, "-p", "0", "-n", "8", "-t",
                                        str(args.threads), "-o", "json"], capture_output=True, text=True)
                loaded = bench.returncode == 0
                speed = json.loads(bench.stdout)[0]["avg_ts"] if loaded else float("nan")
                ids, theirs = llama_server_completion(gguf, args.threads, args.tokens)
                print(f"{name} {gguf_type}: llama-bench {'loads it' if loaded else 'FAILED: ' + bench.stderr[-300:]}"
                      f" ({speed:.0f} tokens/s); prompt of {ids} tokens\n  llama-server:           {theirs!r}")
                failed |= not loaded
                # F32 files in float32; Q8_0 and Q4_K files also as llama.cpp computes them (--dtype
                # q8_0 or q4_k: the packed weights times activations quantized per row), which must
                # agree; float32 on the dequantized weights is shown beside it.
                for dtype in ["float32"] + ([gguf_type] if gguf_type in ("q8_0", "q4_k") else []):
                    printed = subprocess.run([PARAFLOW, "generate", "--model", gguf, "--prompt", PROMPT, "--max-tokens",
                                              str(args.tokens), "--temperature", "0", "--dtype", dtype],
                                             capture_output=True, text=True, check=True,
                                             env=dict(os.environ, OMP_NUM_THREADS=str(args.threads))).stdout
                    ours = printed[len(PROMPT):-1]  # generate ends its output with a newline
                    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
                    same = ours == theirs
                    if dtype == gguf_type.replace("f32", "float32"):
                        failed |= not same
                    print(f"  paraflow --dtype {dtype:7s}: {ours!r}\n    {'equal' if same else f'DIFFERENT after {agree} characters'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load after: {os.getloadavg()}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
