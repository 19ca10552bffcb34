"""benchmarks/plan_cost.py: each plan's step against the step without
LMS, and the oracle's verdict on each applied plan."""

import json

import pytest

from _benchmarks import run_script
from benchmarks import measure
from benchmarks import plan_cost

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_plan_cost_script_sets_each_plan_against_the_step_without_lms():
    """benchmarks/plan_cost.py on a 24^3 U-Net tuned for 16 MiB over two
    links: a row per link and plan, each step at least the step without
    LMS (the same on both links: compute alone), the ratio their quotient,
    and the issue's goal for the link judged in the table."""
    proc = run_script("plan_cost.py", [
        "--cases", "unet3d:24:1", "--links", "pcie4", "nvlink2",
        "--gpu-mem", "0.016"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    plans = ("swap only, by time", "swap + recompute, by time",
             "default settings")
    assert [(r["interconnect"], r["plan"]) for r in rows] == [
        (link, plan) for link in ("pcie4", "nvlink2") for plan in plans]
    # The default settings recompute when auto-tuning: the plan of
    # recompute=True, on each link.
    for k in (0, 3):
        with_recompute, default = rows[k + 1], rows[k + 2]
        assert {key: default[key] for key in default if key != "plan_s"
                and key != "plan"} == {key: with_recompute[key]
                                       for key in with_recompute
                                       if key not in ("plan_s", "plan")}
    assert len({r["without_lms_ms"] for r in rows}) == 1
    for row in rows:
        assert row["swaps"] > 0
        assert row["step_ms"] >= row["without_lms_ms"]
        # The idle time is the step's excess over the graph's own compute
        # (copies waited for, clones), and the waits listed are the
        # longest parts of it.
        assert row["idle_ms"] == pytest.approx(
            row["step_ms"] - row["without_lms_ms"], abs=0.3)
        assert sum(w[0] for w in row["waits"]) <= row["idle_ms"] + 0.1
        assert all(w[2] in ("out", "in") for w in row["waits"])
        assert row["ratio"] == round(row["step_ms"] / row["without_lms_ms"],
                                     3)
    table = [line for line in lines if line.startswith("| 3D U-Net")]
    assert len(table) == 6
    assert table[0].endswith("| %.2fx | 1.4x: %s |" % (
        rows[0]["ratio"], "met" if rows[0]["ratio"] <= 1.4 else "missed"))
    assert table[3].endswith("| 1.1x: %s |" % (
        "met" if rows[3]["ratio"] <= 1.1 else "missed"))


def test_plan_cost_oracle_judges_each_applied_plan_against_its_budget(
        monkeypatch):
    """plan_cost's ``--oracle`` path on a 48^3 U-Net planned for 52 MiB
    over PCIe (its recompute plan recomputes a tensor): each plan is
    applied to a build of its own (swap ops, and recompute clones where it
    recomputes) before the oracle replays it; the row's oracle peak is the
    replay's, lower than the oracle's peak without LMS and near the
    simulator's instant count; the verdict is that peak against the
    planning budget, in the JSON and the table, and turns to "no" when
    the replay's peak is above the budget."""
    from benchmarks import models
    from tflms import budget
    gpu_mem = 0.052
    limit = budget.device_budget(gpu_mem)
    real = measure.oracle_peaks
    seen = []

    def spy(graph, fetch, **kwargs):
        peaks = real(graph, fetch, **kwargs)
        names = [op.name for op in graph.get_operations()]
        seen.append((peaks, sum("lms/swapout_" in n for n in names),
                     sum("lms/recompute_" in n for n in names)))
        return peaks

    monkeypatch.setattr(measure, "oracle_peaks", spy)
    case = [("unet3d", 48, 1)]
    rows = plan_cost.measure(case, ("pcie4",), gpu_mem, oracle=True)
    assert [r["plan"] for r in rows] == list(plan_cost.PLANS)
    assert rows[1]["recomputes"] > 0
    built = models.build_sized("unet3d", 48, 1)
    without = real(built.graph, built.train_op)["gpu_peak"]
    table = plan_cost.table(rows)[2:]
    for row, (peaks, swapouts, clones), line in zip(rows, seen, table):
        assert swapouts == row["swaps"]
        assert (clones > 0) == (row["recomputes"] > 0)
        assert row["oracle_gib"] == round(peaks["gpu_peak"] / measure.GIB, 3)
        assert row["grappler_gib"] == round(
            peaks["raw_gpu_peak"] / measure.GIB, 3)
        assert 0 < peaks["gpu_peak"] < without
        # Section 5 holds the simulator within 5% of the runtime replay.
        assert row["oracle_gib"] == pytest.approx(row["sim_instant_gib"],
                                                  rel=0.05)
        assert row["oracle_fits"] is (peaks["gpu_peak"] <= limit)
        assert line.endswith("| %.2f | %s |" % (
            row["grappler_gib"], "yes" if row["oracle_fits"] else "**no**"))

    def over(graph, fetch, **kwargs):
        return dict(real(graph, fetch, **kwargs), gpu_peak=limit + 1)

    monkeypatch.setattr(measure, "oracle_peaks", over)
    rows = plan_cost.measure(case, ("pcie4",), gpu_mem, oracle=True)
    assert [r["oracle_fits"] for r in rows] == [False] * len(plan_cost.PLANS)
    assert all(line.endswith("| **no** |")
               for line in plan_cost.table(rows)[2:])
