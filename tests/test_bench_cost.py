"""benchmarks/cost.py: the transfer time of a plan's copies per step."""

from benchmarks import cost


def test_transfer_time_uses_the_larger_direction():
    data = [{"case": {"model": "m"}, "configs": {
        "none": {"step_s": 0.5},
        "tflms_auto": {"swapout_bytes": int(15.75e9), "swapin_bytes":
                       int(31.5e9)}}}]
    text = cost.transfer_table(data)
    row = [line for line in text.splitlines() if "tflms auto" in line][0]
    # 31.5 GB over PCIe 3.0 x16 (15.75 GB/s) is 2 s, four times the step.
    assert "| 2.00 s (4.00x) |" in row
    assert "| 1.00 s (2.00x) |" in row   # PCIe 4.0
