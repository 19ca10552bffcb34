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

The wide step is big enough (Grappler's estimate of its memory passes 80%
of the 256 MiB TensorFlow's CPU device declares) for Grappler's memory
optimizer to turn its ``AddN`` nodes into accumulations: the check sees
them as the runtime does only with the step's inputs given their shapes
(`grappler_check._inputs_with_shapes`), and LMS's swaps change which
``AddN`` nodes are turned (docs/tf2.md, "Grappler's memory optimizer").
This file run as a script trains the wide step once in eager mode and
prints the ``AddN`` nodes the runtime accumulated.
"""

import os

import pytest
import tensorflow as tf

import _keras3

from tflms import LMS, fusions
from tflms.tf import grappler_check
from tflms.tf import rewriter
from tflms.tf.adapters import rewrite

# Swaps nearly every tensor read a level or more after it is made.
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def _layered_step(activation):
    """A step of layers ``activation(h @ w)`` trained by SGD, made for its
    variables."""
    def make(variables):
        def step(x):
            with tf.GradientTape() as tape:
                h = x
                for w in variables:
                    h = activation(tf.matmul(h, w))
                loss = tf.reduce_sum(h * h)
            grads = tape.gradient(loss, variables)
            for w, g in zip(variables, grads):
                w.assign_sub(0.01 * g)
            return loss
        return step
    return make


_cube_step = _layered_step(lambda m: tf.tanh(m + 0.05 * tf.pow(m, 3)))
# GELU's tanh approximation per layer, as `tf.nn.gelu` writes it.
_gelu_step = _layered_step(lambda m: tf.nn.gelu(m, approximate=True))


def _check_function_step(lms, make_step=_cube_step):
    """The `RunResult` of `lms` rewriting the concrete function of the cube
    step (or `make_step`'s), traced in a graph of its own (this process
    runs with eager execution off: the check needs the traced step, not a
    call)."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        variables = [tf.compat.v1.get_variable(
            "w%d" % i, [16, 16], use_resource=True,
            initializer=tf.compat.v1.initializers.random_normal(0, .3))
            for i in range(4)]
        step = tf.function(make_step(variables))
        concrete = step.get_concrete_function(
            tf.TensorSpec([4, 16], tf.float32))
        lms.grappler_check = True
        return rewrite.rewrite_function_graph(concrete.graph, lms.settings)


def test_function_step_optimized_the_same_with_the_rules():
    result = _check_function_step(LMS(**FIXED))
    assert result.rewritten and len(result.swapout_ops) >= 4
    report = result.grappler
    assert report is not None and report.seconds > 0
    assert report.same, "\n".join(report.lines())
    assert report.nodes[0] == report.nodes[1] > 20


def test_gelu_gradient_power_swapped_and_optimized_the_same():
    """GELU's ``x ** 2`` of the gradient (`fusions.power_gradients`: ``x``
    is read by ``0.5 * x`` too) is swapped, and Grappler optimizes the
    step as without LMS."""
    result = _check_function_step(LMS(**FIXED), _gelu_step)
    powers = [op for op in result.swapout_ops if "Pow" in op]
    assert len(powers) == 4
    assert result.grappler.same, "\n".join(result.grappler.lines())


def test_the_cube_gradient_power_swapped_changes_the_products(monkeypatch):
    """The cube step's ``tanh(m + 0.05 * m ** 3)`` reads ``m`` in no
    product of its own: with the gradient's power swapped anyway, Grappler
    orders ``0.05 * m * m ** 2`` otherwise (TensorFlow 2.15 and 2.21,
    oneDNN on or off), which is why `fusions.power_gradients` leaves it."""
    monkeypatch.setattr(fusions, "_read_by_a_product", lambda *a: True)
    result = _check_function_step(LMS(**FIXED))
    assert any("Pow" in op for op in result.swapout_ops)
    report = result.grappler
    assert not report.same
    assert {d.node for d in report.differences} == {
        "Pow", "mul", "Pow_3", "mul_3"}
    assert all(any("swapout_gradient_tape_Pow" in s for s in d.swaps)
               for d in report.differences)


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


def test_repair_drops_the_swaps_into_the_products_and_nothing_else(
        monkeypatch):
    """With the Pow and Square rules off, LMS swaps m into each layer's
    cube and Grappler groups the products otherwise (the test above);
    `grappler_repair` tries the plan on a copy, drops the swaps next to
    the differences, and the step is then optimized as without LMS."""
    merged = dict(fusions._MERGED_INTO)
    for kind in ("Pow", "Square"):
        merged.pop(kind)
    monkeypatch.setattr(fusions, "_MERGED_INTO", merged)
    plain = _check_function_step(LMS(**FIXED))
    lms = LMS(**FIXED)
    lms.grappler_repair = True
    repaired = _check_function_step(lms)
    assert not plain.grappler.same
    report = repaired.grappler
    assert report is not None and report.same, "\n".join(report.lines())
    # Only what stood next to a difference went: other tensors are still
    # swapped, and the swap-ins of m into the products are gone.
    assert 0 < len(repaired.swapout_ops) < len(plain.swapout_ops)
    named = {s for d in plain.grappler.differences for s in d.swaps}
    assert not named & set(repaired.swapin_ops + repaired.swapout_ops)
    # Applied to the step's own graph, the plan gives what the copy did.
    assert set(repaired.swapout_ops) <= set(plain.swapout_ops)


def test_repair_leaves_a_plan_grappler_keeps_as_it_is():
    plain = _check_function_step(LMS(**FIXED))
    lms = LMS(**FIXED)
    lms.grappler_repair = True
    repaired = _check_function_step(lms)
    assert repaired.grappler.same
    assert repaired.swapout_ops == plain.swapout_ops
    assert repaired.swapin_ops == plain.swapin_ops


def test_repair_of_a_session_graph_leaves_additions_grouped():
    """A Session graph's additions LMS swaps into are grouped otherwise
    (LMS keeps no Grappler groups there yet); repaired, they are not."""
    graph, train = _session_step()
    before = grappler_check.graph_def_of(graph)
    lms = LMS(**FIXED)
    lms.grappler_repair = True
    result = lms.run(graph, fetches=[train])
    assert result.rewritten
    assert result.grappler is not None and result.grappler.same
    # The real rewrite is what the copy was: checked on the graph itself.
    assert grappler_check.check(before, graph, [train.name]).same


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




# The wide step: 16 layers of 8192 x 128 activations (4 MiB each).
WIDE = dict(rows=8192, width=128, layers=16)
# The scaled step: 8 layers of 4M-element vectors (16 MiB each).
SCALED = dict(size=4 * 1024 * 1024, layers=8)


# Per layer ``tanh(m) + sin(m) + 0.5 * cos(m)`` of ``m = h @ w``: the
# arithmetic optimizer makes each sum one ``AddN`` of three.
_wide_step = _layered_step(lambda m: tf.tanh(m) + tf.sin(m) + tf.cos(m) * 0.5)


def _scaled_step(scales):
    """Per layer ``sin(a) + cos(a) + a * a`` of ``a = tanh(h * s)``, each
    ``s`` a scalar variable: the gradient of ``a`` is an ``AddN`` of three,
    shaped by the step's input through ``Shape`` and ``Reshape``."""
    def step(x):
        with tf.GradientTape() as tape:
            h = x
            for s in scales:
                a = tf.tanh(h * s)
                h = tf.sin(a) + tf.cos(a) + a * a
            loss = tf.reduce_sum(h * h)
        grads = tape.gradient(loss, scales)
        for s, g in zip(scales, grads):
            s.assign_sub(0.01 * g)
        return loss
    return step


def _function_graph(make_step, shape, input_shape):
    """The concrete function of `make_step`'s step over variables of
    `shape` (one per layer of the step's config), in a graph of its own."""
    layers = WIDE["layers"] if make_step is _wide_step else SCALED["layers"]
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        variables = [tf.compat.v1.get_variable(
            "w%d" % i, shape, use_resource=True,
            initializer=tf.compat.v1.initializers.random_normal(0, .03))
            for i in range(layers)]
        step = tf.function(make_step(variables))
        return step.get_concrete_function(
            tf.TensorSpec(input_shape, tf.float32)).graph


def _wide_function_graph():
    return _function_graph(_wide_step, [WIDE["width"]] * 2,
                           [WIDE["rows"], WIDE["width"]])


def _accumulated(graph):
    graph_def = grappler_check.graph_def_of(graph)
    fetches = [t.op.name for t in graph.outputs] + [
        op.name for op in graph.control_outputs]
    return grappler_check.accumulated_addns(grappler_check.optimize(
        graph_def, fetches, grappler_check.config_for(graph)))


def test_memory_optimizer_accumulates_with_the_inputs_shapes(monkeypatch):
    wide = _accumulated(_wide_function_graph())
    # Every layer's sum: its operands are live at the estimated peak.
    assert len(wide) == WIDE["layers"], wide
    assert all("AddOpsRewrite" in name for name in wide)
    scaled_graph = _function_graph(_scaled_step, [], [SCALED["size"]])
    scaled = _accumulated(scaled_graph)
    assert scaled == ("AddN_1",), scaled  # the last layer's gradient
    # The input as a feed: Grappler does not trust its shape as a value,
    # so the gradient's Reshape to Shape(x) has no shape, nor has the
    # AddN, and the memory optimizer skips it ("Shape not fully known").
    monkeypatch.setattr(grappler_check, "_inputs_with_shapes",
                        lambda graph_def: None)
    assert _accumulated(scaled_graph) == ()


def _accumulated_at_run_time(make_step, shape, input_shape, layers,
                             lms=None):
    """Trains `make_step`'s step once in eager mode (through
    ``lms.function`` with `lms`): ``{"ran": the AddN nodes the runtime
    accumulated (read from the graphs its executors ran), "checked":
    those grappler_check finds in the step (with LMS's edits, with
    `lms`)}``, and with `lms` whether every swap op ran."""
    from tflms.tf import function_api, swaps_ran
    tf.random.set_seed(0)
    variables = [tf.Variable(tf.random.normal(shape, 0, .03))
                 for _ in range(layers)]
    x = tf.random.normal(input_shape)
    if lms is not None:
        lms.grappler_check = True
        step = lms.function(make_step(variables))
    else:
        step = tf.function(make_step(variables))
    with function_api.partition_graphs_made() as graph_defs:
        step(x)
    ran = sorted(
        node.name.rpartition("StatefulPartitionedCall/")[2]
        for graph_def in graph_defs for node in graph_def.node
        if node.op == "DestroyTemporaryVariable")
    if lms is None:
        return dict(ran=ran, checked=list(
            _accumulated(step.get_concrete_function(x).graph)))
    return dict(ran=ran, checked=list(lms.last_run.grappler.accumulated[1]),
                swaps=len(lms.last_run.swapout_ops),
                all_ran=swaps_ran.checked(lms.last_run, graph_defs).all_ran)


def _main():
    import json
    from tflms import LMS
    wide = (_wide_step, [WIDE["width"]] * 2, [WIDE["rows"], WIDE["width"]],
            WIDE["layers"])
    result = dict(
        wide=_accumulated_at_run_time(*wide),
        wide_lms=_accumulated_at_run_time(*wide, lms=LMS(**FIXED)),
        scaled=_accumulated_at_run_time(
            _scaled_step, [], [SCALED["size"]], SCALED["layers"]))
    print("RESULT " + json.dumps(result))


@pytest.mark.numerics
def test_check_accumulates_what_the_runtime_accumulates():
    result, log = _keras3.result_of(os.path.abspath(__file__))
    wide = result["wide"]
    assert len(wide["ran"]) == WIDE["layers"], log[-3000:]
    assert wide["checked"] == wide["ran"]
    # With LMS's swaps the runtime accumulates none of the 16 sums, as
    # the check says (test_lms_swaps_change_the_accumulated_addns).
    lms = result["wide_lms"]
    assert lms["swaps"] > WIDE["layers"] and lms["all_ran"], log[-3000:]
    assert lms["ran"] == lms["checked"] == []
    scaled = result["scaled"]
    assert scaled["ran"] == ["AddN_1"], log[-3000:]
    assert scaled["checked"] == scaled["ran"]


def test_lms_swaps_change_the_accumulated_addns():
    """The effect docs/tf2.md describes and no rule of LMS's undoes: the
    swaps move Grappler's estimate of the step's peak, and the memory
    optimizer rewrites other ``AddN`` nodes (here: none of the 16)."""
    with tf.Graph().as_default():
        graph = _wide_function_graph()
    lms = LMS(**FIXED)
    lms.grappler_check = True
    result = rewrite.rewrite_function_graph(graph, lms.settings)
    assert result.rewritten and len(result.swapout_ops) > WIDE["layers"]
    report = result.grappler
    without, with_lms = report.accumulated
    assert len(without) == WIDE["layers"] and with_lms == ()
    assert not report.same
    summary = [line for line in report.lines()
               if "accumulated by the memory optimizer" in line]
    assert summary and without[0] in summary[0], report.lines()
    # Each turned sum shows as a node of another op.
    ops = {d.node for d in report.differences if d.kind == "op"}
    assert set(without) <= ops


if __name__ == "__main__":
    _main()
