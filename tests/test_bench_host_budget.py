"""benchmarks/host_budget.py: which memory, device or host, bounds a
plan."""

import json

import pytest

from _benchmarks import run_script

# A benchmark script's table: the same on both stacks (conftest.py).
pytestmark = pytest.mark.one_stack


def test_host_budget_script_shows_which_memory_bound_the_plan():
    """benchmarks/host_budget.py on a 24^3 U-Net tuned for 16 MiB: a roomy
    host leaves the plan device-bound, 4 MiB makes the host stage recompute
    swapped tensors (recompute is off, so every recompute is the host's),
    1 MiB is more than recomputing can save."""
    proc = run_script("host_budget.py", [
        "unet3d", "--size", "24", "--gpu-mem", "0.016", "--host-gib", "1",
        "0.004", "0.001"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    roomy, tight, none = (json.loads(line) for line in lines[:3])
    assert (roomy["bound"], tight["bound"], none["bound"]) == (
        "device", "host", "host: no plan")
    assert roomy["recomputes"] == 0 and tight["recomputes"] > 0
    assert tight["host_peak_bytes"] <= 0.004 * (1 << 30) \
        < roomy["host_peak_bytes"]
    assert tight["device_peak_bytes"] <= tight["budget_bytes"]
    assert "autotune_host_mem=0.001" in none["error"]
    assert lines[-1].startswith(
        "| 3D U-Net 24^3, 16 filters, depth 4, batch 1 | 0.001 GiB | host: "
        "no plan |")
