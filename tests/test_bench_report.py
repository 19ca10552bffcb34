"""benchmarks/report.py: the findings name where TensorFlow's own swapping
is ahead of tflms."""

from benchmarks import report


def test_report_names_where_tensorflow_swapping_wins():
    gib = 1 << 30
    data = {"sections": {"memory": [{
        "description": "m", "case": {"budget_gib": 1.5}, "configs": {
            "tf_swap": {"gpu_peak": gib, "swapout_bytes": gib},
            "tflms_auto": {"gpu_peak": 2 * gib}}}]}}
    notes = report.behind_tensorflow(data)
    assert len(notes) == 1
    assert "TF swapping fits the 1.50 GiB budget (1.00 GiB)" in notes[0]
    # Both fit: behind only if TensorFlow moves fewer bytes.
    memory = data["sections"]["memory"][0]["configs"]
    memory["tflms_auto"] = {"gpu_peak": gib, "swapout_bytes": 2 * gib}
    assert "moves fewer bytes" in report.behind_tensorflow(data)[0]
    memory["tflms_auto"]["swapout_bytes"] = gib // 2
    assert report.behind_tensorflow(data) == []
