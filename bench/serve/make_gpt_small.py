"""A gpt-small-shaped model (configs/gpt-small.yaml: 6 layers, n_embd 384, 6 heads, context 256,
vocabulary 8192) with random weights (seed 0, float32) as a Hugging Face dir: config.json +
model.safetensors + a tokenizer llama.cpp's convert_hf_to_gguf.py and paraflow both read.

The tokenizer is GPT-2's byte-level BPE cut to the vocabulary: GPT-2's ids 256.. are its merges
in rank order, so its first 8191 ids (the 256 bytes and the first 7935 merges) are a complete
BPE vocabulary by themselves; <|endoftext|> takes id 8191. Built from
../shared/data/gpt2/{encoder.json,vocab.bpe}. Its pre-tokenizer is GPT-2's (llama.cpp's "gpt-2";
see convert_gguf.py, which says so to the converter, as the cut vocabulary's check hash is not
in its list).

    bench/.cache/venv-gguf/bin/python bench/serve/make_gpt_small.py OUT_DIR
"""
import json
import os
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_FILES = os.path.join(os.path.dirname(ROOT), "shared/data/gpt2")
VOCAB = 8192


def cut_tokenizer(directory):
    with open(os.path.join(GPT2_FILES, "encoder.json")) as f:
        encoder = json.load(f)
    with open(os.path.join(GPT2_FILES, "vocab.bpe")) as f:
        lines = f.read().split("\n")
    header, merges = lines[0], [line for line in lines[1:] if line]
    kept = {token: i for token, i in encoder.items() if i < VOCAB - 1}
    merges = merges[:VOCAB - 1 - 256]
    for rank, merge in enumerate(merges):  # each kept merge makes the kept id 256 + rank
        assert kept["".join(merge.split(" "))] == 256 + rank, merge
    kept["<|endoftext|>"] = VOCAB - 1
    vocab_file, merges_file = os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt")
    with open(vocab_file, "w") as f:
        json.dump(kept, f, ensure_ascii=False)
    with open(merges_file, "w") as f:
        f.write(header + "\n" + "\n".join(merges) + "\n")
    return transformers.GPT2TokenizerFast(vocab_file=vocab_file, merges_file=merges_file)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=256, n_ctx=256, n_embd=384, n_layer=6, n_head=6,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = cut_tokenizer(tmp)
        assert len(tokenizer) == VOCAB and tokenizer.eos_token_id == VOCAB - 1
        tokenizer.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters, vocabulary {len(tokenizer)}")


if __name__ == "__main__":
    sys.exit(main())
