"""The README's first command, ``python examples/demo.py``, as users run it.

It runs with its default sizes (the command the README shows) in a fresh
folder, so its plots land in that folder's ``.lms/``. It must say the model
does not fit the budget without LMS and fits with it, show the LMS log,
show that the swap ops ran, write the plots, and end with a PASS verdict
(same losses with and without LMS). The verdict logic itself is tested on
made-up losses, so a mismatch would be caught.
"""

import os
import re
import subprocess
import sys
import time

import pytest

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "examples")
DEMO = os.path.join(EXAMPLES_DIR, "demo.py")
sys.path.insert(0, EXAMPLES_DIR)

import demo  # noqa: E402
from _stack import NEW_STACK  # noqa: E402


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.time()
    proc = subprocess.run([sys.executable, DEMO], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=600,
                          check=False)
    seconds = time.time() - start
    print("demo.py took %.1f s" % seconds)
    return proc, cwd, seconds


def test_demo_passes_and_shows_the_plan(demo_run):
    proc, cwd, seconds = demo_run
    out = proc.stdout
    assert proc.returncode == 0, "stdout:\n%s\nstderr:\n%s" % (
        out[-3000:], proc.stderr[-3000:])
    assert seconds < 300, "the demo must finish in under 5 minutes"
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1].startswith("VERDICT: PASS"), lines[-1]
    assert "the loss fell" in lines[-1]

    assert re.search(r"Expected peak without LMS: +[0-9.]+ MiB +\(does NOT "
                     r"fit\)", out), out
    assert re.search(r"Expected peak with LMS: +[0-9.]+ MiB +\(fits\)", out)
    swapped = re.search(r"Tensors swapped to the host: +(\d+)", out)
    assert swapped and int(swapped.group(1)) > 0, out
    ran = re.search(r"Swap ops that ran: +(\d+) of the (\d+) LMS added", out)
    assert ran and int(ran.group(2)) > 0, out
    assert int(ran.group(1)) == int(ran.group(2)), ran.group(0)

    log = proc.stderr
    assert "[LMS][0] [Simulator] Found a parameter set" in log
    added = re.search(r"\[LMS\]\[0\] Added (\d+) operations", log)
    # What LMS added: the swap ops, and the clones of the tensors the
    # tuned plan recomputes instead (a line of its own when there are).
    cloned = re.search(r"Recomputed instead of swapped: +\d+ +\((\d+) "
                       r"cloned operations\)", out)
    assert added and int(added.group(1)) == int(ran.group(2)) + (
        int(cloned.group(1)) if cloned else 0)

    for name in ("memory_without_lms.png", "memory_with_lms.png"):
        path = os.path.join(str(cwd), ".lms", name)
        assert os.path.abspath(path) in out, "plot path not printed: " + name
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

    table = re.findall(r"^ +\d+ +([0-9.]+) +([0-9.]+)", out, re.M)
    steps = demo.parse_args([]).steps
    assert len(table) == steps
    assert all(a == b for a, b in table), table


@pytest.mark.skipif(not NEW_STACK, reason="Keras 3 needs TensorFlow "
                    "2.16+; on 2.15 the demo is Keras 2 in graph mode")
def test_demo_runs_keras3_on_the_newest_tensorflow(tmp_path):
    """The README's command on the newest TensorFlow, without the suite's
    TF_USE_LEGACY_KERAS: Keras 3, the LMS callback in eager mode, every
    swap op in the graphs TensorFlow ran, the same losses."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run([sys.executable, DEMO], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode == 0, "stdout:\n%s\nstderr:\n%s" % (
        out[-3000:], proc.stderr[-3000:])
    assert re.search(r"^Keras: Keras 3\.\S+ in eager mode", out, re.M), out
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1].startswith("VERDICT: PASS"), lines[-1]
    ran = re.search(r"Swap ops that ran: +(\d+) of the (\d+) LMS added "
                    r"\(in the graphs TensorFlow ran\)", out)
    assert ran and int(ran.group(2)) > 0, out
    assert int(ran.group(1)) == int(ran.group(2)), ran.group(0)
    assert ("Keras 3 fit: LMS rewrites the model's training step"
            in proc.stderr)


def test_verdict_fails_when_losses_differ(capsys):
    verdict, ok = demo.compare([2.0, 1.0], [2.0, 1.01])
    assert not ok and verdict.startswith("VERDICT: FAIL")
    verdict, ok = demo.compare([2.0, 1.0], [2.0])
    assert not ok and verdict.startswith("VERDICT: FAIL")
    verdict, ok = demo.compare([2.0, 1.0], [2.0, 1.0])
    assert ok and verdict.startswith("VERDICT: PASS")
    verdict, ok = demo.compare([2.0, 2.5], [2.0, 2.5])
    assert not ok, "a run whose loss did not fall must not pass"
    capsys.readouterr()


def test_demo_help():
    proc = subprocess.run([sys.executable, DEMO, "--help"],
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--image-size", "--batch-size", "--steps",
                 "--autotune-gpu-mem", "--plot-dir"):
        assert flag in proc.stdout


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
