"""Two GGUF files compared key by key and tensor by tensor with gguf-py's reader: the shared check
of gguf_files.py (GPT-2) and gguf_llama.py (the Llama family)."""
import math
import sys

import numpy as np
from gguf import GGUFReader, quants


def same_value(a, b):
    """Metadata values equal, floats to float32's rounding (written from float64 by both)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def compare_gguf(ours_path, theirs_path, rounded=(), tensors_only=False):
    """Every key THEIRS holds (but GGUF.*; none with TENSORS_ONLY) is in OURS with the same type and value, and both hold the
    same tensors (names, types, shapes, bytes); the tensors named in ROUNDED, computed in float32 by
    both in different orders, need only equal values to 1e-6. Exits 1 naming the first difference;
    returns OURS's tensors by name and THEIRS's key and tensor counts."""
    ours, theirs = GGUFReader(ours_path), GGUFReader(theirs_path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF.") or tensors_only:
            continue
        mine = ours.fields.get(key)
        if mine is None or mine.types != field.types or not same_value(mine.contents(), field.contents()):
            sys.exit(f"metadata {key}: ours {None if mine is None else (mine.types, mine.contents())!s:.200} "
                     f"theirs {(field.types, field.contents())!s:.200}")
    ours_tensors = {t.name: t for t in ours.tensors}
    theirs_tensors = {t.name: t for t in theirs.tensors}
    if sorted(ours_tensors) != sorted(theirs_tensors):
        sys.exit(f"tensors: ours {sorted(ours_tensors)} theirs {sorted(theirs_tensors)}")
    for name, tensor in theirs_tensors.items():
        mine = ours_tensors[name]
        if mine.tensor_type != tensor.tensor_type or list(mine.shape) != list(tensor.shape):
            sys.exit(f"tensor {name}: ours {mine.tensor_type.name} {list(mine.shape)}, "
                     f"theirs {tensor.tensor_type.name} {list(tensor.shape)}")
        if name in rounded:
            ours_values = quants.dequantize(np.asarray(mine.data), mine.tensor_type)
            theirs_values = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
            if not np.allclose(ours_values, theirs_values, rtol=1e-6, atol=0):
                sys.exit(f"tensor {name}: values differ")
        elif not np.array_equal(np.asarray(mine.data), np.asarray(tensor.data)):
            sys.exit(f"tensor {name}: ours and theirs differ in bytes")
    return ours_tensors, len(theirs.fields), len(theirs_tensors)
