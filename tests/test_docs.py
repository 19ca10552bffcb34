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
"""

import glob
import os
import re
import subprocess
import sys

import pytest

from _stack import ESTIMATOR_REASON, HOROVOD_REASON, NEW_STACK
from tflms import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240

_FENCE = re.compile(r"^```python[ \t]*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->$")


def doc_files():
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    files.append(os.path.join(ROOT, "DEVELOPERS.md"))
    return [f for f in files if os.path.exists(f)]


def python_blocks(path):
    """``(first line number, code, not-run reason or None)`` per block."""
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
        blocks.append((start + 1, "\n".join(lines[start:end]) + "\n",
                       match.group(1) if match else None))
        i = end + 1
    return blocks


def all_blocks():
    params = []
    for path in doc_files():
        rel = os.path.relpath(path, ROOT)
        for line, code, reason in python_blocks(path):
            params.append(pytest.param(code, reason,
                                       id="%s:%d" % (rel, line)))
    return params


BLOCKS = all_blocks()


@pytest.mark.parametrize("code, reason", BLOCKS)
def test_doc_block_runs(code, reason, tmp_path):
    if reason is not None:
        # Marked in the docs as not runnable here (the reason is in the
        # docs): it must still be valid Python.
        compile(code, "<doc block: %s>" % reason, "exec")
        return
    if NEW_STACK and "estimator." in code:
        compile(code, "<doc block>", "exec")
        pytest.skip(ESTIMATOR_REASON)
    if NEW_STACK and "import horovod" in code:
        compile(code, "<doc block>", "exec")
        pytest.skip(HOROVOD_REASON)
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_LMS_SIMULATOR_MEM_RATIO", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, (
        "block failed with status %d\n--- code\n%s--- stdout\n%s\n--- stderr"
        "\n%s" % (proc.returncode, code, proc.stdout[-2000:],
                  proc.stderr[-4000:]))


def test_docs_have_runnable_blocks():
    runnable = [b for b in BLOCKS if b.values[1] is None]
    assert len(runnable) >= 8, "expected the docs to carry runnable code"
    skipped = len(BLOCKS) - len(runnable)
    assert skipped <= 3, ("not-run is for rare cases; %d blocks use it"
                          % skipped)


def test_block_extraction(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n```python\nprint(1)\n```\n\n<!-- not-run: needs a GPU -->\n\n"
        "```python\nimport gpu\n```\n```sh\nls\n```\n", encoding="utf-8")
    blocks = python_blocks(str(doc))
    assert blocks == [(3, "print(1)\n", None),
                      (9, "import gpu\n", "needs a GPU")]
    doc.write_text("```python\nprint(1)\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="unclosed"):
        python_blocks(str(doc))


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


def test_parameter_tables_are_made_from_the_settings():
    """docs/parameters.md's two tables are `settings.markdown_table`'s; the
    prose around them is the page's own."""
    path = os.path.join(ROOT, "docs", "parameters.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for kind in (settings.CONSTRUCTOR, settings.PROPERTY):
        assert settings.markdown_table(kind) + "\n" in text, kind
    assert settings.with_tables(text) == text, (
        "docs/parameters.md's tables differ from tflms/settings.py; "
        "regenerate them with: python -m tflms.settings --write "
        "docs/parameters.md")


def test_with_tables_keeps_the_prose():
    page = ("# P\n\nintro\n\n## Constructor arguments\n\n| old |\n| --- |\n"
            "| x |\n\nafter 1\n\n## Properties\n\ntext\n\n| old |\n"
            "| --- |\n\nafter 2\n")
    new = settings.with_tables(page)
    assert new == (
        "# P\n\nintro\n\n## Constructor arguments\n\n"
        + settings.markdown_table(settings.CONSTRUCTOR) + "\n\nafter 1\n\n"
        "## Properties\n\ntext\n\n"
        + settings.markdown_table(settings.PROPERTY) + "\n\nafter 2\n")
    assert settings.with_tables(new) == new
    with pytest.raises(ValueError, match="needs a '## Properties' heading"):
        settings.with_tables("## Constructor arguments\n\n| a |\n")
