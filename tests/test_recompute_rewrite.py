"""The rewriter's side of recompute: clones made beside the originals, late
readers rerouted, the trigger's control edge, the same values, and the
guard against rewriting twice when a plan has recomputes only."""

import numpy as np
import tensorflow as tf

from tflms import LMS
from tflms import rewriter


def relu_read_late():
    """a = relu(x) read by `late` after six sines; x is read last by `out`,
    so a can be made again from x just before `late`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 8], name="x")
        a = tf.nn.relu(x, name="a")
        f = a
        for i in range(1, 7):
            f = tf.math.sin(f, name="f%d" % i)
        late = tf.math.multiply(f, a, name="late")
        tf.math.add(late, x, name="out")
    return graph


def run_out(graph, value):
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run("out:0", {"x:0": value})


def test_late_reader_reads_a_clone_and_the_original_stays():
    graph = relu_read_late()
    value = np.linspace(-2, 2, 32, dtype=np.float32).reshape(4, 8)
    expected = run_out(graph, value)
    before = len(graph.get_operations())
    result = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
                 recompute=True).run(graph)
    plan = result.planned.plan
    assert plan.swaps == () and len(plan.recomputes) == 1
    assert result.rewrite.recompute_ops == ("lms/recompute_a_0/a",)
    assert result.swapout_ops == () and result.swapin_ops == ()
    assert len(graph.get_operations()) == before + 1
    clone = graph.get_operation_by_name("lms/recompute_a_0/a")
    assert clone.type == "Relu"
    assert [t.name for t in clone.inputs] == ["x:0"]
    assert clone.get_attr("T") == tf.float32
    assert clone.get_attr(rewriter.SWAP_MARKER_ATTR)
    trigger = result.planned.index.names[plan.recomputes[0].trigger]
    assert [c.name for c in clone.control_inputs] == [trigger]
    assert trigger in ("f3", "f4", "f5")
    late = graph.get_operation_by_name("late")
    assert [t.name for t in late.inputs] == ["f6:0",
                                             "lms/recompute_a_0/a:0"]
    assert [c.name for c in graph.get_tensor_by_name("a:0").consumers()] \
        == ["f1"]
    np.testing.assert_array_equal(run_out(graph, value), expected)


def test_a_graph_with_recomputes_only_is_not_rewritten_twice():
    graph = relu_read_late()
    LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
        recompute=True).run(graph)
    assert rewriter.is_rewritten(graph)
    assert not rewriter.is_rewritten(graph, lambda device: "GPU" in device)
    snapshot = graph.as_graph_def().SerializeToString(deterministic=True)
    again = LMS(swapout_threshold=3, swapin_ahead=1, swapin_groupby=0,
                recompute=True).run(graph)
    assert again.outcome.name == "ALREADY_REWRITTEN"
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == snapshot


def test_without_recompute_the_same_tensor_is_swapped():
    graph = relu_read_late()
    result = LMS(swapout_threshold=3, swapin_ahead=1,
                 swapin_groupby=0).run(graph)
    assert result.swapout_ops == ("lms/swapout_a_0",)
    assert result.planned.plan.recomputes == ()
