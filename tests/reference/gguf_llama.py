"""Llama-family GGUF files as llama.cpp's convert_hf_to_gguf.py writes them, with gguf-py: the
oracle of tests/model/gguf_llama_test.cc and tests/infer/gguf_llama_generate_test.cc. Runs in
.venv-data (scripts/setup_python_data.sh): numpy, safetensors, gguf, tokenizers.

    gguf_llama.py convert HF_DIR OUT.gguf TYPE
        a Hugging Face LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM dir (config.json,
        model.safetensors) as the converter writes it with --outtype TYPE (f32, f16, bf16, q8_0):
        general.architecture llama (Llama and Mistral) or qwen2, the {arch}.* hyperparameters,
        llama.cpp's tensor names, q_proj/k_proj rows permuted for `llama` exactly as
        LlamaModel.permute does (qwen2 is not), Llama 3's rope scaling as the rope_freqs tensor
        (LlamaModel.generate_extra_tensors), matrices in TYPE and vectors in F32, no output.weight
        when the head is tied. With HF_DIR/tokenizer.json, its vocabulary as tokenizer.ggml.*: a
        byte-level BPE as the converter's _set_vocab_gpt2 writes it (tokenizer.ggml.pre from
        HF_DIR/gguf_pre.txt), a SentencePiece-style one (Metaspace, byte fallback) as
        _set_vocab_llama_hf does (model "llama", scores, byte tokens <0xNN> of type BYTE).
    gguf_llama.py read OURS.gguf HF_DIR TYPE
        reads OURS with gguf.GGUFReader and checks it against what `convert` writes from HF_DIR:
        the same keys with the same types and values, the same tensors, names, types and shapes;
        their values, un-permuted and dequantized, equal HF_DIR's (TYPE rounding allowed);
        exits 1 naming the first difference.
"""
import json
import math
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType, quants

from gguf_compare import compare_gguf

TYPES = {"f32": (GGMLQuantizationType.F32, 0), "f16": (GGMLQuantizationType.F16, 1),
         "bf16": (GGMLQuantizationType.BF16, 32), "q8_0": (GGMLQuantizationType.Q8_0, 7)}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute(weights, n_head, n_head_kv):  # convert_hf_to_gguf.py's LlamaModel.permute, verbatim
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def gguf_name(name):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{BLOCK[part]}.{kind}"


def rope_factors(config, head_dim):  # LlamaModel.generate_extra_tensors, in numpy float32
    rope = config["rope_scaling"]
    base = config.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)




def tokenizer_keys(hf_dir):
    """tokenizer.ggml.* as the converter writes them from HF_DIR/tokenizer.json: (key, value, type)."""
    from gguf import GGUFValueType as T
    path = f"{hf_dir}/tokenizer.json"
    if not os.path.exists(path):
        return []
    spec = json.load(open(path, encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    size = max(list(vocab.values()) + list(added)) + 1
    tokens = [""] * size
    for token, i in vocab.items():
        tokens[i] = token
    for i, t in added.items():
        tokens[i] = t["content"]
    keys = []
    if spec["model"].get("byte_fallback"):  # as _set_vocab_sentencepiece writes a SentencePiece model
        # SentencePiece's scores rank its pieces as its merges made them: the first merge's is highest.
        score = {}
        for rank, merge in enumerate(spec["model"]["merges"]):
            left, right = merge.split(" ") if isinstance(merge, str) else merge
            score.setdefault(left + right, -float(rank))
        types, scores = [], []
        for i, token in enumerate(tokens):
            if i in added:
                types.append(TokenType.CONTROL if added[i]["special"] else TokenType.USER_DEFINED)
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                types.append(TokenType.BYTE)
            else:
                types.append(TokenType.NORMAL)
            scores.append(score.get(token, -1e6 - i))
        keys += [("tokenizer.ggml.model", "llama", T.STRING), ("tokenizer.ggml.pre", "default", T.STRING),
                 ("tokenizer.ggml.tokens", tokens, T.ARRAY), ("tokenizer.ggml.scores", scores, T.ARRAY),
                 ("tokenizer.ggml.token_type", [int(t) for t in types], T.ARRAY)]
    else:  # _set_vocab_gpt2
        pre = open(f"{hf_dir}/gguf_pre.txt").read().strip()
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        types = [int(TokenType.CONTROL if added[i]["special"] else TokenType.USER_DEFINED) if i in added
                 else int(TokenType.NORMAL) for i in range(size)]
        # get_vocab_base pads to config.json's vocab_size (the embedding's rows) with unused tokens.
        model_config = f"{hf_dir}/config.json"
        rows = json.load(open(model_config))["vocab_size"] if os.path.exists(model_config) else size
        tokens += [f"[PAD{i}]" for i in range(size, rows)]
        types += [int(TokenType.UNUSED)] * (rows - size)
        keys += [("tokenizer.ggml.model", "gpt2", T.STRING), ("tokenizer.ggml.pre", pre, T.STRING),
                 ("tokenizer.ggml.tokens", tokens, T.ARRAY), ("tokenizer.ggml.token_type", types, T.ARRAY),
                 ("tokenizer.ggml.merges", merges, T.ARRAY)]
    config = json.load(open(f"{hf_dir}/tokenizer_config.json")) if os.path.exists(f"{hf_dir}/tokenizer_config.json") else {}
    ids = {t["content"]: i for i, t in added.items()}
    for kind in ("bos", "eos"):
        token = config.get(f"{kind}_token")
        if isinstance(token, str) and token in ids:
            keys.append((f"tokenizer.ggml.{kind}_token_id", ids[token], T.UINT32))
    for kind in ("bos", "eos"):  # as the converter's SpecialVocab takes them from tokenizer_config.json
        if f"add_{kind}_token" in config:
            keys.append((f"tokenizer.ggml.add_{kind}_token", bool(config[f"add_{kind}_token"]), T.BOOL))
    if "chat_template" in config:
        keys.append(("tokenizer.chat_template", config["chat_template"], T.STRING))
    return keys


def convert(hf_dir, out, type_name):
    from safetensors.numpy import load_file
    config = json.load(open(f"{hf_dir}/config.json"))
    weights = load_file(f"{hf_dir}/model.safetensors")
    arch = "qwen2" if config["model_type"] == "qwen2" else "llama"
    n_head, n_kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    ggml_type, file_type = TYPES[type_name]
    writer = GGUFWriter(out, arch=arch)
    writer.add_file_type(file_type)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_scaling") or {}
    if rope.get("rope_type") == "linear":
        from gguf import RopeScalingType
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", rope_factors(config, head_dim))
    for key, value, vtype in tokenizer_keys(hf_dir):
        writer.add_key_value(key, value, vtype)
    for name, values in weights.items():
        values = values.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = permute(values, n_head, n_head)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = permute(values, n_head, n_kv)
        values = np.ascontiguousarray(values)
        if values.ndim == 1 or ggml_type == GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), values)
        elif ggml_type == GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name(name), values.astype(np.float16))
        else:
            blocks = quants.quantize(values, ggml_type)
            writer.add_tensor(gguf_name(name), blocks, raw_dtype=ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read(ours_path, hf_dir, type_name):
    """OURS against the file `convert` writes from HF_DIR (and its values against HF_DIR's)."""
    import tempfile
    from safetensors.numpy import load_file
    with tempfile.TemporaryDirectory() as tmp:
        theirs_path = f"{tmp}/theirs.gguf"
        convert(hf_dir, theirs_path, type_name)
        mine, keys, tensors = compare_gguf(ours_path, theirs_path, rounded={"rope_freqs.weight"})
        # Un-permuted, the values are HF_DIR's (to the type's rounding).
        config = json.load(open(f"{hf_dir}/config.json"))
        n_head = config["num_attention_heads"]
        n_kv = config.get("num_key_value_heads", n_head)
        tolerance = {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2}[type_name]
        for name, values in load_file(f"{hf_dir}/model.safetensors").items():
            tensor = mine[gguf_name(name)]
            back = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(values.shape)
            if config["model_type"] != "qwen2" and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
                heads = n_head if "q_proj" in name else n_kv
                hs = values.shape[0] // heads
                # the inverse of permute: GGUF row h*hs + 2i + j is HF row h*hs + j*hs/2 + i
                back = back.reshape(heads, hs // 2, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)
            scale = np.abs(values).max() if values.size else 1
            if np.abs(back - values).max() > tolerance * max(scale, 1e-30):
                sys.exit(f"tensor {gguf_name(name)}: un-permuted values differ from {name}'s by "
                         f"{np.abs(back - values).max()}")
    print(f"{ours_path}: {keys} keys and {tensors} tensors as the converter writes them")


def vocab(tokenizer_dir, out):
    """A GGUF file of TOKENIZER_DIR's tokenizer.ggml.* keys alone (architecture llama, no tensors)."""
    writer = GGUFWriter(out, arch="llama")
    for key, value, vtype in tokenizer_keys(tokenizer_dir):
        writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenize(gguf_path, texts_path, out):
    """transformers' own tokenizer of a GGUF file (AutoTokenizer with gguf_file: the tokenizers
    library on the vocabulary it converts) on TEXTS.json; writes {"ids": [[...]], "ids_template": [[...]]}."""
    import warnings
    import transformers
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                                     gguf_file=os.path.basename(gguf_path))
    texts = json.load(open(texts_path, encoding="utf-8"))
    result = {"class": type(tok).__name__,
              "ids": [tok(t, add_special_tokens=False)["input_ids"] for t in texts],
              "ids_template": [tok(t)["input_ids"] for t in texts]}
    json.dump(result, open(out, "w", encoding="utf-8"))


def main():
    action = sys.argv[1]
    if action == "convert":
        convert(sys.argv[2], sys.argv[3], sys.argv[4])
    elif action == "vocab":
        vocab(sys.argv[2], sys.argv[3])
    elif action == "tokenize":
        tokenize(sys.argv[2], sys.argv[3], sys.argv[4])
    elif action == "read":
        read(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown action {action}")


if __name__ == "__main__":
    main()
