"""The Python programs of the docs as a reader finds them, and how to run
one the way that reader would.

Shared by tests/test_docs.py (every page, in the test's venv) and
tools/newcomer.py (the README's programs, in a given venv, with a bare
environment). Imports neither TensorFlow nor pytest.

A program runs with what the reader has: the variables in the reader's
environment, minus the ones only the test suite sets
(``TF_USE_LEGACY_KERAS``, which tools/ci_tf_latest.sh sets for the suite,
and ``TF_LMS_SIMULATOR_MEM_RATIO``), plus each ``NAME=value`` that the
paragraph right above the program tells the reader to set (the words
"set `NAME=value`").
"""

import collections
import glob
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Set for the test suite, never by a reader who did not read it above.
SUITE_ONLY = ("TF_USE_LEGACY_KERAS", "TF_LMS_SIMULATOR_MEM_RATIO")

_FENCE = re.compile(r"^```python[ \t]*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->$")
_SET = re.compile(r"\bset\s+`([A-Z][A-Z0-9_]*)=([^`\s]*)`", re.I)

# line: the program's first line; not_run: the reason of a `not-run`
# comment or None; env: what the text right above says to set.
Block = collections.namedtuple("Block", "line code not_run env")


def doc_files():
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    files.append(os.path.join(ROOT, "DEVELOPERS.md"))
    return [f for f in files if os.path.exists(f)]


def python_blocks(path):
    """Every ```python block of the Markdown file `path`, as `Block`s."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if not _FENCE.match(lines[i]):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError("%s:%d: unclosed ```python block"
                                 % (path, i + 1))
        prev = i - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        match = _NOT_RUN.match(lines[prev].strip()) if prev >= 0 else None
        if match:
            prev -= 1
            while prev >= 0 and not lines[prev].strip():
                prev -= 1
        first = prev
        while first > 0 and lines[first - 1].strip():
            first -= 1
        above = " ".join(lines[first:prev + 1]) if prev >= 0 else ""
        blocks.append(Block(start + 1, "\n".join(lines[start:end]) + "\n",
                            match.group(1) if match else None,
                            dict(_SET.findall(above))))
        i = end + 1
    return blocks


def new_stack_lacks(code):
    """What `code` uses that the TensorFlow 2.16+ stack does not have
    ('tf.estimator' or 'Horovod'), or None."""
    if "estimator." in code:
        return "tf.estimator"
    if "import horovod" in code:
        return "Horovod"
    return None


# The import line of a program for Keras 3 (TensorFlow 2.16+) only.
KERAS3_ONLY = "import keras  # Keras 3: TensorFlow 2.16+"


def old_stack_lacks(code):
    """'Keras 3' if `code` is marked as a Keras 3 program (`KERAS3_ONLY`),
    which TensorFlow 2.15 does not have; else None."""
    return "Keras 3" if KERAS3_ONLY in code else None


def environment(block, base):
    """The environment `block` runs in for a reader whose own is `base`."""
    env = {k: v for k, v in base.items() if k not in SUITE_ONLY}
    env.update(block.env)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(python, block, folder, base, timeout):
    """Runs `block` as block.py with `python` in `folder`; returns the
    CompletedProcess (text output captured)."""
    script = os.path.join(str(folder), "block.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write(block.code)
    return subprocess.run([python, script], cwd=str(folder),
                          env=environment(block, base), capture_output=True,
                          text=True, timeout=timeout, check=False)
