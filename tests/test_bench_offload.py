"""benchmarks/offload.py: the zoo's Transformer planned with and without
``offload_optimizer`` on a budget between the two floors."""

from benchmarks import offload


def test_a_budget_between_the_floors_fits_only_with_offload():
    row = offload.measure(layers=1, d_model=64, seq=16, batch=2)
    assert row["resident_mib"] - row["resident_offload_mib"] \
        == row["slots_mib"]
    assert row["slots_mib"] == 2 * row["weights_mib"]  # Adam's moments
    assert row["floor_offload_mib"] < row["budget_mib"] < row["floor_mib"]
    assert not row["fits_without"]
    assert row["peak_offload_mib"] <= row["budget_mib"]
    assert row["moved_mib"] == 3 * row["weights_mib"]
    # The updates take time on the host (they may hide behind the
    # backward phase, and their kernels leave the device: the step with
    # offload is not always longer); the swaps at the budget add to it.
    assert row["host_update_ms"] > 0
    assert row["step_offload_ms"] > 0
    assert row["step_budget_ms"] >= row["step_offload_ms"]
    text = offload.table(row)
    assert "no plan fits" in text and "fits: peak" in text
