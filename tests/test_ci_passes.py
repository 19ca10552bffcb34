"""The passes of tools/run_tests.sh leave no test out.

Each Keras 3 case CI trains runs in one oneDNN mode: the newest stack's
pass (oneDNN on) leaves out the cases marked `onednn_off_pass`, and the
Python 3.13 pass (tools/ci_py313.sh, oneDNN off) runs only those, from the
files it names. A case so marked in a file that pass does not name would
run nowhere. Reads the files as text: nothing is imported.
"""

import os
import re

from _doc_blocks import ROOT

TESTS = os.path.join(ROOT, "tests")
OFF_PASS = os.path.join(ROOT, "tools", "ci_py313.sh")


def _text(name):
    with open(os.path.join(TESTS, name), encoding="utf-8") as f:
        return f.read()


def _files_marking(marker):
    return sorted(
        name for name in os.listdir(TESTS)
        if name.startswith("test_") and name.endswith(".py")
        and name != "test_ci_passes.py"
        and re.search(r"\b%s\b" % marker, _text(name)))


def _files_run_by(script):
    with open(script, encoding="utf-8") as f:
        text = f.read()
    return set(re.findall(r"tests/(test_\w+\.py)", text))


def test_every_case_for_the_onednn_off_pass_is_in_a_file_it_runs():
    marking = _files_marking("onednn_off_pass")
    assert marking, "no test file marks onednn_off_pass: the pattern is stale"
    missing = [name for name in marking
               if name not in _files_run_by(OFF_PASS)]
    assert not missing, (
        "%s mark cases onednn_off_pass, which the newest stack's pass leaves "
        "out, but tools/ci_py313.sh does not run them: add the files to its "
        "pytest command" % missing)


def test_the_check_sees_a_file_left_out(tmp_path):
    script = tmp_path / "ci.sh"
    script.write_text("pytest tests/test_keras3_fit.py -m onednn_off_pass\n")
    marking = _files_marking("onednn_off_pass")
    assert "test_keras3_fit.py" in marking
    assert [n for n in marking if n not in _files_run_by(str(script))]
