#!/usr/bin/env python3
"""Tokenizer oracle: encodes texts with tiktoken, Hugging Face tokenizers and transformers, all
built from the same vocabulary the C++ tokenizer saved, so the C++ test can compare ids.

    .venv-data/bin/python tests/reference/tokenizer_oracle.py --dir DIR --texts TEXTS.json \
        --out OUT.json [--tiktoken-file gpt2.tiktoken]

DIR holds what paraflow's Tokenizer::save wrote: vocab.json, merges.txt, tokenizer.json,
tokenizer_config.json. TEXTS.json is a JSON list of strings. OUT.json gets
  {"versions": {...}, "ids": {"<library>": [[ids of text 0], ...], ...},
   "pieces": [[pre-tokens of text 0], ...]}
where "pieces" is tokenizers' ByteLevel pre-tokenisation (Oniguruma running GPT-2's regex) with
special-token text left in, as substrings of the text;
for these encoders (special token text `<|endoftext|>` becomes its id in all of them):
  tiktoken           tiktoken.Encoding with GPT-2's pattern; ranks from --tiktoken-file when
                     given (GPT-2's original file), else from DIR/vocab.json (rank = id)
  tokenizers_json    tokenizers.Tokenizer.from_file(DIR/tokenizer.json)
  tokenizers_files   tokenizers BPE built from DIR/vocab.json + DIR/merges.txt, ByteLevel
  transformers_fast  transformers.GPT2TokenizerFast.from_pretrained(DIR)
  transformers_fast_files  GPT2TokenizerFast.from_pretrained on a copy of DIR without
                     tokenizer.json (transformers converts vocab.json + merges.txt itself)
  transformers_slow  transformers.GPT2Tokenizer (pure Python, `regex` module) from the same files
  tokenizers_added   with --add-special TOKEN: tokenizers_json's tokenizer after add_special_tokens,
                     saved as DIR/added/tokenizer.json (the token takes the next id)
Exit status 0 on success, 1 on any error (reason on stderr).
"""
import argparse
import json
import os
import sys
import warnings

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def specials_of(directory):
    with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
        added = json.load(f).get("added_tokens", [])
    return {t["content"]: t["id"] for t in added if t.get("special")}


def build_tiktoken(directory, tiktoken_file):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    specials = specials_of(directory)
    if tiktoken_file:
        ranks = load_tiktoken_bpe(tiktoken_file)
    else:
        dec = byte_decoder()
        with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as f:
            vocab = json.load(f)
        ranks = {bytes(dec[c] for c in token): i for token, i in vocab.items() if token not in specials}
    enc = tiktoken.Encoding("paraflow-oracle", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    return lambda text: enc.encode(text, allowed_special="all")


def build_tokenizers_json(directory):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def build_tokenizers_files(directory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    model = models.BPE.from_file(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials_of(directory)))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def build_transformers_fast(directory):
    from transformers import GPT2TokenizerFast

    tok = GPT2TokenizerFast.from_pretrained(directory)
    return lambda text: tok.encode(text)


def build_transformers_fast_files(directory):
    import shutil
    import tempfile

    from transformers import GPT2TokenizerFast

    copy = tempfile.mkdtemp(prefix="paraflow_oracle_")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(directory, name), copy)
    tok = GPT2TokenizerFast.from_pretrained(copy)
    tok.add_special_tokens({"additional_special_tokens": list(specials_of(directory))})
    shutil.rmtree(copy)
    return lambda text: tok.encode(text)


def build_transformers_slow(directory):
    from transformers import GPT2Tokenizer

    tok = GPT2Tokenizer(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))
    tok.add_special_tokens({"additional_special_tokens": list(specials_of(directory))})
    return lambda text: tok.encode(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--texts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiktoken-file")
    parser.add_argument("--skip", action="append", default=[], help="encoder names to leave out")
    parser.add_argument("--add-special", help="also: tokenizers with this special token added (add_special_tokens), "
                        "saved as DIR/added/tokenizer.json, its ids under \"tokenizers_added\"")
    args = parser.parse_args()
    try:
        warnings.filterwarnings("ignore")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import tiktoken
        import tokenizers
        import transformers

        transformers.logging.set_verbosity_error()
        with open(args.texts, encoding="utf-8") as f:
            texts = json.load(f)
        builders = {
            "tiktoken": lambda: build_tiktoken(args.dir, args.tiktoken_file),
            "tokenizers_json": lambda: build_tokenizers_json(args.dir),
            "tokenizers_files": lambda: build_tokenizers_files(args.dir),
            "transformers_fast": lambda: build_transformers_fast(args.dir),
            "transformers_fast_files": lambda: build_transformers_fast_files(args.dir),
            "transformers_slow": lambda: build_transformers_slow(args.dir),
        }
        ids = {}
        for name, build in builders.items():
            if name in args.skip:
                continue
            encode = build()
            ids[name] = [encode(t) for t in texts]
        if args.add_special:
            from tokenizers import Tokenizer

            added = Tokenizer.from_file(os.path.join(args.dir, "tokenizer.json"))
            added.add_special_tokens([args.add_special])
            os.makedirs(os.path.join(args.dir, "added"), exist_ok=True)
            added.save(os.path.join(args.dir, "added", "tokenizer.json"))
            ids["tokenizers_added"] = [added.encode(t).ids for t in texts]
        from tokenizers import pre_tokenizers

        splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        pieces = [[t[a:b] for _, (a, b) in splitter.pre_tokenize_str(t)] for t in texts]
        versions = {"tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__,
                    "transformers": transformers.__version__, "python": sys.version.split()[0]}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"versions": versions, "ids": ids, "pieces": pieces}, f)
    except Exception as e:  # noqa: BLE001 - the reason goes to the C++ test's log
        import traceback

        traceback.print_exc()
        print(f"tokenizer_oracle: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
