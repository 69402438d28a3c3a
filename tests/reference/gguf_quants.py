"""ggml's block quantizers, as the `gguf` package (llama.cpp's gguf-py) implements them in numpy:
the oracle of tests/tensor/quantized_test.cc (gguf 0.19.0 dequantizes Q4_K but cannot quantize it). Runs in .venv-data (scripts/setup_python_data.sh).

    gguf_quants.py quantize TYPE VALUES.f32 OUT.bin      # raw little-endian f32 in, blocks out
    gguf_quants.py dequantize TYPE BLOCKS.bin OUT.f32    # blocks in, f32 out
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

TYPES = {"q8_0": GGMLQuantizationType.Q8_0, "q4_k": GGMLQuantizationType.Q4_K, "q5_0": GGMLQuantizationType.Q5_0}


def main():
    action, type_name, source, destination = sys.argv[1:5]
    qtype = TYPES[type_name]
    if action == "quantize":
        values = np.fromfile(source, dtype="<f4")
        quants.quantize(values.reshape(1, -1), qtype).tofile(destination)
    elif action == "dequantize":
        blocks = np.fromfile(source, dtype=np.uint8)
        quants.dequantize(blocks.reshape(1, -1), qtype).astype("<f4").tofile(destination)
    else:
        sys.exit(f"unknown action {action}")


if __name__ == "__main__":
    main()
