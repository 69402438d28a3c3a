#!/usr/bin/env python3
"""README.md's "Getting started", run as written.

Every fenced block of that section runs in order in one bash session, in a scratch folder that
holds a copy of configs/ and a link to the build: ```sh blocks as they are, ```python blocks
through the interpreter of the environment that has what they import (the openai client's, or
transformers'). Then the test checks what the README promises of the commands' results: the
resumed run's weights equal the uninterrupted run's (the README's own `cmp`), the server answered,
transformers' greedy text is `paraflow generate --temperature 0 --dtype float32`'s, as the README
says, and TensorBoard lists the tags the README names.
Ports 8080 and 6006 must be free (the README's commands use them).
"""
import os
import re
import shutil
import signal
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


def interpreter_for(snippet: str):
    for module, python in PYTHON_FOR.items():
        if re.search(rf"^\s*(from|import) {module}\b", snippet, re.M):
            return module, python
    sys.exit(f"no test environment for this README snippet:\n{snippet}")


def as_bash(blocks) -> str:
    lines = ["set -euo pipefail"]
    for language, text in blocks:
        if language == "sh":
            lines.append(text)
        elif language == "python":
            module = interpreter_for(text)[0]
            lines.append(f"printf '\\n<<{module}\\n'\n'{PYTHON_FOR[module]}' - <<'README_SNIPPET'\n{text}README_SNIPPET\necho '{module}>>'")
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
    # The README says transformers' greedy tokens are `paraflow generate`'s with float32 weights.
    lines.append("echo '<<paraflow'; paraflow generate --model runs/my-text/export --prompt 'The licensee' "
                 "--max-tokens 20 --temperature 0 --dtype float32 2>/dev/null | sed '/^\\[/,$d'; echo 'paraflow>>'")
    return "\n".join(lines) + "\n"


def snippet_output(output: str, name: str) -> str:
    found = re.search(rf"^<<{name}\n(.*?)^{name}>>$", output, re.S | re.M)
    return found.group(1).strip() if found else ""


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
        # Its own process group: a server or TensorBoard the README starts in the background is
        # stopped with it, also when a command fails before the README's own `kill`. The output
        # goes to a file, not a pipe, which such a process would hold open after bash ends.
        log_path = scratch / "commands.log"
        with open(log_path, "w") as log:
            commands = subprocess.Popen(["bash", "-c", as_bash(blocks)], cwd=scratch, env=env,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                commands.wait(timeout=1200)
            finally:
                try:
                    os.killpg(commands.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        output = log_path.read_text()
        print(output)
        failures = []
        if commands.returncode != 0:
            failures.append(f"the commands exited {commands.returncode}")
        if "bit for bit the same" not in output:
            failures.append("the resumed run's weights differ from the uninterrupted run's")
        if '"object":"text_completion"' not in output.replace(" ", ""):
            failures.append("curl got no completion from the server")
        tags = re.search(r"^TENSORBOARD_TAGS (.*)$", output, re.M)
        for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second", "train/val_loss"):
            if not tags or tag not in tags.group(1):
                failures.append(f"TensorBoard does not list {tag}")
        transformers_text = snippet_output(output, "transformers")
        paraflow_text = snippet_output(output, "paraflow")
        if not transformers_text or not paraflow_text.startswith(transformers_text[:len(paraflow_text)]):
            failures.append(f"transformers' greedy text {transformers_text!r} is not paraflow's {paraflow_text!r}")
        for failure in failures:
            print("FAILED:", failure)
        return 1 if failures else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
