"""Every ```python block in README.md, docs/*.md and DEVELOPERS.md runs.

Each block is a complete program: it runs on its own in a subprocess, in a
fresh folder, and must exit with status 0 within the timeout. A block may
opt out only with an HTML comment on the line just before its fence
(blank lines allowed in between), which readers do not see but reviewers do:

    <!-- not-run: needs a GPU -->

The reason is required, and such a block is still compiled. Blocks that use
tf.estimator or Horovod are only compiled on TensorFlow 2.16+ (tf.estimator
was removed there, Horovod does not build; tests/_stack.py).
Blocks in other languages (sh, text...) are not run.

A block runs as a reader would run it (tests/_doc_blocks.py): without the
variables only the test suite sets, TF_USE_LEGACY_KERAS among them, unless
the paragraph right above the block says "set `NAME=value`". So on
TensorFlow 2.16+ a program that needs Keras 2 must say how it gets it.
tools/newcomer.py runs the README's programs the same way in a given venv;
where tools/run_tests.sh runs it (TFLMS_README_BY_NEWCOMER=1) this test
leaves the README to it.
"""

import os
import re
import subprocess
import sys

import pytest

import _doc_blocks
from _doc_blocks import ROOT, doc_files, python_blocks
from _stack import ESTIMATOR_REASON, HOROVOD_REASON, NEW_STACK

TIMEOUT = 240
NEW_STACK_REASONS = {"tf.estimator": ESTIMATOR_REASON,
                     "Horovod": HOROVOD_REASON}


# tools/run_tests.sh runs tools/newcomer.py after each stack's pass, which
# runs the README's programs as a reader does (a bare environment, the
# installed package): there this test leaves them to it.
README_BY_NEWCOMER = os.environ.get("TFLMS_README_BY_NEWCOMER") == "1"


def all_blocks():
    params = []
    for path in doc_files():
        rel = os.path.relpath(path, ROOT)
        if README_BY_NEWCOMER and rel == "README.md":
            continue
        for block in python_blocks(path):
            params.append(pytest.param(block,
                                       id="%s:%d" % (rel, block.line)))
    return params


BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS)
def test_doc_block_runs(block, tmp_path):
    if block.not_run is not None:
        # Marked in the docs as not runnable here (the reason is in the
        # docs): it must still be valid Python.
        compile(block.code, "<doc block: %s>" % block.not_run, "exec")
        return
    lacks = _doc_blocks.new_stack_lacks(block.code)
    if NEW_STACK and lacks:
        compile(block.code, "<doc block>", "exec")
        pytest.skip(NEW_STACK_REASONS[lacks])
    if not NEW_STACK and _doc_blocks.old_stack_lacks(block.code):
        compile(block.code, "<doc block>", "exec")
        pytest.skip("a Keras 3 program; on TensorFlow 2.15 keras is Keras 2")
    # The reader's environment: this one, without what only the suite sets
    # (tools/ci_tf_latest.sh sets TF_USE_LEGACY_KERAS for the tests, not
    # for the docs' readers), with what the text above the block says.
    proc = _doc_blocks.run(sys.executable, block, tmp_path,
                           dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                           TIMEOUT)
    assert proc.returncode == 0, (
        "block failed with status %d (environment: %s)\n--- code\n%s"
        "--- stdout\n%s\n--- stderr\n%s" % (
            proc.returncode, block.env or "no variable from the text",
            block.code, proc.stdout[-2000:], proc.stderr[-4000:]))


def test_docs_have_runnable_blocks():
    runnable = [b for b in BLOCKS if b.values[0].not_run is None]
    assert len(runnable) >= 8, "expected the docs to carry runnable code"
    skipped = len(BLOCKS) - len(runnable)
    # Today: two GPUs, and three jobs of several processes (Horovod ranks,
    # the Estimator's and a custom loop's MultiWorkerMirroredStrategy
    # workers), each run whole by a test job or an example.
    assert skipped <= 4, ("not-run is for rare cases; %d blocks use it"
                          % skipped)


def test_block_extraction(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n```python\nprint(1)\n```\n\n<!-- not-run: needs a GPU -->\n\n"
        "```python\nimport gpu\n```\n```sh\nls\n```\n", encoding="utf-8")
    blocks = python_blocks(str(doc))
    assert blocks == [(3, "print(1)\n", None, {}),
                      (9, "import gpu\n", "needs a GPU", {})]
    doc.write_text("```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="unclosed"):
        python_blocks(str(doc))


def test_block_environment_is_the_readers(tmp_path):
    """The suite's TF_USE_LEGACY_KERAS does not reach a block; a variable
    the paragraph right above tells the reader to set does."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "Before you start,\nset `TF_USE_LEGACY_KERAS=1` and run:\n\n"
        "<!-- not-run: example -->\n```python\nprint(2)\n```\n\n"
        "Set `A=1` in one paragraph.\n\nNot this one: `B=2`.\n\n"
        "```python\nimport os\nprint(os.environ.get('TF_USE_LEGACY_KERAS'))\n"
        "```\n", encoding="utf-8")
    told, untold = python_blocks(str(doc))
    assert told.env == {"TF_USE_LEGACY_KERAS": "1"}
    assert untold.env == {}
    suite = {"TF_USE_LEGACY_KERAS": "1", "TF_LMS_SIMULATOR_MEM_RATIO": "0.5",
             "PATH": os.environ["PATH"]}
    assert _doc_blocks.environment(told, suite) == {
        "TF_USE_LEGACY_KERAS": "1", "PATH": os.environ["PATH"],
        "PYTHONUNBUFFERED": "1"}
    proc = _doc_blocks.run(sys.executable, untold, tmp_path, suite, 60)
    assert (proc.returncode, proc.stdout) == (0, "None\n")


def test_newcomer_runs_the_readme_programs_as_written(tmp_path):
    """tools/newcomer.py: a bare environment plus what the text says, one
    line per program, status 1 when one fails."""
    readme = tmp_path / "README.md"
    readme.write_text(
        "```python\nimport os\nassert 'HOME' in os.environ\n"
        "assert 'TF_CPP_MIN_LOG_LEVEL' not in os.environ\n```\n\n"
        "Then set `LMS_DOC_X=7`:\n\n```python\nimport os, sys\n"
        "sys.exit(int(os.environ['LMS_DOC_X']))\n```\n", encoding="utf-8")
    venv = os.path.dirname(os.path.dirname(sys.executable))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "newcomer.py"), venv,
         "--readme", str(readme)], capture_output=True, text=True,
        timeout=120, check=False,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PASS README.md:2" in proc.stdout
    assert "FAIL README.md:10 (status 7; LMS_DOC_X=7)" in proc.stdout


def test_relative_links_resolve():
    """Links between the docs point at files that exist (or that other
    pages of the docs set are expected to provide)."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    missing = []
    for path in doc_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for target in link.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            full = os.path.normpath(os.path.join(os.path.dirname(path),
                                                 target))
            if not os.path.exists(full):
                missing.append("%s -> %s" % (os.path.relpath(path, ROOT),
                                             target))
    assert not missing, "broken links: %s" % missing


def _sh_blocks(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```sh\n(.*?)^```", f.read(), re.M | re.S)


def test_readme_starts_with_the_demo_and_the_ci_command():
    """The README's two set-up commands: the demo, then exactly the command
    .ci/run runs."""
    blocks = _sh_blocks(os.path.join(ROOT, "README.md"))
    assert len(blocks) >= 2
    demo, tests = blocks[0].strip(), blocks[1].strip()
    assert demo.startswith("python3.11 -m venv .venv && ")
    assert demo.endswith(".venv/bin/python examples/demo.py")
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line for line in f.read().splitlines()
              if line.strip() and not line.startswith("#")
              and not line.startswith(("set ", "cd "))]
    assert ci[-1] == tests, "README test command differs from .ci/run"
