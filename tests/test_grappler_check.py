"""`tflms.tf.grappler_check`: Grappler's optimization of a step compared
with LMS's edits and without, on real steps.

The function step computes ``tanh(m + 0.05 * m ** 3)`` per layer: Grappler
turns the cube into products of ``m`` (``ConvertPow``), and LMS must not
swap ``m`` into them (`fusions.grappler_groups`, the ``Pow`` rule). With
the rules as they are the check finds nothing; with the ``Pow`` and
``Square`` rules turned off (as `tests/test_keras3_transformers.py` turns
them off) it names the products and the swaps next to them. The Session
graph case: LMS keeps no Grappler groups in Session graphs yet
(`analysis.classify`), so a chain of additions it swaps into is grouped
otherwise, and the check says so.
"""

import pytest
import tensorflow as tf

from tflms import LMS, fusions
from tflms.tf import grappler_check
from tflms.tf import rewriter
from tflms.tf.adapters import tf_function

# Swaps nearly every tensor read a level or more after it is made.
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def _cube_step(variables):
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for w in variables:
                m = tf.matmul(h, w)
                h = tf.tanh(m + 0.05 * tf.pow(m, 3))
            loss = tf.reduce_sum(h * h)
        grads = tape.gradient(loss, variables)
        for w, g in zip(variables, grads):
            w.assign_sub(0.01 * g)
        return loss
    return step


def _check_function_step(lms):
    """The `RunResult` of `lms` rewriting the concrete function of the cube
    step, traced in a graph of its own (this process runs with eager
    execution off: the check needs the traced step, not a call)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        variables = [tf.compat.v1.get_variable(
            "w%d" % i, [16, 16], use_resource=True,
            initializer=tf.compat.v1.initializers.random_normal(0, .3))
            for i in range(4)]
        step = tf.function(_cube_step(variables))
        concrete = step.get_concrete_function(
            tf.TensorSpec([4, 16], tf.float32))
        lms.grappler_check = True
        return tf_function.rewrite_graph(lms, concrete.graph)


def test_function_step_optimized_the_same_with_the_rules():
    result = _check_function_step(LMS(**FIXED))
    assert result.rewritten and len(result.swapout_ops) >= 4
    report = result.grappler
    assert report is not None and report.seconds > 0
    assert report.same, "\n".join(report.lines())
    assert report.nodes[0] == report.nodes[1] > 20


def test_function_step_with_the_pow_rule_off_names_the_products(
        monkeypatch):
    merged = dict(fusions._MERGED_INTO)
    for kind in ("Pow", "Square"):
        merged.pop(kind)
    monkeypatch.setattr(fusions, "_MERGED_INTO", merged)
    result = _check_function_step(LMS(**FIXED))
    report = result.grappler
    assert not report.same
    # Each layer's cube reads the swapped-in m (or its square) instead of
    # m itself: ConvertPow's products are another tree of operands.
    pows = [d for d in report.differences
            if any("Pow" in op for op in d.ops)]
    assert pows, "\n".join(report.lines())
    for d in pows:
        assert d.kind in ("inputs", "order", "op", "added", "removed")
        assert d.swaps and all(grappler_check.is_lms_name(s)
                               for s in d.swaps)
    assert any("swapin_MatMul" in s for d in pows for s in d.swaps)
    assert report.swaps() == sorted(set(report.swaps()))
    assert any("Pow" in line for line in report.lines())


def _session_step():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [4, 16], name="x")
        h = x
        for i in range(4):
            w = tf.compat.v1.get_variable(
                "w%d" % i, [16, 16],
                initializer=tf.compat.v1.initializers.random_normal(0, .3))
            m = tf.matmul(h, w)
            # (tanh(m) + m) + h: one AddN per layer for the arithmetic
            # optimizer, while no swap-out reads its operands.
            h = tf.tanh(m) + m + h
        loss = tf.reduce_sum(h * h)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss)
    return graph, train


def test_session_graph_additions_swapped_into_are_grouped_otherwise():
    graph, train = _session_step()
    before = grappler_check.graph_def_of(graph)
    fetches = [train.name]
    same = grappler_check.check(before, graph, fetches)
    assert same.same and same.nodes[0] > 20
    result = LMS(**FIXED).run(graph, fetches=[train])
    assert result.rewritten
    assert result.grappler is None  # the setting is off by default
    report = grappler_check.check(before, graph, fetches)
    assert not report.same, "\n".join(report.lines())
    adds = [d for d in report.differences
            if "AddN" in d.without + d.with_lms]
    assert adds, "\n".join(report.lines())
    assert all(d.swaps or d.edges for d in adds)
    # The check reads the graphs and edits neither.
    assert grappler_check.graph_def_of(graph) != before
    assert len(grappler_check.graph_def_of(graph).node) == len(
        graph.as_graph_def().node)


def test_lms_names_are_told_apart():
    assert grappler_check.is_lms_name("lms/swapout_conv1_Relu_0")
    assert grappler_check.is_lms_name(
        "conv1/Relu-lms/swapin_conv1_Relu_0")
    assert grappler_check.is_lms_name("bn-lms/recompute_relu_0/bn")
    # offload_optimizer's ops, named by the rewriter too.
    assert grappler_check.is_lms_name(
        rewriter.offload_op_name("dense/kernel", "write_back"))
    assert grappler_check.is_lms_name("lms/offload/dense/kernel/host")
    assert not grappler_check.is_lms_name("helms/swap")
    assert not grappler_check.is_lms_name("gradients/AddN")


def test_whole_graph_step_keeps_its_sinks():
    graph, train = _session_step()
    report = grappler_check.check(graph, graph, [])
    assert report.same and report.nodes[0] > 20


@pytest.mark.parametrize("kind", ["removed", "order"])
def test_difference_lines_name_the_swaps(kind):
    d = grappler_check.Difference(
        kind=kind, node="AddN", without="AddN(a:0, b:0, c:0)",
        with_lms="AddN(b:0, a:0, c:0)" if kind == "order" else "",
        ops=("AddN", "a", "b", "c"), swaps=("a-lms/swapin_a_0",),
        edges=(("d", "a"),))
    line = d.describe()
    assert line.startswith(kind + " AddN: without LMS AddN(a:0")
    assert "a-lms/swapin_a_0" in line and "d -> a" in line
    report = grappler_check.GrapplerReport((d,), {"AddN": (1, 0)}, (9, 8),
                                           0.5)
    lines = report.lines()
    assert not report.same and len(lines) == 3
    assert "AddN 1 -> 0" in lines[1] and lines[2].strip() == line


