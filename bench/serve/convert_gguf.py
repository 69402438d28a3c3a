"""Runs llama.cpp's own convert_hf_to_gguf.py on an export dir, unchanged but for one thing: a
tokenizer whose check hash is not in the converter's list, yet whose pre-tokenizer is GPT-2's
(tokenizer.json: ByteLevel with GPT-2's regex, as GPT2TokenizerFast writes it), is declared
"gpt-2", llama.cpp's pre-tokenizer for GPT-2. make_gpt_small.py's cut GPT-2 vocabulary needs it;
GPT-2's full vocabulary is in the list and goes through untouched. Anything else still fails as
the converter does.

    bench/.cache/venv-gguf/bin/python bench/serve/convert_gguf.py LLAMA_CPP_SRC MODEL_DIR --outtype f32 --outfile F
"""
import json
import os
import sys


def gpt2_pre_tokenizer(model_dir):
    try:
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            pre = json.load(f).get("pre_tokenizer") or {}
    except OSError:
        return False
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True)


def main():
    llama_src, argv = sys.argv[1], sys.argv[2:]
    sys.path.insert(0, os.path.join(llama_src, "gguf-py"))
    sys.path.insert(0, llama_src)
    import convert_hf_to_gguf
    from conversion.base import TextModel

    original = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if not gpt2_pre_tokenizer(self.dir_model):
                raise
            print("convert_gguf.py: pre-tokenizer not in the converter's list; tokenizer.json's is GPT-2's ByteLevel: "
                  "declared \"gpt-2\"", file=sys.stderr)
            return "gpt-2"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [os.path.join(llama_src, "convert_hf_to_gguf.py")] + argv
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    sys.exit(main())
