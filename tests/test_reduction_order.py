"""Running a chain that reduces a large tensor before the tensor's other
reader makes a large output (`tflms.reduction_order`): literal graphs
shaped as Keras 3's accuracy on a language model's logits beside the
loss, and KerasHub's GPT-2 itself (a small config, traced in a
subprocess)."""

import dataclasses
import os

import pytest

import _keras3
from tflms import analysis
from tflms import graph_index as gi
from tflms.planner import reductions as reduction_order
from tflms import pipeline
from tflms import simulator
from tflms.settings import Settings
from tflms.stages import records

BIG = 8 << 20      # the logits and the loss's gradient
MASK = BIG // 4    # a bool of the logits' shape
SMALL = 64 << 10   # per token


def _metric_beside_loss(metric_end="ArgMax", extra=(), extra_edges=()):
    """The logits read by the loss (whose gradient is as large) and by the
    NaN-aware argmax of Keras 3's accuracy: a chain of the logits' size,
    ending in `metric_end`."""
    ops = [
        ("hidden", "MatMul", {"outputs": [SMALL]}),
        ("logits", "MatMul", {"outputs": [BIG]}),
        ("loss", "SparseSoftmaxCrossEntropyWithLogits",
         {"outputs": [SMALL, BIG]}),
        ("dhidden", "MatMul", {"outputs": [SMALL]}),
        ("bits", "Bitcast", {"outputs": [BIG]}),
        ("band", "BitwiseAnd", {"outputs": [BIG]}),
        ("less", "Less", {"outputs": [MASK]}),
        ("eq", "Equal", {"outputs": [MASK]}),
        ("both", "LogicalAnd", {"outputs": [MASK]}),
        ("select", "SelectV2", {"outputs": [BIG]}),
        ("argmax", metric_end, {"outputs": [SMALL if metric_end == "ArgMax"
                                            else BIG]}),
        ("step", "NoOp"),
    ] + list(extra)
    edges = list(extra_edges) + [
        ("hidden", "logits"), ("logits", "loss"), ("loss:1", "dhidden"),
        ("logits", "bits"), ("bits", "band"), ("band", "less"),
        ("logits", "eq"), ("less", "both"), ("eq", "both"),
        ("both", "select"), ("logits", "select"), ("select", "argmax"),
    ]
    control = [("dhidden", "step"), ("argmax", "step")]
    index = gi.from_edges(ops, edges, control, fetches=["step"])
    return index, analysis.classify_ops(index)


def _names(index, edges):
    return [(index.names[a], index.names[b]) for a, b in edges]


def test_the_loss_waits_for_the_metric_reduction():
    index, roles = _metric_beside_loss()
    chains = reduction_order.side_chains(index, roles)
    assert "loss" in {index.names[c[0]] for c in chains}
    # The chain's own BitwiseAnd also reads the logits beside it, but the
    # ArgMax needs it: that edge would close a cycle.
    assert _names(index, reduction_order.reduction_edges(index, roles)) == [
        ("argmax", "loss")]


def test_the_edge_lowers_the_peak():
    index, roles = _metric_beside_loss()
    edges = reduction_order.reduction_edges(index, roles)
    before = simulator.SimulationModel(index, roles).replay(None)
    ordered = gi.with_planned_edges(index, edges)
    after = simulator.SimulationModel(ordered, roles).replay(None)
    # Unordered, the loss's gradient is made beside the chain's
    # BitwiseAnd and masks; ordered, only the logits and the gradient
    # (the Bitcast is a view of the logits).
    assert before.peak_device_bytes >= 3 * BIG + MASK
    assert after.peak_device_bytes < before.peak_device_bytes - BIG // 2


def test_every_plan_carries_the_edge_where_it_lowers_the_peak():
    """The reduce_first stage puts the edges into the planning index of
    every plan (not only when nothing fits, as the order stage does),
    where the lower of two peaks (the step without swaps, the most
    aggressive plan) does not rise: here the step without swaps holds
    the logits and the loss's gradient, not the chain's temporaries
    beside them."""
    index, roles = _metric_beside_loss()
    settings = Settings(swapout_threshold=1, swapin_ahead=1,
                        swapin_groupby=0)
    planned = pipeline.plan(index, settings)
    reduced = planned.record(records.Reduced)
    assert _names(index, reduced.edges) == [("argmax", "loss")]
    assert set(reduced.edges) <= set(planned.index.planned_edges)
    assert set(reduced.edges) <= set(planned.plan.serialization_edges)
    before = simulator.SimulationModel(index, roles).replay(None)
    after = simulator.SimulationModel(planned.index, roles).replay(None)
    assert after.peak_device_bytes < before.peak_device_bytes
    # Not with order_peaks off (the order stage's switch).
    off = pipeline.plan(index, dataclasses.replace(settings,
                                                   order_peaks=False))
    assert not off.record(records.Reduced).edges


def test_a_chain_that_stays_large_is_not_ordered():
    # The chain ends in an op as large as the logits (no reduction): it is
    # a branch of the model, not a side chain.
    # (Nor is the loss, whose gradient's one large op ends in a small
    # matmul: one op and its reduction are left to the peak replays.)
    index, roles = _metric_beside_loss(metric_end="Relu")
    assert reduction_order.reduction_edges(index, roles) == ()


def test_a_direct_reduction_is_not_ordered():
    # A reduction reading the tensor itself holds nothing to free.
    index, roles = _metric_beside_loss(
        extra=[("mean", "Mean", {"outputs": [SMALL]})],
        extra_edges=[("logits", "mean"), ("mean", "dhidden")])
    chains = reduction_order.side_chains(index, roles)
    reductions = {index.names[r] for c in chains for r in c[3]}
    assert "argmax" in reductions and "mean" not in reductions


# KerasHub's GPT-2, small: the accuracy metric on its logits beside the
# loss. Run as a script in a Keras 3 subprocess.
def _main():
    import json
    import sys
    sys.path.insert(0, _keras3.ROOT)
    from benchmarks.transformer_plans import gpt2_step
    from tflms import context
    from tflms.settings import Settings
    from tflms.tf.adapters import graph_step, tf_function
    batch = 4
    concrete, _ = gpt2_step(128, batch, layers=2, heads=2, hidden=64,
                            intermediate=128, vocab=2000)
    _, index = tf_function.step_of(concrete.graph)
    settings = Settings(batch_size=batch)
    roles = context.classify(index, settings, graph_step.step_target(
        settings, here=False))
    edges = reduction_order.reduction_edges(index, roles, batch)
    before = simulator.SimulationModel(index, roles, batch).replay(None)
    ordered = gi.with_planned_edges(index, edges)
    after = simulator.SimulationModel(ordered, roles, batch).replay(None)
    logits = gi.tensor_bytes(index, edges[0][1], 1, batch) if edges else 0
    print("RESULT " + json.dumps(dict(
        edges=[(index.types[a], index.types[b]) for a, b in edges],
        before=before.peak_device_bytes, after=after.peak_device_bytes,
        logits=logits)))


@_keras3.needs_keras3
def test_gpt2_loss_waits_for_its_accuracy():
    pytest.importorskip("keras_hub")
    r, log = _keras3.result_of(os.path.abspath(__file__))
    assert r["edges"] == [["ArgMax", "SparseSoftmaxCrossEntropyWithLogits"]], \
        log[-3000:]
    # 4 x 128 x 2000 floats. Unordered, the step's peak (no swaps) is the
    # loss's gradient beside the logits, the chain's BitwiseAnd and its
    # masks; ordered, the chain has run by then: a logits-sized buffer less
    # (less a few KiB of per-token tensors that move with it).
    assert r["logits"] == 4 * 128 * 2000 * 4
    assert r["before"] - r["after"] > 0.99 * r["logits"], r


if __name__ == "__main__":
    _main()
