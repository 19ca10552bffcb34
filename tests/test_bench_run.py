"""The benchmark suite runs end to end: ``python benchmarks/run.py --suite
smoke`` (the smallest graphs, every section once) in a subprocess, its JSON
and markdown checked section by section: every case finished, and the
numbers relate the way the measurements promise (LMS lowers the oracle's
GPU peak, the capacity search finds a size that fits and one that does
not, the swap ops ran)."""

import json
import math
import os
import subprocess
import sys

import pytest

from _benchmarks import ROOT
from benchmarks import measure
from benchmarks import timing

# The benchmarks' code is the same on both stacks and the tables it prints
# were measured on TensorFlow 2.15: run once (tools/run_tests.sh).
pytestmark = pytest.mark.one_stack


def _run_smoke(out):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "run.py"),
         "--suite", "smoke", "--jobs", "2", "--out", str(out)],
        cwd=str(out), capture_output=True, text=True, timeout=600,
        check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        data = json.load(f)
    with open(out / "report.md", encoding="utf-8") as f:
        text = f.read()
    return out, data, text, proc.stdout


def test_smoke_suite(tmp_path):
    """One run of the smoke suite (one test, so parallel test workers do not
    each run it), checked section by section."""
    smoke = _run_smoke(tmp_path)
    _check_every_case_finished(smoke)
    _check_timing_rows(smoke)
    _check_memory(smoke)
    _check_capacity(smoke)
    _check_cost_and_fidelity(smoke)
    _check_report(smoke)


def _check_every_case_finished(smoke):
    _, data, _, _ = smoke
    assert set(data["sections"]) == {"timing", "memory", "capacity", "cost",
                                     "fidelity"}
    for section, results in data["sections"].items():
        assert results, section
        for r in results:
            assert "error" not in r, (section, r.get("case"), r["error"])
            assert r["done"] is True, (section, r.get("case"))
    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["tensorflow"] != "unknown"


def _check_timing_rows(smoke):
    _, data, _, _ = smoke
    for r in data["sections"]["timing"]:
        assert r["ops"] > 100 and r["levels"] > 10
        assert len(r["runs"]) == r["case"]["reps"]
        s = timing.summarize(r)
        for phase in timing.PHASES:
            assert s[phase + "_s"] is not None and s[phase + "_s"] > 0, phase
            assert 0 < s[phase + "_cpu_s"] < 2 * s[phase + "_s"] + 0.05, phase
        assert math.isclose(s["auto_total_s"], s["analysis_s"] + s["tune_s"]
                            + s["rewrite_s"])
        assert math.isclose(s["auto_total_cpu_s"], s["analysis_cpu_s"]
                            + s["tune_cpu_s"] + s["rewrite_cpu_s"])
        # The budget is below the step's need, so LMS swapped something.
        assert r["runs"][-1]["tuned_swaps"] > 0
        assert r["runs"][-1]["fixed_swaps"] > 0


def _check_memory(smoke):
    """tflms lowers the oracle's GPU peak under the budget."""
    _, data, _, _ = smoke
    (r,) = data["sections"]["memory"]
    configs = r["configs"]
    budget = r["case"]["budget_gib"] * measure.GIB
    none = configs["none"]["gpu_peak"]
    assert none > budget
    for key in ("tflms_auto", "tflms_fixed"):
        assert configs[key]["status"] == "swapped"
        assert configs[key]["gpu_peak"] < none
        assert configs[key]["swapout_bytes"] > 0
        assert configs[key]["host_peak"] > 0
    assert configs["tflms_auto"]["gpu_peak"] <= budget
    for key in ("tf_swap", "tf_recompute"):
        assert "error" not in configs[key]
        assert configs[key]["gpu_peak"] > 0


def _check_capacity(smoke):
    """Every search brackets its answer with oracle probes."""
    _, data, _, _ = smoke
    (r,) = data["sections"]["capacity"]
    budget = r["case"]["budget_gib"] * measure.GIB
    probes = r["probes"]
    for method in ("none", "tf_swap", "tflms"):
        res = r["results"][method]
        largest, failing = res["largest"], res["smallest_failing"]
        assert largest > 0 and failing is not None and failing > largest
        mine = {p["size"]: p for p in probes if p["method"] == method}
        # The reported sizes are backed by oracle probes.
        assert mine[largest]["fits"] and mine[largest]["gpu_peak"] <= budget
        assert not mine[failing]["fits"]
    assert r["results"]["tflms"]["largest"] >= r["results"]["none"]["largest"]


def _check_cost_and_fidelity(smoke):
    _, data, _, _ = smoke
    (step,) = data["sections"]["cost"]
    assert step["without"]["step_s"] > 0 and step["with"]["step_s"] > 0
    assert step["without"]["swap_ops_run"] == 0
    assert step["with"]["swap_ops_run"] > 0
    for fid in data["sections"]["fidelity"]:
        for key in ("sim_none", "runtime_none", "raw_none"):
            assert fid[key] > 0, key
        assert fid["real_off"]["all"] >= fid["real_off"]["outputs"] > 0
        (plan,) = fid["plans"]
        assert plan["swaps"] > 0
        for key in ("sim", "runtime", "raw"):
            assert plan[key] > 0, key
    # The ref-variable MLP: each variable (2 MiB in all) counted once on
    # both sides; they differ by a few shape constants (about 100 bytes).
    (mlp,) = [f for f in data["sections"]["fidelity"]
              if f["case"]["model"] == "mlp"]
    assert abs(mlp["sim_none"] - mlp["runtime_none"]) <= 1024


def _check_report(smoke):
    out, data, text, stdout = smoke
    assert text.strip() in stdout
    for heading in ("## 1. Time before training starts",
                    "## 2. Device memory saved", "## 3. How much bigger",
                    "## 4. Cost per step", "## 5. Simulator fidelity"):
        assert heading in text
    assert "| synthetic 2k ops | %d |" % data["sections"]["timing"][0]["ops"] \
        in text
    assert "Where tflms is behind TensorFlow's own swapping" in text
    for name in data["plots"]:
        assert (out / name).stat().st_size > 1000
