"""Runs the README's programs the way a newcomer runs them.

Usage: python tools/newcomer.py VENV [--readme PATH]

Reads the README as it is now and takes every ```python program from its
text (tests/_doc_blocks.py, the extraction tests/test_docs.py uses). Each
program runs with VENV/bin/python, the venv the README's set-up command
made, from an empty folder outside the checkout (so `tflms` comes from the
venv, not from the current folder), in a bare environment: PATH, HOME and
the locale only, none of the suite's variables (TF_USE_LEGACY_KERAS,
TF_ENABLE_ONEDNN_OPTS, PYTHONPATH...), plus what the paragraph right above
the program tells the reader to set. Programs using tf.estimator or Horovod
are skipped on TensorFlow 2.16+, where the README says they do not run.

Prints one line per program (PASS, FAIL with its output, SKIP with the
reason); exit status 1 if any failed. tools/run_tests.sh runs it on
TensorFlow 2.15, tools/ci_tf_latest.sh on the newest TensorFlow.
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))

import _doc_blocks  # noqa: E402

TIMEOUT = 300
BARE = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def tensorflow_version(python):
    out = subprocess.run(
        [python, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True, text=True, check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")).stdout
    return tuple(int(p) for p in out.split()[-1].split(".")[:2])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("venv", help="the venv made the README's way")
    parser.add_argument("--readme", default=os.path.join(_doc_blocks.ROOT,
                                                         "README.md"))
    args = parser.parse_args(argv)
    python = os.path.join(os.path.abspath(args.venv), "bin", "python")
    name = os.path.basename(args.readme)
    base = {k: os.environ[k] for k in BARE if k in os.environ}
    version = None
    failed = 0
    for block in _doc_blocks.python_blocks(args.readme):
        where = "%s:%d" % (name, block.line)
        lacks = _doc_blocks.new_stack_lacks(block.code)
        if lacks and version is None:
            version = tensorflow_version(python)
        if block.not_run is not None or (lacks and version >= (2, 16)):
            print("SKIP %s: %s" % (where, block.not_run or "%s is not on "
                                   "TensorFlow %d.%d" % ((lacks,) + version)))
            continue
        with tempfile.TemporaryDirectory(prefix="tflms-newcomer-") as folder:
            proc = _doc_blocks.run(python, block, folder, base, TIMEOUT)
        told = " ".join("%s=%s" % kv for kv in sorted(block.env.items()))
        if proc.returncode == 0:
            print("PASS %s%s" % (where, " (%s)" % told if told else ""))
            continue
        failed += 1
        print("FAIL %s (status %d; %s)\n%s\n%s" % (
            where, proc.returncode, told or "no variable set",
            proc.stdout[-2000:], proc.stderr[-4000:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
