#!/usr/bin/env python3
"""Chat-template oracle: renders chat templates as transformers' apply_chat_template does
(transformers.utils.chat_template_utils.render_jinja_template: jinja2's sandbox with trim_blocks,
lstrip_blocks, loop controls, raise_exception, strftime_now and transformers' tojson), so the
C++ test can compare its own rendering byte for byte.

    .venv-data/bin/python tests/reference/chat_template_oracle.py --templates DIR --cases CASES.json \
        --out OUT.json
    .venv-data/bin/python tests/reference/chat_template_oracle.py --model-dir DIR --cases CASES.json \
        --out OUT.json

CASES.json: {"templates": {"<file>.jinja": {special tokens passed to the template}},
             "conversations": [{"name", "messages", ["tools"]}, ...]}
Every template renders every conversation, with add_generation_prompt false and true. OUT.json
gets a list of {"template", "conversation", "context", and one of "rendered" (the text), "raised"
(the message of the template's raise_exception) or "failed" (another jinja2 error, a TypeError,
an UndefinedError, ...)}; "context" holds the variables the template saw, as the C++ side must
pass them.
With --model-dir, the whole of transformers' path instead: AutoTokenizer.from_pretrained(DIR)
(the template from DIR/chat_template.jinja or tokenizer_config.json, the special tokens from the
config) and apply_chat_template(messages, tokenize=False, add_generation_prompt=...) on every
conversation; OUT.json gets [{"conversation", "add_generation_prompt", "rendered"}, ...].
Exit status 0 on success, 1 on any error (reason on stderr).
"""
import argparse
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--templates")
    parser.add_argument("--model-dir")
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import jinja2
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template

    print(f"jinja2 {jinja2.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    if args.model_dir:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
        for conversation in cases["conversations"]:
            for add_generation_prompt in (False, True):
                rendered = tokenizer.apply_chat_template(conversation["messages"], tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)
                results.append({"conversation": conversation["name"], "add_generation_prompt": add_generation_prompt,
                                "rendered": rendered})
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=1)
        return 0
    for template_file, special_tokens in cases["templates"].items():
        with open(os.path.join(args.templates, template_file), encoding="utf-8", newline="") as f:
            template = f.read()
        for conversation in cases["conversations"]:
            for add_generation_prompt in (False, True):
                tools = conversation.get("tools")
                # What render_jinja_template hands the template: messages, tools, documents,
                # add_generation_prompt, then the tokenizer's special tokens.
                context = {"messages": conversation["messages"], "tools": tools, "documents": None,
                           "add_generation_prompt": add_generation_prompt, **special_tokens}
                result = {"template": template_file, "conversation": conversation["name"], "context": context}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[conversation["messages"]], tools=tools, chat_template=template,
                        add_generation_prompt=add_generation_prompt, **special_tokens)
                    result["rendered"] = rendered[0]
                except jinja2.exceptions.TemplateError as error:
                    if type(error) is jinja2.exceptions.TemplateError:  # raise_exception's
                        result["raised"] = str(error)
                    else:
                        result["failed"] = f"{type(error).__name__}: {error}"
                except (TypeError, ValueError, AttributeError, KeyError) as error:
                    result["failed"] = f"{type(error).__name__}: {error}"
                results.append(result)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:  # noqa: BLE001 (the reason goes to stderr, the status says it failed)
        print(f"chat_template_oracle: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(1)
