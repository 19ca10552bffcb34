"""The oracle's runtime replay with copies that take time on a link.

``peak_memory(..., interconnect=...)`` times each copy between the GPU and
the host at the link's rate on one FIFO stream per direction, holds a
swapped-out GPU buffer until its copy to the host ends and a swapped-in
GPU copy until its copy from the host ends (see the ``tflms.tf.oracle``
docstring). Allocations never move and releases only move later, so the
timed runtime peak is never below the instant one, and at the instant
peak every swapped-out buffer whose copy is still running is live on top
of what was live there: that is the closed form the tests check.
"""

import math

import pytest
import tensorflow as tf

from tflms import LMS, hardware
from tflms.tf import oracle

from zoo import models
# The swap graph and its tensor size S (one float32 tensor of
# test_oracle.SHAPE).
from test_oracle import S, _swap_graph


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _swap_chain():
    """x -> a1 -> a2 -> a3 -> tile (4 S) -> b (4 S) -> c; out = c + a1,
    with a1 swapped out to the CPU after a1 and back in after a2.

    The runtime peak is at the start of ``b``: big, b and the swapped-in
    copy of a1 (plus a few bytes of shape constants). Instantly, a1's own
    GPU buffer is gone by then (its readers a2 and the swap-out ended); on
    a slow link it is still being copied, so the peak grows by exactly S.
    """
    return _swap_graph(delay=True)


def _peak_start_of(result, op_name):
    """Start (ns) of ``op_name``'s output, live at the runtime peak."""
    for t in result.runtime_live_at_peak:
        if t.name == op_name + ":0":
            return t.alloc_ns
    raise AssertionError(f"{op_name} is not live at the runtime peak")


def test_none_and_instant_keep_todays_peak_and_record_no_copies():
    graph, out = _swap_chain()
    today = oracle.peak_memory(graph, out)
    # big and b (4 S each), the swapped-in copy of a1 and the 12 + 4 bytes
    # of the Reshape's shape and the reduction's axis (test_oracle.py).
    assert today.runtime_gpu_peak_bytes == 9 * S + 16
    for interconnect in (None, "instant", hardware.INSTANT, math.inf):
        result = oracle.peak_memory(graph, out, interconnect=interconnect)
        assert result.runtime_gpu_peak_bytes == today.runtime_gpu_peak_bytes
        assert result.runtime_live_at_peak == today.runtime_live_at_peak
        assert result.runtime_peak_ns == today.runtime_peak_ns
        assert result.interconnect is None
        assert result.interconnect_bytes_per_s is None
        assert result.timed_copies == ()
        # The other numbers never depend on the link.
        assert result.gpu_peak_bytes == today.gpu_peak_bytes
        assert result.raw_gpu_peak_bytes == today.raw_gpu_peak_bytes


def test_copies_are_timed_fifo_at_the_links_rate():
    graph, out = _swap_chain()
    rate = hardware.INTERCONNECTS["pcie4"].bytes_per_s
    result = oracle.peak_memory(graph, out, interconnect="pcie4")
    assert result.interconnect == "pcie4"
    assert result.interconnect_bytes_per_s == rate
    out_copy, in_copy = result.timed_copies
    assert (out_copy.tensor, out_copy.to_host, out_copy.buffer) == (
        "a1:0", True, "a1:0")
    assert (in_copy.tensor, in_copy.to_host) == ("lms/swapin_a1:0", False)
    assert in_copy.buffer.startswith("Recv_lms/swapin_a1_0_on_")
    for copy in (out_copy, in_copy):
        assert copy.nbytes == S
        assert copy.end_ns == math.ceil(copy.start_ns + S * 1e9 / rate)
    # The swap-out's copy starts when the swap-out op does (nothing queued
    # before it); the swap-in's data cannot leave the host before it got
    # there.
    assert out_copy.start_ns == out_copy.ready_ns
    assert in_copy.ready_ns >= out_copy.end_ns
    assert in_copy.start_ns == in_copy.ready_ns


def test_closed_form_on_a_hand_built_swap():
    graph, out = _swap_chain()
    instant = oracle.peak_memory(graph, out)
    b_start = _peak_start_of(instant, "b")
    assert instant.runtime_peak_ns == b_start
    assert "a1:0" not in [t.name for t in instant.runtime_live_at_peak]

    fast = oracle.peak_memory(graph, out, interconnect=1e15)
    # 4 MiB at 1e15 B/s: about 4 ns, well inside one microsecond.
    assert fast.timed_copies[0].end_ns - fast.timed_copies[0].start_ns < 10
    assert fast.runtime_gpu_peak_bytes == instant.runtime_gpu_peak_bytes

    slow = oracle.peak_memory(graph, out, interconnect=1.0)
    assert slow.runtime_gpu_peak_bytes == instant.runtime_gpu_peak_bytes + S
    assert "a1:0" in [t.name for t in slow.runtime_live_at_peak]

    # Where the link crosses over: a1's copy (ready at the swap-out's
    # start) must end by the start of b, or a1 is live at the peak.
    ready = slow.timed_copies[0].ready_ns
    crossover = S * 1e9 / (b_start - ready)  # bytes/s
    for name, link in hardware.INTERCONNECTS.items():
        result = oracle.peak_memory(graph, out, interconnect=name)
        expected = instant.runtime_gpu_peak_bytes + (
            S if link.bytes_per_s < crossover else 0)
        assert result.runtime_gpu_peak_bytes == expected, name


@pytest.fixture(scope="module")
def rewritten_cnn():
    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:GPU:0"):
        model = models.cnn_bn(image=48, channels=16, depth=8, batch=8, seed=1)
    result = LMS(swapout_threshold=1, swapin_ahead=1,
                 swapin_groupby=0).run(model.graph)
    assert result.swapout_ops
    instant = oracle.peak_memory(model.graph, model.fetches, place=False)
    return model, instant


def test_lms_graph_instant_equivalents(rewritten_cnn):
    model, instant = rewritten_cnn
    for interconnect in (None, 1e15):
        result = oracle.peak_memory(model.graph, model.fetches, place=False,
                                    interconnect=interconnect)
        assert (result.runtime_gpu_peak_bytes
                == instant.runtime_gpu_peak_bytes), interconnect
        assert result.gpu_peak_bytes == instant.gpu_peak_bytes


def test_lms_graph_slow_link_holds_swapped_tensors(rewritten_cnn):
    model, instant = rewritten_cnn
    slow = oracle.peak_memory(model.graph, model.fetches, place=False,
                              interconnect=1.0)
    to_host = [c for c in slow.timed_copies if c.to_host]
    swapouts = [op.name for op in model.graph.get_operations()
                if op.name.startswith("lms/swapout_")]
    assert len(to_host) == len(swapouts)
    assert len([c for c in slow.timed_copies if not c.to_host]) == len(
        [op for op in model.graph.get_operations()
         if "lms/swapin_" in op.name])
    # One FIFO stream per direction: no two copies overlap.
    for direction in (True, False):
        copies = sorted((c for c in slow.timed_copies
                         if c.to_host is direction),
                        key=lambda c: c.start_ns)
        for before, after in zip(copies, copies[1:]):
            assert after.start_ns >= before.end_ns
        assert all(c.start_ns >= c.ready_ns for c in copies)

    # At 1 B/s no copy ends within the step. A swapped-out buffer whose
    # copy was ready before the instant peak was allocated before it and
    # is still held there; if the instant replay had released it by then,
    # it adds its bytes to what was live at that moment.
    instant_live = {t.name for t in instant.runtime_live_at_peak}
    held = {c.buffer: c.nbytes for c in to_host
            if c.buffer and c.ready_ns < instant.runtime_peak_ns
            and c.buffer not in instant_live}
    assert held, "no swapped tensor was released before the instant peak"
    assert max(held.values()) > 0
    assert (slow.runtime_gpu_peak_bytes
            >= instant.runtime_gpu_peak_bytes + sum(held.values()))

    pcie4 = oracle.peak_memory(model.graph, model.fetches, place=False,
                               interconnect="pcie4")
    assert (instant.runtime_gpu_peak_bytes <= pcie4.runtime_gpu_peak_bytes
            <= slow.runtime_gpu_peak_bytes)


@pytest.mark.parametrize("bad", ["pcie9", "PCIe4", ""])
def test_unknown_link_name_is_rejected(bad):
    graph, out = _swap_chain()
    with pytest.raises(ValueError, match="interconnect .* is not known"):
        oracle.peak_memory(graph, out, interconnect=bad)


@pytest.mark.parametrize("bad", [0, -31.5e9, float("nan"), -math.inf])
def test_non_positive_rate_is_rejected(bad):
    graph, out = _swap_chain()
    with pytest.raises(ValueError, match="interconnect must be a positive"):
        oracle.peak_memory(graph, out, interconnect=bad)


@pytest.mark.parametrize("bad", [True, ["pcie4"]])
def test_other_types_are_rejected(bad):
    graph, out = _swap_chain()
    with pytest.raises(TypeError, match="interconnect must be None"):
        oracle.peak_memory(graph, out, interconnect=bad)


def test_benchmark_oracle_peaks_takes_a_link():
    from benchmarks import measure
    graph, out = _swap_chain()
    default = measure.oracle_peaks(graph, out.op)
    assert "interconnect" not in default
    slow = measure.oracle_peaks(graph, out.op, interconnect=1.0)
    assert slow["interconnect"] == "1 B/s"
    assert slow["gpu_peak"] == default["gpu_peak"] + S
    fast = measure.oracle_peaks(graph, out.op, interconnect="nvlink-c2c")
    assert fast["interconnect"] == "nvlink-c2c"
    assert fast["gpu_peak"] == default["gpu_peak"]
    assert {k: v for k, v in fast.items()
            if k not in ("interconnect", "oracle_s")} == {
                k: v for k, v in default.items() if k != "oracle_s"}
