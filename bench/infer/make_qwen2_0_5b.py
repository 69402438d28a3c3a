"""A Qwen2.5-0.5B-shaped model with random weights (seed 0, stored in bfloat16) as a Hugging Face
dir: config.json (Qwen2.5-0.5B's: 24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864,
vocabulary 151936, tied embeddings, rope_theta 1e6, q/k/v biases) + model.safetensors + a
Qwen2-style tokenizer of Qwen2.5's size.

Qwen2's own vocabulary is not in ../shared, so the tokenizer is transformers' Qwen2TokenizerFast
(its Qwen2Converter: NFC, Qwen2's split pattern, byte-level BPE) over a vocabulary laid out as
Qwen2.5's: 151643 byte-level BPE tokens, then <|endoftext|> (151643, BOS and EOS),
<|im_start|> and <|im_end|>, the embedding's last 290 rows without a token. Its BPE is GPT-2's
(../shared/data/gpt2/{encoder.json,vocab.bpe}: the 256 bytes and 50000 merges) extended by
merges of a word-initial piece and a lowercase piece ("Ġwalk" + "ing") whose joins are not
GPT-2 tokens yet, until there are 151643. So nearly every row a random model picks decodes to
text, as with Qwen2.5's files: with GPT-2's 50257 tokens alone two thirds of the generated tokens
had none, and a server streams no chunk for those.

llama.cpp's converter does not know this vocabulary's check hash; bench/serve/convert_gguf.py
declares it "qwen2" from its split pattern.

    .venv-ref/bin/python bench/infer/make_qwen2_0_5b.py OUT_DIR
"""
import json
import os
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_FILES = os.path.join(os.path.dirname(ROOT), "shared/data/gpt2")
BPE_TOKENS = 151643  # Qwen2.5's byte-level tokens; its special tokens follow
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def extended_bpe(directory):
    """GPT-2's BPE extended to BPE_TOKENS tokens, as vocab.json and merges.txt in `directory`."""
    with open(os.path.join(GPT2_FILES, "encoder.json")) as f:
        vocab = {token: i for token, i in json.load(f).items() if token != "<|endoftext|>"}
    with open(os.path.join(GPT2_FILES, "vocab.bpe")) as f:
        lines = f.read().split("\n")
    header, merges = lines[0], [line for line in lines[1:] if line]
    assert len(vocab) == 256 + len(merges)
    by_id = sorted(vocab, key=vocab.get)
    starts = [t for t in by_id if t.startswith("Ġ") and t[1:].isascii() and t[1:].isalpha()]
    pieces = [t for t in by_id if t.isascii() and t.isalpha() and t.islower()]
    for start in starts:
        for piece in pieces:
            if len(vocab) == BPE_TOKENS:
                break
            if start + piece not in vocab:
                vocab[start + piece] = len(vocab)
                merges.append(f"{start} {piece}")
    assert len(vocab) == BPE_TOKENS
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w") as f:
        f.write(header + "\n" + "\n".join(merges) + "\n")


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, bos_token_id=BPE_TOKENS,
        eos_token_id=BPE_TOKENS, torch_dtype="bfloat16")
    model = transformers.Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    with tempfile.TemporaryDirectory() as tmp:
        extended_bpe(tmp)
        tokenizer = transformers.Qwen2TokenizerFast(
            vocab_file=os.path.join(tmp, "vocab.json"), merges_file=os.path.join(tmp, "merges.txt"),
            eos_token=SPECIALS[0], pad_token=SPECIALS[0], additional_special_tokens=SPECIALS[1:])
    assert tokenizer.convert_tokens_to_ids(SPECIALS) == [BPE_TOKENS, BPE_TOKENS + 1, BPE_TOKENS + 2], \
        tokenizer.convert_tokens_to_ids(SPECIALS)
    tokenizer.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters, tokenizer of {len(tokenizer)} tokens")


if __name__ == "__main__":
    sys.exit(main())
