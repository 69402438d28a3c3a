"""A GPT-2 124M-shaped model with random weights (seed 0, float32) as a Hugging Face dir:
config.json + model.safetensors + GPT-2's tokenizer (vocab.json, merges.txt, tokenizer.json),
built from ../shared/data/gpt2/{encoder.json,vocab.bpe}.

    .venv-ref/bin/python bench/infer/make_gpt2_124m.py OUT_DIR
"""
import os
import sys

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_FILES = os.path.join(os.path.dirname(ROOT), "shared/data/gpt2")


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    # n_ctx as in GPT-2's own config.json: llama.cpp's convert_hf_to_gguf.py reads it.
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_ctx=1024)).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = transformers.GPT2TokenizerFast(vocab_file=os.path.join(GPT2_FILES, "encoder.json"),
                                               merges_file=os.path.join(GPT2_FILES, "vocab.bpe"))
    tokenizer.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    sys.exit(main())
