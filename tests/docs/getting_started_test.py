#!/usr/bin/env python3
"""README.md's "Getting started", run as written.

Every fenced block of that section runs in order in one bash session, in a scratch folder that
holds a copy of configs/ and a link to the build: ```sh blocks as they are, ```python blocks
through the interpreter of the environment that has what they import (the openai client's, or
transformers'). Then the test checks what the README promises of the commands' results: the
resumed run's weights equal the uninterrupted run's (the README's own `cmp`), the server answered,
the transformers snippet printed text, and TensorBoard lists the tags the README names.
Ports 8080 and 6006 must be free (the README's commands use them).
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(os.environ.get("PARAFLOW_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BINARY = Path(os.environ["PARAFLOW_BINARY"])
PYTHON_FOR = {  # what a snippet imports -> the test environment that has it
    "openai": SOURCE / ".venv-serve/bin/python",
    "transformers": SOURCE / ".venv-ref/bin/python",
}
TENSORBOARD_BIN = SOURCE / ".venv-data/bin"


def getting_started_blocks(readme: str):
    section = re.search(r"^## Getting started\n(.*?)(?=^## )", readme, re.S | re.M)
    if not section:
        sys.exit("README.md has no '## Getting started' section")
    return re.findall(r"^```(\w+)\n(.*?)^```", section.group(1), re.S | re.M)


def interpreter_for(snippet: str) -> Path:
    for module, python in PYTHON_FOR.items():
        if re.search(rf"^\s*(from|import) {module}\b", snippet, re.M):
            return python
    sys.exit(f"no test environment for this README snippet:\n{snippet}")


def as_bash(blocks) -> str:
    lines = ["set -euo pipefail"]
    for language, text in blocks:
        if language == "sh":
            lines.append(text)
        elif language == "python":
            lines.append(f"'{interpreter_for(text)}' - <<'README_SNIPPET'\n{text}README_SNIPPET")
        else:
            sys.exit(f"README's Getting started has a ```{language} block: only sh and python are run")
    # The README leaves TensorBoard running in the background: ask it for the run's tags, then stop it.
    lines.append("""
for _ in $(seq 1 120); do
  tags=$(curl -sf http://127.0.0.1:6006/data/plugin/scalars/tags || true)
  [[ "$tags" == *train/val_loss* ]] && break
  sleep 0.5
done
kill $! && wait
echo "TENSORBOARD_TAGS $tags"
""")
    return "\n".join(lines) + "\n"


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def main() -> int:
    for port in (8080, 6006):
        if not port_free(port):
            sys.exit(f"port {port} is taken: the README's commands need it")
    blocks = getting_started_blocks((SOURCE / "README.md").read_text())
    scratch = Path(tempfile.mkdtemp(prefix="getting-started-"))
    try:
        shutil.copytree(SOURCE / "configs", scratch / "configs")
        (scratch / "build").symlink_to(BINARY.parents[2])  # build/src/cli/paraflow -> build
        env = dict(os.environ, PATH=f"{TENSORBOARD_BIN}:{os.environ['PATH']}")
        run = subprocess.run(["bash", "-c", as_bash(blocks)], cwd=scratch, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1200)
        output = run.stdout
        print(output)
        failures = []
        if run.returncode != 0:
            failures.append(f"the commands exited {run.returncode}")
        if "bit for bit the same" not in output:
            failures.append("the resumed run's weights differ from the uninterrupted run's")
        if '"object":"text_completion"' not in output.replace(" ", ""):
            failures.append("curl got no completion from the server")
        tags = re.search(r"^TENSORBOARD_TAGS (.*)$", output, re.M)
        for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second", "train/val_loss"):
            if not tags or tag not in tags.group(1):
                failures.append(f"TensorBoard does not list {tag}")
        for failure in failures:
            print("FAILED:", failure)
        return 1 if failures else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
