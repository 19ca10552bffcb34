"""Structure of the rewritten graph, and the guarantees of run()."""

import numpy as np
import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import LMS
from tflms.lms import Outcome
from tflms import graph_index as gi
from tflms.tf import rewriter

from zoo import models
from _graphs import dense_net, train_steps

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def swap_ops(graph):
    return [op for op in graph.get_operations()
            if "lms/swap" in op.name]


def graph_signature(graph):
    return graph.as_graph_def().SerializeToString(deterministic=True)


def assert_rewrite_invariants(graph, plan, index_before):
    ops = swap_ops(graph)
    assert ops, "no swap ops were added"
    for op in ops:
        assert op.type == "Identity"
        assert gi.is_cpu_device(op.device), op.device
        assert op.get_attr("_grappler_do_not_remove") is True
        assert op.get_attr(rewriter.SWAP_MARKER_ATTR) is True
        if "lms/swapin" in op.name:
            assert op.inputs[0].op.name.startswith("lms/swapout")
        else:
            assert not gi.is_cpu_device(op.inputs[0].op.device)
    # Every planned consumer reads a swap-in of the planned tensor.
    for swap in plan.swaps:
        tensor = index_before.ops[swap.producer].outputs[swap.output]
        for sin in swap.swap_ins:
            for consumer, slot in sin.consumers:
                read = index_before.ops[consumer].inputs[slot]
                assert read.op.name.startswith(
                    rewriter.swapin_op_name(tensor.name))
                assert read.op.inputs[0].op.inputs[0] is tensor
            for t in sin.triggers:
                assert index_before.ops[t] in read.op.control_inputs
    # Still a DAG (kahn_levels raises on a cycle) whose edges go forward.
    after = reader.build_index(graph)
    for v in range(after.num_ops):
        for w in after.successors(v):
            assert after.levels[w] > after.levels[v]


@pytest.mark.parametrize("params", [
    dict(FIXED),
    dict(swapout_threshold=3, swapin_ahead=2, swapin_groupby=5),
    dict(FIXED, sync_mode=1),
    dict(FIXED, sync_mode=2),
    dict(FIXED, sync_mode=3),
    dict(FIXED, serialization=["0:"]),
])
def test_invariants_and_swap_ops_executed(params):
    graph, h = dense_net(depth=6)
    index_before = reader.build_index(graph)
    lms = LMS(**params)
    result = lms.run(graph)
    assert_rewrite_invariants(graph, lms.last_run.plan, index_before)
    _, _, executed = train_steps(graph, h, steps=1)
    added = set(result.swapout_ops) | set(result.swapin_ops)
    assert added and added <= executed


def test_second_run_changes_nothing():
    graph, _ = dense_net()
    lms = LMS(**FIXED)
    first = lms.run(graph)
    assert first.outcome is Outcome.REWRITTEN
    before = graph_signature(graph)
    # The same object answers with its result; another sees the swap ops.
    assert lms.run(graph) is first
    assert LMS(**FIXED).run(graph).outcome is Outcome.ALREADY_REWRITTEN
    again = LMS(swapout_threshold=2, swapin_ahead=3, swapin_groupby=1)
    assert again.run(graph).outcome is Outcome.ALREADY_REWRITTEN
    assert again.last_run.planned is None and again.last_run.rewrite is None
    assert graph_signature(graph) == before


def test_rewrite_is_deterministic():
    sigs = set()
    for _ in range(2):
        graph, _ = dense_net(depth=5)
        LMS(swapout_threshold=2, swapin_ahead=1, swapin_groupby=2,
            sync_mode=1).run(graph)
        sigs.add(graph_signature(graph))
    assert len(sigs) == 1


def test_threshold_controls_what_is_swapped():
    counts = []
    for threshold in (1, 10, 30, 1000):
        graph, _ = dense_net(depth=6)
        result = LMS(swapout_threshold=threshold, swapin_ahead=1,
                     swapin_groupby=0).run(graph)
        counts.append(len(result.swapout_ops))
    assert counts[0] > counts[1] > counts[2] > 0
    assert counts[3] == 0
    assert counts == sorted(counts, reverse=True)


def test_groupby_shares_swap_ins():
    per_groupby = {}
    for groupby in (0, 1000):
        graph, _ = dense_net(depth=4)
        r = LMS(swapout_threshold=1, swapin_ahead=1,
                swapin_groupby=groupby).run(graph)
        per_groupby[groupby] = (len(r.swapout_ops), len(r.swapin_ops))
    assert per_groupby[0][0] == per_groupby[1000][0]
    assert per_groupby[1000][1] == per_groupby[1000][0]  # one swap-in each
    assert per_groupby[0][1] > per_groupby[1000][1]


def test_swapin_ahead_moves_the_trigger_earlier():
    def trigger_gaps(ahead):
        graph, _ = dense_net(depth=6)
        lms = LMS(swapout_threshold=1, swapin_ahead=ahead, swapin_groupby=0)
        index = reader.build_index(graph)
        lms.run(graph)
        gaps = {}
        for swap in lms.last_run.plan.swaps:
            for sin in swap.swap_ins:
                if not sin.synchronous:
                    gaps[(swap.producer, sin.first_consumer)] = (
                        index.levels[sin.first_consumer]
                        - index.levels[sin.triggers[0]])
        return gaps
    near, far = trigger_gaps(1), trigger_gaps(3)
    assert near and min(near.values()) > 1
    assert far and min(far.values()) > 3
    common = set(near) & set(far)
    assert common
    # Every swap-in planned both ways starts at least as early with the
    # larger swapin_ahead, and some strictly earlier.
    assert all(far[k] >= near[k] for k in common)
    assert any(far[k] > near[k] for k in common)


def test_nothing_swapped_across_cpu_ops():
    graph, _ = dense_net(device="/cpu:0")
    result = LMS(**FIXED).run(graph)
    assert result.swapout_ops == ()


def test_gpu_device_limits_the_rewrite():
    graph, _ = dense_net(device="/device:GPU:0")
    with pytest.raises(ValueError, match=(
            r"gpu_device='/device:GPU:1' matches no operation in the graph; "
            r"ops are placed on .*GPU:0")):
        LMS(gpu_device="/device:GPU:1", **FIXED).run(graph)
    assert not swap_ops(graph)
    result = LMS(gpu_device="/gpu:0", **FIXED).run(graph)
    assert result.swapout_ops


def test_filters():
    graph, _ = dense_net(depth=4)
    lms = LMS(**FIXED)
    lms.excl_output_by_types = {"Relu"}
    result = lms.run(graph)
    srcs = {graph.get_operation_by_name(n).inputs[0].op.type
            for n in result.swapout_ops}
    assert "Relu" not in srcs

    graph, _ = dense_net(depth=4)
    lms = LMS(**FIXED)
    lms.incl_output_by_scopes = {"dense2"}
    result = lms.run(graph)
    assert result.swapout_ops == ("lms/swapout_dense2_Relu_0",)

    graph, _ = dense_net(depth=4)
    lms = LMS(**FIXED)
    lms.excl_input_by_scopes = {"gradients"}
    lms.run(graph)
    readers = [c for sin in swap_ops(graph) if "lms/swapin" in sin.name
               for c in sin.outputs[0].consumers()]
    assert readers and not [c for c in readers
                            if c.name.startswith("gradients")]
    graph, _ = dense_net(depth=4)
    LMS(**FIXED).run(graph)
    assert [c for sin in swap_ops(graph) if "lms/swapin" in sin.name
            for c in sin.outputs[0].consumers()
            if c.name.startswith("gradients")]


@pytest.mark.parametrize("name, value, message", [
    ("excl_output_by_scopes", {"no_such_scope"},
     r"excl_output_by_scopes/excl_output_by_types: no operation in the graph "
     r"is in scope 'no_such_scope'"),
    ("incl_input_by_types", {"Conv2d"},
     r"incl_input_by_scopes/incl_input_by_types: no operation in the graph "
     r"has type 'Conv2d'"),
])
def test_unknown_filters_are_errors_and_leave_the_graph(name, value, message):
    graph, _ = dense_net()
    before = graph_signature(graph)
    lms = LMS(**FIXED)
    setattr(lms, name, value)
    with pytest.raises(ValueError, match=message):
        lms.run(graph)
    assert graph_signature(graph) == before


def test_finalized_graph_is_refused():
    graph, _ = dense_net()
    graph.finalize()
    with pytest.raises(ValueError, match=r"the graph is finalized.*before "
                       r"creating the Session"):
        LMS(**FIXED).run(graph)


def test_not_a_graph():
    with pytest.raises(ValueError, match=r"graph must be a tf.Graph or None"):
        LMS(**FIXED).run("graph")


def test_inference_graph_with_auto_parameters_swaps_nothing_it_does_not_need():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 32])
        h = x
        for _ in range(5):
            h = tf.compat.v1.layers.dense(h, 32, activation=tf.nn.relu)
    # No tensor of an inference chain is read far from where it was made:
    # with fixed parameters nothing qualifies...
    fixed = LMS(**FIXED)
    fixed.is_training = False
    assert fixed.run(g).swapout_ops == ()
    # ... and auto-tuning for a budget the chain fits leaves it untouched.
    ops_before = len(g.get_operations())
    auto = LMS()
    auto.is_training = False
    auto.autotune_gpu_mem = 1.0
    assert auto.run(g).outcome is Outcome.NOT_NEEDED
    assert len(g.get_operations()) == ops_before
    assert not [op for op in g.get_operations() if "lms/" in op.name]


def test_log_lines(lms_log):
    graph, _ = dense_net()
    LMS(**FIXED).run(graph)
    text = "\n".join(lms_log())
    for expected in ("[LMS][0] Editing model for LMS",
                     "vertices and", "MiB of learning parameters",
                     "The largest operation is",
                     "Original categorized topological sort has",
                     "swapout_threshold: 1", "Added ", "swap-out operations",
                     "Editing model for LMS, took:"):
        assert expected in text
    assert "[LMS][1]" not in text


def test_debug_logs_per_op_details(lms_log):
    graph, _ = dense_net(depth=2)
    LMS(debug=True, debug_level=2, **FIXED).run(graph)
    text = "\n".join(lms_log())
    assert "[LMS][1]   Swap-out: dense0/Relu:0" in text
    assert "triggered by" in text


def test_numbers_equal_without_lms():
    graph, h = dense_net(depth=5, optimizer="momentum")
    base = train_steps(graph, h, steps=3, trace=False)
    graph, h = dense_net(depth=5, optimizer="momentum")
    LMS(**FIXED).run(graph)
    got = train_steps(graph, h, steps=3, trace=False)
    assert got[0] == base[0]
    for name, w in base[1].items():
        np.testing.assert_array_equal(got[1][name], w)


def test_largest_operation_ignores_variable_initializers(lms_log):
    # Wide layers with a tiny batch: the kernel initializers (random numbers
    # of 256x256) are the biggest ops of the graph, but they do not run in
    # a training step, so the log must name a training op.
    graph, _ = dense_net(depth=2, width=256, batch=2)
    LMS(**FIXED).run(graph)
    line = next(m for m in lms_log() if "The largest operation is" in m)
    assert "/Initializer/" not in line and "/Assign" not in line, line


def test_not_needed_is_decided_once_per_unchanged_graph(lms_log):
    graph, _ = dense_net(depth=2, batch=4)
    lms = LMS()
    lms.autotune_gpu_mem = 1
    first = lms.run(graph)
    assert first.outcome is Outcome.NOT_NEEDED and first.plan is None
    assert first.planned.tune.params is None
    assert lms.run(graph) is first
    text = "\n".join(lms_log())
    assert text.count("Without LMS one step peaks") == 1
    assert text.count("LMS is not necessary") == 1
    # A changed graph is analysed again.
    with graph.as_default():
        tf.constant(1.0)
    assert lms.run(graph).outcome is Outcome.NOT_NEEDED
    assert "\n".join(lms_log()).count("Without LMS one step peaks") == 2


def test_autotune_with_serialization_simulates_the_serialized_levels():
    graph, _ = dense_net(depth=6, width=64, batch=64)
    original_levels = reader.build_index(graph).num_levels
    lms = LMS(serialization=["0:"])
    lms.autotune_gpu_mem = 180e3 / 0.9 / 2 ** 30  # below the 236 kB peak
    result = lms.run(graph)
    assert result.rewritten and result.swapout_ops
    tune = lms.last_run.planned.tune
    # The simulator replayed the serialized graph (one op per level), not
    # the original levels, and the chosen plan fits the budget.
    assert tune.without_lms.num_levels > original_levels
    assert tune.with_lms.peak_device_bytes <= tune.budget_bytes
    assert tune.with_lms.peak_device_bytes < tune.without_lms.peak_device_bytes


def test_log_names_the_ops_tensorflow_may_merge(lms_log):
    graph = tf.Graph()
    with graph.as_default():
        models.cnn_bias(image=8, channels=2, depth=2, batch=2)
    LMS(**FIXED).run(graph)
    text = "\n".join(lms_log())
    assert ("8 operations may be merged in pairs by TensorFlow at run time "
            "when oneDNN is on (BiasAdd+Conv2D, BiasAddGrad+"
            "Conv2DBackpropFilter)") in text
