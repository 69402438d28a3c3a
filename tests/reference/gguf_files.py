"""GGUF files as llama.cpp's gguf-py writes and reads them: the oracle of tests/model/gguf_test.cc.
Runs in .venv-data (scripts/setup_python_data.sh).

    gguf_files.py write DIR
        writes DIR/written.gguf with gguf.GGUFWriter (metadata of every value type, arrays of
        numbers and of strings, a custom alignment; tensors in F32, F16, BF16 and Q8_0, quantized
        by gguf.quants) and DIR/expected.json: each key's GGUF type name and value, and each
        tensor's row-major shape, ggml type and values (f32 as numbers, raw bytes as hex).
"""
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, quants


def main():
    action, out_dir = sys.argv[1:3]
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
        else:
            blocks = quants.quantize(values, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType.Q8_0)
            record["bytes"] = blocks.tobytes().hex()
            record["values"] = quants.dequantize(blocks, GGMLQuantizationType.Q8_0).ravel().tolist()
        expected["tensors"][name] = record

    add("vector", rng.standard_normal(7).astype(np.float32), "F32")
    add("matrix.f16", rng.standard_normal((3, 5)).astype(np.float32), "F16")
    add("matrix.bf16", rng.standard_normal((2, 3, 4)).astype(np.float32), "BF16")
    add("matrix.q8_0", rng.standard_normal((5, 64)).astype(np.float32), "Q8_0")
    expected["alignment"] = 64
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(f"{out_dir}/expected.json", "w") as f:
        json.dump(expected, f)


if __name__ == "__main__":
    main()
