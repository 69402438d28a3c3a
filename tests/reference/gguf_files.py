"""GGUF files as llama.cpp's gguf-py writes and reads them: the oracle of tests/model/gguf_test.cc.
Runs in .venv-data (scripts/setup_python_data.sh).

    gguf_files.py write DIR
        writes DIR/written.gguf with gguf.GGUFWriter (metadata of every value type, arrays of
        numbers and of strings, a custom alignment; tensors in F32, F16, BF16, Q8_0 and Q5_0,
        quantized by gguf.quants, and Q4_K, random blocks with small finite d and dmin: gguf.quants has no Q4_K
        quantizer) and DIR/expected.json: each key's GGUF type name and value, and each
        tensor's row-major shape, ggml type and values (f32 as numbers, raw bytes as hex).
    gguf_files.py convert HF_DIR OUT.gguf [DEQUANTIZED_DIR]
        a Hugging Face GPT-2 dir (config.json, model.safetensors with GPT2Model's names) as
        llama.cpp's convert_hf_to_gguf.py writes it with --outtype q8_0: gpt2.* metadata, llama.cpp's
        tensor names, Conv1D weights transposed to [out, in], matrices in Q8_0 (gguf.quants), vectors
        in F32, the tied head written out as output.weight, GPT-2's tokenizer (vocab.json and
        merges.txt) as tokenizer.ggml.*; and DEQUANTIZED_DIR (when given), the same Hugging Face
        dir with every tensor the file's values (gguf.quants.dequantize). bench/infer/compare_decode.py
        makes the Q8_0 file both engines read with it.
    gguf_files.py convert-f32 HF_DIR OUT.gguf
        the same with every tensor in F32 (llama.cpp's `--outtype f32`): the float baseline of the
        perplexities in bench/RESULTS.md's #48 section.
    gguf_files.py dequantize FILE.gguf OUT_DIR
        reads FILE with gguf.GGUFReader and writes each tensor's values, gguf.quants.dequantize'd,
        as OUT_DIR/NAME.f32 (raw little-endian, row-major), and OUT_DIR/types.json: each tensor's
        ggml type name.
    gguf_files.py compare OURS.gguf THEIRS.gguf [--tensors-only]
        reads both with gguf.GGUFReader: every key THEIRS holds (but GGUF.*) must be in OURS with the
        same type and value, and both must hold the same tensors (names, types, shapes, bytes);
        exits 1 naming the first difference. With --tensors-only (after the files) the tensors alone:
        bench/RESULTS.md's check that `paraflow quantize --type q4_k` writes llama-quantize's blocks.
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants

from gguf_compare import compare_gguf


def convert(hf_dir, out, dequantized_dir, quantize_matrices=True):
    import os
    import shutil
    from safetensors.numpy import load_file, save_file
    config = json.load(open(f"{hf_dir}/config.json"))
    weights = {k.removeprefix("transformer."): v for k, v in load_file(f"{hf_dir}/model.safetensors").items()}
    writer = GGUFWriter(out, arch="gpt2")
    writer.add_context_length(config["n_positions"])
    writer.add_embedding_length(config["n_embd"])
    writer.add_feed_forward_length(4 * config["n_embd"])
    writer.add_block_count(config["n_layer"])
    writer.add_head_count(config["n_head"])
    writer.add_layer_norm_eps(config.get("layer_norm_epsilon", 1e-5))
    names = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
             "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for layer in range(config["n_layer"]):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"h.{layer}.{ours}.{kind}"] = f"blk.{layer}.{theirs}.{kind}"

    def add(name, values):
        if values.ndim == 2 and quantize_matrices:
            blocks = quants.quantize(values, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q8_0)
            return quants.dequantize(blocks, GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, values)
        return values

    dequantized = {}
    for ours, values in weights.items():
        values = values.astype(np.float32)
        conv1d = ours.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        if conv1d:
            values = np.ascontiguousarray(values.T)  # Conv1D [in, out] -> [out, in]
        back = add(names[ours], values)
        dequantized[ours] = np.ascontiguousarray(back.T if conv1d else back)
    add("output.weight", weights["wte.weight"].astype(np.float32))
    if os.path.exists(f"{hf_dir}/vocab.json"):  # the tokenizer, as the converter's gpt2 vocab writes it
        vocab = json.load(open(f"{hf_dir}/vocab.json"))
        tokens = sorted(vocab, key=vocab.get)
        merges = [line for line in open(f"{hf_dir}/merges.txt", encoding="utf-8").read().split("\n")
                  if line and not line.startswith("#version")]
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list(tokens)
        writer.add_token_merges(merges)
        writer.add_token_types([3 if token == "<|endoftext|>" else 1 for token in tokens])
    if dequantized_dir is not None:
        os.makedirs(dequantized_dir, exist_ok=True)
        shutil.copy(f"{hf_dir}/config.json", dequantized_dir)
        save_file(dequantized, f"{dequantized_dir}/model.safetensors", metadata={"format": "pt"})
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def compare(ours_path, theirs_path, tensors_only=False):
    _, keys, tensors = compare_gguf(ours_path, theirs_path, tensors_only=tensors_only)
    keys = "no keys compared" if tensors_only else f"{keys} keys"
    print(f"{ours_path}: {keys} and {tensors} tensors as in {theirs_path}")


def dequantize(path, out_dir):
    from gguf import GGUFReader
    types = {}
    for tensor in GGUFReader(path).tensors:
        types[tensor.name] = tensor.tensor_type.name
        quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).astype("<f4").tofile(f"{out_dir}/{tensor.name}.f32")
    with open(f"{out_dir}/types.json", "w") as f:
        json.dump(types, f)


def main():
    action, out_dir = sys.argv[1:3]
    if action == "dequantize":
        dequantize(out_dir, sys.argv[3])
        return
    if action == "compare":
        compare(out_dir, sys.argv[3], tensors_only="--tensors-only" in sys.argv[4:])
        return
    if action == "convert":
        convert(out_dir, sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        return
    if action == "convert-f32":
        convert(out_dir, sys.argv[3], None, quantize_matrices=False)
        return
    assert action == "write"
    rng = np.random.default_rng(7)
    writer = GGUFWriter(f"{out_dir}/written.gguf", arch="gpt2")
    writer.add_custom_alignment(64)
    scalars = [
        ("test.u8", 200, GGUFValueType.UINT8), ("test.i8", -100, GGUFValueType.INT8),
        ("test.u16", 60000, GGUFValueType.UINT16), ("test.i16", -30000, GGUFValueType.INT16),
        ("test.u32", 4000000000, GGUFValueType.UINT32), ("test.i32", -2000000000, GGUFValueType.INT32),
        ("test.f32", 0.15625, GGUFValueType.FLOAT32), ("test.bool", True, GGUFValueType.BOOL),
        ("test.string", "héllo wörld", GGUFValueType.STRING), ("test.u64", 2**63 + 5, GGUFValueType.UINT64),
        ("test.i64", -2**62, GGUFValueType.INT64), ("test.f64", 1.0 / 3.0, GGUFValueType.FLOAT64),
    ]
    expected = {"metadata": {}, "tensors": {}}
    for key, value, vtype in scalars:
        writer.add_key_value(key, value, vtype)
        expected["metadata"][key] = {"type": vtype.name.lower(), "value": value}
    writer.add_array("test.ints", [3, -1, 4, 1, -5])
    expected["metadata"]["test.ints"] = {"type": "array", "element": "int32", "value": [3, -1, 4, 1, -5]}
    writer.add_array("test.strings", ["a", "", "Ġthe", "<|endoftext|>"])
    expected["metadata"]["test.strings"] = {"type": "array", "element": "string", "value": ["a", "", "Ġthe", "<|endoftext|>"]}

    def add(name, values, ggml_type):
        record = {"shape": list(values.shape), "type": ggml_type}
        if ggml_type == "F32":
            writer.add_tensor(name, values)
            record["values"] = values.ravel().tolist()
        elif ggml_type == "F16":
            half = values.astype(np.float16)
            writer.add_tensor(name, half)
            record["values"] = half.astype(np.float32).ravel().tolist()
        elif ggml_type == "BF16":
            bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncated: exact bf16 values
            writer.add_tensor(name, bits, raw_shape=values.shape, raw_dtype=GGMLQuantizationType.BF16)
            record["values"] = (bits.astype(np.uint32) << 16).view(np.float32).ravel().tolist()
        elif ggml_type == "Q4_K":
            blocks = rng.integers(0, 256, size=(values.shape[0], values.shape[1] // 256 * 144), dtype=np.uint8)
            super_blocks = blocks.reshape(-1, 144)
            d_and_dmin = (rng.random((super_blocks.shape[0], 2)) * 0.1).astype(np.float16)
            super_blocks[:, :4] = d_and_dmin.view(np.uint8).reshape(-1, 4)
            writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q4_K)
            record["bytes"] = blocks.tobytes().hex()
            record["values"] = quants.dequantize(blocks, GGMLQuantizationType.Q4_K).ravel().tolist()
        else:  # Q8_0 or Q5_0, by gguf.quants
            qtype = GGMLQuantizationType[ggml_type]
            blocks = quants.quantize(values, qtype)
            writer.add_tensor(name, blocks, raw_dtype=qtype)
            record["bytes"] = blocks.tobytes().hex()
            record["values"] = quants.dequantize(blocks, qtype).ravel().tolist()
        expected["tensors"][name] = record

    add("vector", rng.standard_normal(7).astype(np.float32), "F32")
    add("matrix.f16", rng.standard_normal((3, 5)).astype(np.float32), "F16")
    add("matrix.bf16", rng.standard_normal((2, 3, 4)).astype(np.float32), "BF16")
    add("matrix.q8_0", rng.standard_normal((5, 64)).astype(np.float32), "Q8_0")
    add("matrix.q4_k", np.zeros((3, 512), dtype=np.float32), "Q4_K")  # only the shape is used
    add("matrix.q5_0", rng.standard_normal((4, 96)).astype(np.float32), "Q5_0")
    expected["alignment"] = 64
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(f"{out_dir}/expected.json", "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
