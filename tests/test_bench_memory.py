"""benchmarks/memory.py: the notes of the device-memory section."""

from benchmarks import memory as memory_section


_memory_note = memory_section._note


def test_memory_note_judges_tensorflow_swapping_by_like_counts():
    """TensorFlow's swapping 'saved nothing' when its real peak did not go
    down; the blind spot is named only when Grappler's own count went down
    against Grappler's own count without swapping (not against the runtime
    peak, which counts differently)."""
    gib = 1 << 30
    none = {"gpu_peak": 4 * gib, "raw_gpu_peak": 5 * gib}
    blind = {"gpu_peak": 4 * gib, "raw_gpu_peak": int(4.5 * gib)}
    note = _memory_note("tf_swap", blind, none, 3 * gib)
    assert "only Grappler's own count goes down" in note
    assert note.endswith("over budget")
    # Grappler's count below the runtime peak without LMS, but not below its
    # own count without LMS: no blind spot to name.
    same = {"gpu_peak": 4 * gib, "raw_gpu_peak": 5 * gib}
    note = _memory_note("tf_swap", same, none, 3 * gib)
    assert "changed the graph but saved nothing" in note


def test_memory_note_compares_oracle_with_simulator():
    gib = 1 << 30
    values = {"status": "swapped", "params": [1, 2, 3, 0],
              "sim_peak": 2 * gib, "gpu_peak": int(2.2 * gib)}
    note = _memory_note("tflms_auto", values, {"gpu_peak": 8 * gib},
                        4 * gib)
    assert "params 1/2/3/0" in note
    assert "simulator: 2.00 GiB (oracle +10.0%)" in note
    assert note.endswith("fits")
    # With copies timed the simulator counts more than the oracle's
    # instant replay can see: the oracle is set beside the instant count.
    values = dict(values, sim_peak=int(2.5 * gib), sim_instant_peak=2 * gib)
    note = _memory_note("tflms_auto", values, {"gpu_peak": 8 * gib},
                        4 * gib)
    assert "simulator: 2.50 GiB (2.00 GiB with copies instant) " \
        "(oracle +10.0%)" in note
