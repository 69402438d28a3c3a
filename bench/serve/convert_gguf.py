"""Runs llama.cpp's own convert_hf_to_gguf.py on an export dir, unchanged but for one thing: a
tokenizer whose check hash is not in the converter's list, yet whose pre-tokenizer is one llama.cpp
implements, is declared by that pre-tokenizer's llama.cpp name:
  - "gpt-2": tokenizer.json's ByteLevel with GPT-2's regex, as GPT2TokenizerFast writes it
    (make_gpt_small.py's cut GPT-2 vocabulary);
  - "qwen2": Split(Qwen2's pattern) + ByteLevel(use_regex=False), as Qwen2TokenizerFast writes it
    (bench/infer/make_qwen2_0_5b.py's GPT-2 vocabulary under Qwen2's tokenizer).
Vocabularies in the converter's list (GPT-2's full one) go through untouched. Anything else still
fails as the converter does.

    bench/.cache/venv-gguf/bin/python bench/serve/convert_gguf.py LLAMA_CPP_SRC MODEL_DIR --outtype f32 --outfile F
"""
import json
import os
import sys


QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                 r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def known_pre_tokenizer(model_dir):
    """llama.cpp's name of tokenizer.json's pre-tokenizer, or None."""
    try:
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            pre = json.load(f).get("pre_tokenizer") or {}
    except OSError:
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if ([step.get("type") for step in steps] == ["Split", "ByteLevel"] and steps[0]["pattern"].get("Regex") == QWEN2_PATTERN
            and not steps[1].get("use_regex", True)):
        return "qwen2"
    return None


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
            name = known_pre_tokenizer(self.dir_model)
            if name is None:
                raise
            print(f"convert_gguf.py: vocabulary not in the converter's list; tokenizer.json's pre-tokenizer is "
                  f"llama.cpp's {name!r}: declared so", file=sys.stderr)
            return name

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [os.path.join(llama_src, "convert_hf_to_gguf.py")] + argv
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    sys.exit(main())
