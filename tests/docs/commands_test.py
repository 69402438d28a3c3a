#!/usr/bin/env python3
"""Every `paraflow ...` command written in README.md and docs/*.md names what exists.

Commands are read from the code blocks (fenced, or indented four spaces) with their `\\`
continuation lines, after any `mpirun ...` or VAR=value prefix. For each, the subcommand must be
one the binary has, every `--flag` must be in that subcommand's `--help`, every `--set key=value`
key must be in `paraflow config keys`, and every `configs/*.yaml` it names must exist. (The
README's Getting started is also run end to end: getting_started_test.py.)
"""
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

SOURCE = Path(os.environ.get("PARAFLOW_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BINARY = os.environ["PARAFLOW_BINARY"]


def code_lines(markdown: str):
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            yield line.strip()


def commands(markdown: str):
    lines = list(code_lines(markdown))
    i = 0
    while i < len(lines):
        text = lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i]
        i += 1
        found = re.search(r"(?:^|\s|/)paraflow (\w.*)", text)
        if found and not text.startswith("#"):
            yield text, found.group(1).split("#")[0]


@functools.cache
def help_text(words: tuple):
    run = subprocess.run([BINARY, *words, "--help"], capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def main():
    failures = []
    keys = subprocess.run([BINARY, "config", "keys"], capture_output=True, text=True, check=True).stdout
    checked = 0
    for page in [SOURCE / "README.md", *sorted((SOURCE / "docs").glob("*.md"))]:
        for text, rest in commands(page.read_text()):
            words = rest.split()
            # The subcommand: one word, or two where the first has subcommands of its own.
            path = tuple(words[:1])
            if len(words) > 1 and not words[1].startswith("-") and help_text(tuple(words[:2]))[0] == 0 \
                    and "Subcommands" in help_text(path)[1]:
                path = tuple(words[:2])
            key = " ".join(path)
            code, output = help_text(path)
            where = f"{page.relative_to(SOURCE)}: `{text}`"
            # `paraflow nosuch --help` prints the top-level help and exits 0: its usage line tells.
            if code != 0 or not re.search(rf"^Usage: \S*paraflow {re.escape(key)} ", output, re.M):
                failures.append(f"{where}: no subcommand `paraflow {key}`")
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", rest):
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", output):
                    failures.append(f"{where}: `paraflow {key}` has no {flag}")
            for setting in re.findall(r"--set[ =]([\w.]+)=", rest):
                if f"`{setting}`" not in keys:
                    failures.append(f"{where}: no config key {setting}")
            for config in re.findall(r"(?<![\w/])(configs/[\w.-]+\.yaml)", rest):
                if not (SOURCE / config).exists():
                    failures.append(f"{where}: {config} does not exist")
            checked += 1
    print(f"{checked} commands checked")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures or checked < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
