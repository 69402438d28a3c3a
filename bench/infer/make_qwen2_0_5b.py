"""A Qwen2.5-0.5B-shaped model with random weights (seed 0, stored in bfloat16) as a Hugging Face
dir: config.json (Qwen2.5-0.5B's: 24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864,
vocabulary 151936, tied embeddings, rope_theta 1e6, q/k/v biases) + model.safetensors + a
Qwen2-style tokenizer.

The tokenizer is transformers' own Qwen2TokenizerFast (its Qwen2Converter: NFC, Qwen2's split
pattern, byte-level BPE) over GPT-2's byte-level vocabulary and merges from
../shared/data/gpt2/{encoder.json,vocab.bpe}, with Qwen2's <|endoftext|>, <|im_start|> and
<|im_end|>; Qwen2's own 151k-token vocabulary is not in ../shared. The embedding has 151936 rows
as Qwen2.5-0.5B's (its tokenizer, too, has fewer tokens than rows), so every decode step reads and
multiplies the full 151936 x 896 head. llama.cpp's converter does not know this vocabulary's
check hash; bench/serve/convert_gguf.py declares it "qwen2" from its split pattern.

    .venv-ref/bin/python bench/infer/make_qwen2_0_5b.py OUT_DIR
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
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, bos_token_id=50256,
        eos_token_id=50256, torch_dtype="bfloat16")
    model = transformers.Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = transformers.Qwen2TokenizerFast(
        vocab_file=os.path.join(GPT2_FILES, "encoder.json"), merges_file=os.path.join(GPT2_FILES, "vocab.bpe"),
        eos_token="<|endoftext|>", pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.save_pretrained(out)
    assert tokenizer.eos_token_id == 50256 and len(tokenizer) == 50259
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters, tokenizer of {len(tokenizer)} tokens")


if __name__ == "__main__":
    sys.exit(main())
