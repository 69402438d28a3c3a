#!/usr/bin/env python3
"""Tokenizer oracle for the Llama family: builds tokenizer.json files with the exact components
that Llama 3's, Qwen2's, Llama 2's and Mistral's files have (as transformers'
convert_slow_tokenizer.py builds them: LlamaConverter, Qwen2Converter, TikTokenConverter), on a
small BPE trained here, then encodes and decodes texts with Hugging Face tokenizers so the C++
test can compare.

    .venv-data/bin/python tests/reference/tokenizer_family_oracle.py build --family F \
        --train FILE [FILE...] --vocab-size N --out DIR
    .venv-data/bin/python tests/reference/tokenizer_family_oracle.py encode --dir DIR \
        --texts TEXTS.json --out OUT.json

Families (F):
  llama3   byte-level BPE, ignore_merges, Split(Llama 3's pattern) + ByteLevel(use_regex=False),
           ByteLevel decoder, post-processor Sequence[ByteLevel, TemplateProcessing(BOS
           <|begin_of_text|>)], Llama 3's special tokens; plus tokens in the vocabulary that no
           merge makes (as tiktoken-derived vocabularies have, which ignore_merges takes whole) and
           two added tokens with lstrip / rstrip.
  qwen2    byte-level BPE, NFC normalizer, Split(Qwen2's pattern) + ByteLevel(use_regex=False),
           ByteLevel decoder and post-processor, <|endoftext|> <|im_start|> <|im_end|> special and
           <tool_call> </tool_call> added but not special (as Qwen2.5's files).
  llama2   SentencePiece-style BPE: <unk> <s> </s>, <0x00>..<0xFF>, byte_fallback, fuse_unk, runs
           of "▁" as pieces (merged first, as in Llama 2's vocabulary),
           normalizer Prepend("▁") + Replace(" ", "▁") (legacy), decoder Replace + ByteFallback +
           Fuse + Strip, TemplateProcessing(BOS <s>).
  mistral  as llama2 but the non-legacy form: no normalizer, pre-tokenizer
           Metaspace(prepend_scheme="first", split=False).
The trained alphabet is limited so rare characters take the byte fallback (or the unk token).

build also writes the family's tokenizer_config.json (tokenizer class, BOS / EOS settings; Llama
2's here asks for add_eos_token, to check that transformers' LlamaTokenizerFast rebuilds the
template from it).

encode writes {"versions": {...}, "ids": [[...]], "ids_template": [[...]],
  "decoded": [text of ids], "decoded_skip": [text of ids_template, special tokens skipped],
  "decoded_keep": [text of ids_template, special tokens kept],
  "transformers": [transformers.AutoTokenizer.from_pretrained(DIR)(text)["input_ids"]]} for the
texts.
Exit status 0 on success, 1 on any error (reason on stderr).
"""
import argparse
import json
import sys

LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def read_texts(files):
    texts = []
    for name in files:
        with open(name, encoding="utf-8") as f:
            texts.extend(line for line in f.read().split("\n\n") if line)
    return texts


def byte_level_spelling(text):
    """A text's bytes as byte-level BPE files spell them (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return "".join(table[b] for b in text.encode("utf-8"))


def byte_level(family, train, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    pattern = LLAMA3_PATTERN if family == "llama3" else QWEN2_PATTERN
    tok = Tokenizer(models.BPE(ignore_merges=family == "llama3"))
    if family == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=False)
    tok.train_from_iterator(read_texts(train), trainer)
    if family == "llama3":
        # Whole words in the vocabulary that no merge makes: ignore_merges takes them whole.
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        for word in [" notwithstanding", " MERCHANTABILITY", " conveying", " sublicensing", " propagate",
                     " infringement", " 日本", "1234", "Ñandú", "\n\n\n"]:
            spelled = byte_level_spelling(word)
            if spelled not in vocab:
                vocab[spelled] = len(vocab)
        tok = Tokenizer.from_str(json.dumps(spec))
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIALS])
        tok.add_special_tokens([AddedToken("<|lstrip|>", special=True, normalized=False, lstrip=True),
                                AddedToken("<|rstrip|>", special=True, normalized=False, rstrip=True)])
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1 $B:1",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    else:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ["<tool_call>", "</tool_call>"]])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece(family, train, vocab_size):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    # Train word pieces ("▁the") on words, then lay the vocabulary out as Llama 2's: <unk> <s> </s>,
    # the 256 byte tokens, then the pieces; the alphabet is limited so rare characters fall back.
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trained.train_from_iterator(read_texts(train), BpeTrainer(vocab_size=vocab_size, limit_alphabet=150,
                                                              show_progress=False))
    spec = json.loads(trained.to_str())
    pieces = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in pieces:
        vocab.setdefault(piece, len(vocab))
    # Runs of "▁" are pieces in Llama 2's vocabulary ("▁▁" is its first merge, for code's indents).
    runs = [["▁", "▁"], ["▁▁", "▁▁"], ["▁▁", "▁"]]
    for left, right in runs:
        vocab.setdefault(left + right, len(vocab))
    spec["model"] = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                     "vocab": vocab, "merges": runs + spec["model"]["merges"]}
    spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])]
    spec["pre_tokenizer"] = None
    spec["normalizer"] = None
    tok = Tokenizer.from_str(json.dumps(spec))
    if family == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(prepend="▁"), normalizers.Replace(pattern=" ", content="▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    return tok


TOKENIZER_CONFIGS = {
    "llama3": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
               "eos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": True},
    "qwen2": {"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|endoftext|>",
              "pad_token": "<|endoftext|>", "errors": "replace", "split_special_tokens": False},
    "llama2": {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": True, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>", "legacy": True},
    "mistral": {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": False},
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--family", required=True, choices=["llama3", "qwen2", "llama2", "mistral"])
    build.add_argument("--train", nargs="+", required=True)
    build.add_argument("--vocab-size", type=int, default=2000)
    build.add_argument("--out", required=True)
    encode = sub.add_parser("encode")
    encode.add_argument("--dir", required=True)
    encode.add_argument("--texts", required=True)
    encode.add_argument("--out", required=True)
    args = parser.parse_args()
    try:
        import os

        import tokenizers
        from tokenizers import Tokenizer

        if args.command == "build":
            if args.family in ("llama3", "qwen2"):
                tok = byte_level(args.family, args.train, args.vocab_size)
            else:
                tok = sentencepiece(args.family, args.train, args.vocab_size)
            os.makedirs(args.out, exist_ok=True)
            tok.save(os.path.join(args.out, "tokenizer.json"))
            with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
                json.dump(TOKENIZER_CONFIGS[args.family], f, indent=2)
            return
        tok = Tokenizer.from_file(os.path.join(args.dir, "tokenizer.json"))
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        ids_template = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
        import warnings

        import transformers

        warnings.filterwarnings("ignore")
        transformers.logging.set_verbosity_error()
        auto = transformers.AutoTokenizer.from_pretrained(args.dir)
        out = {"versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                            "transformers_class": type(auto).__name__, "python": sys.version.split()[0]},
               "transformers": [auto(t)["input_ids"] for t in texts],
               "ids": ids, "ids_template": ids_template,
               "decoded": tok.decode_batch(ids, skip_special_tokens=False),
               "decoded_skip": tok.decode_batch(ids_template, skip_special_tokens=True),
               "decoded_keep": tok.decode_batch(ids_template, skip_special_tokens=False)}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f)
    except Exception as e:  # noqa: BLE001 - the reason goes to the C++ test's log
        import traceback

        traceback.print_exc()
        print(f"tokenizer_family_oracle: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
