"""benchmarks/capacity.py: the search for the largest size that fits, the
capacity worker's predicted steps and the text that states its planning
ratio."""

import pytest

from _benchmarks import tiny_capacity_case
from benchmarks import capacity
from benchmarks import measure
from benchmarks import report

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_largest_fitting_finds_the_boundary_with_few_probes():
    calls = []

    def fits(size):
        calls.append(size)
        return size <= 1000

    good, bad = capacity.largest_fitting(fits, 300, step=8, tolerance=0.0,
                                         min_size=8, max_size=1 << 20)
    assert good == 1000 and bad == 1008
    assert len(calls) <= 16
    good, bad = capacity.largest_fitting(fits, 5000, step=8, tolerance=0.0,
                                         min_size=8, max_size=1 << 20)
    assert (good, bad) == (1000, 1008)
    # Within a relative tolerance.
    good, bad = capacity.largest_fitting(fits, 5000, step=8, tolerance=0.05,
                                         min_size=8, max_size=1 << 20)
    assert good <= 1000 < bad and bad - good <= 0.05 * good


def test_largest_fitting_at_the_ends_of_the_range():
    assert capacity.largest_fitting(lambda s: False, 64, 8, 0.1, 8, 512) \
        == (0, 8)
    assert capacity.largest_fitting(lambda s: True, 64, 8, 0.1, 8, 512) \
        == (512, None)


def test_capacity_predicts_the_step_of_each_size():
    """The capacity worker (its own process, as `run.py` runs it) with
    TF_LMS_SIMULATOR_MEM_RATIO=1, what ``run.py --mem-ratio 1`` passes:
    tflms then plans for the whole budget. Every fitting no-LMS probe and
    every planned tflms probe carries its predicted step, and the step table
    is the arithmetic of those numbers."""
    from benchmarks import common
    from tflms.settings import Settings
    case = tiny_capacity_case()
    r = common.run_case("capacity", case, case["timeout_s"] * 4,
                        env={"TF_LMS_SIMULATOR_MEM_RATIO": "1"})
    assert "error" not in r and r["done"], r.get("error")
    assert r["mem_ratio"] == 1.0
    budget = case["budget_gib"] * measure.GIB
    gpu = Settings().gpu
    planned = 0
    for p in r["probes"]:
        step = p.get("predicted_step")
        if p["method"] == "none":
            # Predicted exactly where the size fits.
            assert (step is not None) == p["fits"], p
            if step is not None:
                assert step["gpu"] == gpu and step["without_lms_s"] > 0
            continue
        if p.get("status") == "no fit":
            assert step is None
            continue
        planned += 1
        assert step["gpu"] == gpu and step["without_lms_s"] > 0, p
        assert set(step["links"]) == set(measure.STEP_LINKS)
        for link, v in step["links"].items():
            # Copies and recomputes only add to the graph's own compute.
            assert v["with_lms_s"] >= step["without_lms_s"], (link, p)
            assert v["exposed_s"] >= 0 and v["recompute_s"] >= 0
            assert v["with_lms_s"] == pytest.approx(
                step["without_lms_s"] + v["exposed_s"] + v["recompute_s"])
        # The same plan over a faster link waits no longer.
        assert step["links"]["nvlink2"]["with_lms_s"] <= \
            step["links"]["pcie4"]["with_lms_s"]
        if p["fits"]:
            # Planned for the whole budget: the simulator's peak is within
            # it, not within 0.9 of it only.
            assert p["sim_peak"] <= budget
    assert planned > 0

    # The step table's numbers, by hand from the JSON.
    none_size = r["results"]["none"]["largest"]
    lms_size = r["results"]["tflms"]["largest"]
    assert 0 < none_size <= lms_size
    (none,) = [p for p in r["probes"]
               if p["method"] == "none" and p["size"] == none_size]
    (lms,) = [p for p in r["probes"]
              if p["method"] == "tflms" and p["size"] == lms_size]
    ratio = lms_size / none_size
    scaled = none["predicted_step"]["without_lms_s"] * ratio ** 3  # voxels
    steps = capacity.scaled_steps(r)
    assert steps["none_size"] == none_size
    assert steps["tflms_size"] == lms_size
    assert steps["scale"] == pytest.approx(ratio ** 3)
    assert steps["scaled_step_s"] == pytest.approx(scaled)
    assert steps["compute_s"] == lms["predicted_step"]["without_lms_s"]
    for link in measure.STEP_LINKS:
        v = lms["predicted_step"]["links"][link]
        assert steps["links"][link]["with_lms_s"] == v["with_lms_s"]
        assert steps["links"][link]["ratio"] == pytest.approx(
            v["with_lms_s"] / scaled)

    # Rendered: the first table, then the step table with this case's row.
    text = capacity.tables([r])
    assert "| tflms size | step, PCIe 4.0 x16 (exposed) | step, NVLink 2.0 " \
        "(exposed) |" in text
    (row,) = [line for line in text.splitlines()
              if line.startswith("| %s | volume | 0.01 GiB | %d | "
                              % (case["label"], lms_size))]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2:] == ["%.2f" % (steps["links"][link]["ratio"])
                          for link in measure.STEP_LINKS]
    assert cells[-3] == "%.1f ms (x%.2f)" % (scaled * 1e3, ratio ** 3)
    report_text = report.render({"mem_ratio": 1.0,
                                 "sections": {"capacity": [r]}})
    assert "tflms auto-tuned to 1 of each budget" in report_text
    assert "planned for the whole budget" in report_text
    assert "10% headroom" not in report_text


def test_capacity_text_states_the_planning_ratio():
    """The findings and the section's note name the ratio the capacity
    searches planned with: 0.9 leaves 10% headroom, 1 leaves none."""
    gib = 1 << 30
    search = {"case": {"budget_gib": 1.0}, "results": {}, "probes": [
        {"method": "tflms", "size": 8, "sim_peak": gib,
         "gpu_peak": int(1.05 * gib), "fits": False}]}
    for ratio, said, unsaid in (
            (0.9, "within the 10% headroom of TF_LMS_SIMULATOR_MEM_RATIO=0.9",
             "no headroom"),
            (1.0, "with TF_LMS_SIMULATOR_MEM_RATIO=1, which leaves no "
             "headroom", "10% headroom")):
        data = {"sections": {"capacity": [dict(search, mem_ratio=ratio)]}}
        facts = " ".join(report.findings(data))
        assert said in facts and unsaid not in facts
        note = capacity.budget_note(data["sections"]["capacity"])
        assert ("conservative" in note) == (ratio < 1)
    # The gap is taken against the simulator's count with copies instant
    # (as the oracle replays them) where the probe has one.
    timed = {"method": "tflms", "size": 8, "sim_peak": int(1.5 * gib),
             "sim_instant_peak": gib, "gpu_peak": int(1.05 * gib),
             "fits": False}
    data = {"sections": {"capacity": [dict(search, probes=[timed],
                                           mem_ratio=0.9)]}}
    assert "peak +5.0% to +5.0% against what the simulator counts" in \
        " ".join(report.findings(data))
    # Where the oracle stopped the search, the same count is named.
    stopped = dict(search, probes=[timed],
                   results={"tflms": {"smallest_failing": 8}})
    assert capacity._stopper(stopped) == (
        "at 8: oracle 1.05 GiB, simulator 1.00 GiB")
    # `run.py --mem-ratio 1` is accepted: the worker's environment says 1.
    from benchmarks import run
    assert run._parse(["--mem-ratio", "1"]).mem_ratio == 1.0
    # Results from before the workers recorded their ratio: the run's.
    assert "to 0.8 of each budget" in capacity.budget_note([search], 0.8)
    assert capacity.budget_note([search]) == ""
    # A search without predicted steps (older results) renders dashes.
    assert capacity.scaled_steps(search) is None
    assert capacity.step_table([search]).splitlines()[2].endswith(
        " | - | - | - | - | - | - | - | - |")
