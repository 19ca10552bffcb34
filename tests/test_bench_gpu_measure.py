"""benchmarks/gpu_measure.py: without a GPU it predicts, says so and
fills the page's table between its markers."""

import os
import subprocess
import sys

import pytest

from _benchmarks import ROOT
from benchmarks import gpu_measure

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_gpu_measure_without_a_gpu_predicts_and_says_so(tmp_path):
    """Without a GPU (none visible to CUDA) the command says so, plans and
    predicts a tiny model all the same, prints and writes the table with
    the measured columns empty, puts it between a page's markers, and
    exits with status 2 (nothing measured); ``--dry-run`` exits with 0."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    page = tmp_path / "page.md"
    page.write_text("before\n%s\nold table\n%s\nafter\n"
                    % (gpu_measure.BEGIN, gpu_measure.END))
    out = tmp_path / "table.md"
    script = os.path.join(ROOT, "benchmarks", "gpu_measure.py")
    proc = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--out", str(out),
         "--doc", str(page)], cwd=str(tmp_path), env=env,
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == gpu_measure.EXIT_CANNOT_RUN == 2, proc.stderr
    assert gpu_measure.NO_GPU_MESSAGE in proc.stderr
    table = out.read_text()
    assert table.strip() in proc.stdout
    assert "`python benchmarks/gpu_measure.py --model tiny` (" in table
    assert "no GPU used" in table
    rows = [line for line in table.splitlines() if line.startswith("| MLP")]
    assert len(rows) == 2
    without, with_lms = ([c.strip() for c in row.split("|")[1:-1]]
                         for row in rows)
    assert without[1] == "without LMS"
    assert with_lms[1].startswith("LMS, tuned for ")
    assert "swaps)" in with_lms[1]
    for cells in (without, with_lms):
        assert cells[2] == cells[4] == gpu_measure.NOT_MEASURED
        assert cells[3].endswith("iB") and cells[5].endswith(" ms")
    # The plan was made for less than the peak without it, and fits.
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    sim = [float(c[3].split()[0]) * units[c[3].split()[1]]
           for c in (without, with_lms)]
    assert sim[1] < sim[0]
    text = page.read_text()
    assert text.startswith("before\n" + gpu_measure.BEGIN)
    assert text.endswith(gpu_measure.END + "\nafter\n")
    assert "old table" not in text and rows[0] in text
    dry = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--dry-run"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=600, check=False)
    assert dry.returncode == 0, dry.stderr
    assert gpu_measure.NO_GPU_MESSAGE not in dry.stderr
    assert rows[0] in dry.stdout


def test_gpu_measure_wants_markers_on_the_page():
    with pytest.raises(ValueError, match=r"^the page has no <!-- "
                       r"gpu_measure table --> \.\.\. <!-- /gpu_measure "
                       r"table --> markers to put the table between$"):
        gpu_measure.with_table("no markers", "table")
