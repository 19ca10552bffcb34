"""benchmarks/goal_plans.py: a plan measured with copies instant and
timed."""

import json

import pytest

from _benchmarks import run_script

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_goal_plans_script_measures_a_plan_instant_and_timed():
    """benchmarks/goal_plans.py on a 24^3 U-Net tuned for 16 MiB: one
    JSON line and a table row; a slower link never lowers the oracle's
    timed peak, and a link never lowers it below the instant replay."""
    proc = run_script("goal_plans.py", [
        "--case", "unet3d:24", "--gpu-mem", "0.016", "--links",
        "nvlink2,pcie4"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    row = json.loads(lines[0])
    assert row["status"] == "swapped" and len(row["params"]) == 4
    assert row["oracle_instant_gib"] <= row["oracle_nvlink2_gib"] \
        <= row["oracle_pcie4_gib"]
    assert row["sim_instant_gib"] <= row["sim_peak_gib"] <= 0.016
    assert lines[-1].startswith("| 3D U-Net 24^3 | %s |" % ", ".join(
        str(p) for p in row["params"]))
