"""Property-based fuzzing of the whole rewrite with hypothesis.

Hypothesis draws a random layered DAG training graph (a `GraphSpec`: mixed
ranks and widths, fan-in and fan-out, control edges, branches that reach no
loss, ops pinned to the CPU or to a GPU) and a random LMS configuration (fixed
or auto-tuned parameters, sync modes, serialization, filters, gpu_device,
learning mode). For each draw `check_example` asserts that LMS either

* raises one of its documented errors (`ValueError` and its subclasses:
  unknown filter names, a gpu_device matching no op, a batch size needed
  for auto-tuning, nothing fits the budget...) and leaves the graph exactly
  as it was, or
* rewrites the graph so that it stays acyclic, every swap op sits on the CPU
  and reads what it should, a second run is a no-op, and two training steps
  give exactly the losses and weights of the unrewritten twin graph.

The CI test runs `CI_EXAMPLES` derandomized examples; ``tools/fuzz_long.py``
runs the same property on many more random ones and prints counts.
"""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

from _stack import NEW_STACK
from tflms.tf import reader
from tflms import LMS, Outcome
from tflms import autotune
from tflms import graph_index as gi
from tflms.tf import rewriter
from tflms import simulator

_v1 = tf.compat.v1

# The newest stack's pass draws half as many (CI's time): there it checks
# that the newest TensorFlow runs the rewrites as 2.15 does, on fewer
# graphs; the counts asserted below scale with the draws.
CI_EXAMPLES = 100 if NEW_STACK else 200
BATCH = 3
INPUT_WIDTH = 4
WIDTHS = (2, 3, 5)
ACTIVATIONS = ("relu", "tanh", "sigmoid", "none")
DEVICES = (None, None, None, "/cpu:0", "/device:GPU:0")
FILTERS = ("excl_output_by_scopes", "excl_input_by_scopes",
           "incl_output_by_scopes", "incl_input_by_scopes",
           "excl_output_by_types", "excl_input_by_types",
           "incl_output_by_types", "incl_input_by_types")
# Op types that may or may not be in a drawn graph: filters naming an absent
# one must raise.
FILTER_TYPES = ("MatMul", "MatMul", "Relu", "Tanh", "Sigmoid", "AddN", "Mul",
                "ExpandDims", "ConcatV2", "Conv2D")
STEPS = 2


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """One node: a function of earlier nodes (or of the input, -1).

    kind: 'dense' (sum of projections + activation), 'gate' (a projection
      times the sigmoid of another), 'concat', 'rank3' (an outer product to
      a rank-3 tensor), 'vector' (a row sum, rank 1: never swapped).
    """

    kind: str
    inputs: tuple
    width: int
    activation: str
    controls: tuple
    device: object


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    nodes: tuple
    loss_nodes: tuple
    known_batch: bool
    momentum: bool
    resource_variables: bool = True
    # A node built under control_dependencies on a step counter's
    # increment (a side effect that only some fetches must set off).
    counted_node: object = None


@dataclasses.dataclass(frozen=True)
class LMSSpec:
    kwargs: dict
    batch_size: object
    is_training: bool
    autotune_gpu_mem: object
    filters: dict


@st.composite
def graph_specs(draw, max_nodes=8):
    n = draw(st.integers(2, max_nodes))
    nodes = []
    for i in range(n):
        kind = draw(st.sampled_from(
            ("dense", "dense", "dense", "gate", "concat", "rank3", "vector")))
        earlier = st.integers(-1, i - 1)
        arity = {"gate": 2, "concat": 2, "rank3": 1, "vector": 1}.get(
            kind, draw(st.integers(1, 3)))
        # Prefer recent nodes so graphs get deep, with long skip edges too.
        inputs = tuple(draw(st.one_of(st.just(i - 1), earlier))
                       for _ in range(arity))
        controls = tuple(sorted(set(draw(st.lists(
            st.integers(0, i - 1), max_size=2))))) if i else ()
        nodes.append(NodeSpec(
            kind=kind, inputs=inputs, width=draw(st.sampled_from(WIDTHS)),
            activation=draw(st.sampled_from(ACTIVATIONS)),
            controls=controls, device=draw(st.sampled_from(DEVICES))))
    # The loss reads the last node and maybe others; nodes nobody reads
    # form unused branches.
    extra = draw(st.lists(st.integers(0, n - 1), max_size=2))
    return GraphSpec(nodes=tuple(nodes),
                     loss_nodes=tuple(sorted(set(extra) | {n - 1})),
                     known_batch=draw(st.booleans()),
                     momentum=draw(st.booleans()),
                     resource_variables=draw(st.booleans()),
                     counted_node=draw(st.one_of(st.none(),
                                                 st.integers(0, n - 1))))


def _as_matrix(t):
    """A node output as a [batch, k] matrix."""
    if t.shape.rank == 1:
        return tf.expand_dims(t, -1)
    if t.shape.rank == 3:
        return tf.reduce_mean(t, axis=-1)
    return t


def _activation(name, t):
    return {"relu": tf.nn.relu, "tanh": tf.tanh, "sigmoid": tf.sigmoid,
            "none": tf.identity}[name](t)


def build_graph(spec, seed=0):
    """A training graph for `spec` in a new tf.Graph.

    Returns:
      (graph, handles) with loss, train, init, feed, and the tensors of
      the variables' values.
    """
    rng = np.random.RandomState(seed)
    graph = tf.Graph()
    counter = [0]

    def weight(rows, cols):
        counter[0] += 1
        value = rng.uniform(-0.8, 0.8, (rows, cols)).astype(np.float32)
        return _v1.Variable(value, name="w%d" % counter[0],
                            use_resource=spec.resource_variables)

    def project(t, width):
        m = _as_matrix(t)
        return tf.matmul(m, weight(int(m.shape[1]), width))

    with graph.as_default():
        x = _v1.placeholder(tf.float32, [BATCH if spec.known_batch else None,
                                         INPUT_WIDTH], name="x")
        outs = []
        for i, node in enumerate(spec.nodes):
            ins = [x if j < 0 else outs[j] for j in node.inputs]
            controls = [outs[j].op for j in node.controls]
            if i == spec.counted_node:
                count = _v1.Variable(0.0, name="count", use_resource=True)
                controls.append(count.assign_add(1.0).op)
            with tf.name_scope("n%d" % i), tf.device(node.device), \
                    tf.control_dependencies(controls):
                if node.kind == "dense":
                    h = tf.add_n([project(t, node.width) for t in ins])
                    out = _activation(node.activation, h)
                elif node.kind == "gate":
                    out = project(ins[0], node.width) * tf.sigmoid(
                        project(ins[1], node.width))
                elif node.kind == "concat":
                    out = tf.concat([_activation(node.activation,
                                                 project(t, node.width))
                                     for t in ins], axis=1)
                elif node.kind == "rank3":
                    m = project(ins[0], node.width)
                    out = tf.expand_dims(m, -1) * tf.expand_dims(
                        tf.tanh(m), 1)
                else:  # vector
                    out = tf.reduce_sum(
                        _activation(node.activation, _as_matrix(ins[0])),
                        axis=1)
            outs.append(out)
        # A projection head, so the loss always has a variable to train.
        head = project(outs[-1], 2)
        loss = tf.add_n([tf.reduce_mean(tf.square(head))]
                        + [tf.reduce_mean(tf.square(outs[j]))
                           for j in spec.loss_nodes], name="loss")
        if spec.momentum:
            opt = _v1.train.MomentumOptimizer(0.05, 0.9)
        else:
            opt = _v1.train.GradientDescentOptimizer(0.05)
        train = opt.minimize(loss, name="train")
        variables = _v1.global_variables()
        init = _v1.variables_initializer(variables, name="init")
        with tf.name_scope("values"):
            values = [v.read_value() for v in variables]
    feed = {x: rng.randn(BATCH, INPUT_WIDTH).astype(np.float32)}
    return graph, dict(loss=loss, train=train, init=init, feed=feed,
                       values=values)


@st.composite
def lms_specs(draw, graph_spec):
    auto = draw(st.integers(0, 9)) == 0

    def param(lo, hi):
        if auto and draw(st.booleans()):
            return -1
        return draw(st.integers(lo, hi))

    kwargs = dict(swapout_threshold=param(1, 8), swapin_ahead=param(1, 5),
                  swapin_groupby=param(0, 5),
                  sync_mode=draw(st.integers(0, 3)))
    if draw(st.integers(0, 3)) == 0:
        kwargs["serialization"] = draw(st.lists(st.one_of(
            st.integers(0, 40),
            st.tuples(st.integers(0, 40), st.integers(0, 60)).map(
                lambda ab: "%d:%d" % ab),
            st.integers(0, 40).map(lambda a: "%d:" % a)), max_size=3))
    if draw(st.integers(0, 5)) == 0:
        kwargs["serialization_by_size"] = draw(st.sampled_from((1e-9, 1e-6)))
    if draw(st.integers(0, 9)) == 0:
        kwargs["gpu_device"] = "/device:GPU:0"
    filters = {}
    if draw(st.integers(0, 3)) == 0:
        # Mostly names the graph has; some it cannot have, which must raise.
        name = draw(st.sampled_from(FILTERS))
        if name.endswith("_scopes"):
            pool = ["n%d/" % i for i in range(len(graph_spec.nodes))] + [
                "gradients/", "no_such_scope/"]
        else:
            pool = list(FILTER_TYPES)
        filters[name] = set(draw(st.lists(st.sampled_from(pool), min_size=1,
                                          max_size=2)))
    if draw(st.integers(0, 2)) == 0:
        kwargs["recompute"] = True
    return LMSSpec(
        kwargs=kwargs,
        batch_size=draw(st.sampled_from((None, BATCH))),
        is_training=draw(st.integers(0, 5)) != 0,
        autotune_gpu_mem=draw(st.sampled_from((1e-7, 2e-6, 1.0)))
        if auto else None,
        filters=filters)


@st.composite
def examples(draw):
    spec = draw(graph_specs())
    return spec, draw(lms_specs(spec))


def make_lms(lms_spec):
    lms = LMS(**lms_spec.kwargs)
    lms.batch_size = lms_spec.batch_size
    lms.is_training = lms_spec.is_training
    if lms_spec.autotune_gpu_mem is not None:
        lms.autotune_gpu_mem = lms_spec.autotune_gpu_mem
    for name, value in lms_spec.filters.items():
        setattr(lms, name, value)
    return lms


def session_config():
    """Soft placement (ops pinned to a GPU run on the CPU). Grappler's
    arithmetic optimizer is off: with a swap op between two additions it
    re-associates sums differently (as for the Transformer in
    test_equivalence), which changes the last bit of float results. With it
    off, equality is exact and tests what LMS decides."""
    config = _v1.ConfigProto(allow_soft_placement=True)
    config.graph_options.rewrite_options.arithmetic_optimization = (
        rewriter_config_pb2.RewriterConfig.OFF)
    return config


def _unshare_variables(graph_def, prefix):
    """A copy whose resource variables have their own names in a session
    (VarHandleOp's shared_name would otherwise make both twins update the
    same variables)."""
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    for node in copy.node:
        if node.op == "VarHandleOp":
            shared = "%s/%s" % (prefix, node.name)
            node.attr["shared_name"].s = shared.encode()
    return copy


def train_twins(base_def, lms_def, handles):
    """Train the unrewritten and the rewritten graph side by side in one
    session (each imported under its own prefix; initializers run without
    feeds), with an evaluation-only run after each step; returns both
    (losses, weights)."""
    graph = tf.Graph()
    with graph.as_default():
        for prefix, graph_def in (("base", base_def), ("lms", lms_def)):
            graph_def = _unshare_variables(graph_def, prefix)
            tf.import_graph_def(graph_def, name=prefix)

    def names(prefix):
        get_t = graph.get_tensor_by_name
        get_o = graph.get_operation_by_name
        return (get_o("%s/%s" % (prefix, handles["init"].name)),
                get_t("%s/%s" % (prefix, handles["loss"].name)),
                get_o("%s/%s" % (prefix, handles["train"].name)),
                [get_t("%s/%s" % (prefix, v.name))
                 for v in handles["values"]],
                {get_t("%s/%s" % (prefix, k.name)): v
                 for k, v in handles["feed"].items()})

    (b_init, b_loss, b_train, b_vars, b_feed), \
        (l_init, l_loss, l_train, l_vars, l_feed) = names("base"), \
        names("lms")
    feed = dict(b_feed)
    feed.update(l_feed)
    with _v1.Session(graph=graph, config=session_config()) as sess:
        sess.run([b_init, l_init])
        losses = []
        for _ in range(STEPS):
            losses.append(sess.run([b_loss, l_loss, b_train, l_train],
                                   feed)[:2])
            # Evaluation only: no update, no side effect LMS could add.
            losses.append(sess.run([b_loss, l_loss], feed))
        b_w, l_w = sess.run([b_vars, l_vars])
    return ([a for a, _ in losses], b_w), ([b for _, b in losses], l_w)


def signature(graph):
    return graph.as_graph_def().SerializeToString(deterministic=True)


def check_structure(graph, result, plan, index_before):
    swaps = [op for op in graph.get_operations()
             if "lms/swap" in op.name]
    assert len(swaps) == len(result.swapout_ops) + len(result.swapin_ops)
    for op in swaps:
        assert op.type == "Identity"
        assert gi.is_cpu_device(op.device), (op.name, op.device)
        assert op.get_attr(rewriter.SWAP_MARKER_ATTR) is True
        assert not op.control_inputs or "lms/swapin" in op.name
    for swap in plan.swaps:
        tensor = index_before.ops[swap.producer].outputs[swap.output]
        assert not gi.is_cpu_device(tensor.op.device)
        assert tensor.shape.rank >= 2
        for sin in swap.swap_ins:
            for consumer, slot in sin.consumers:
                read = index_before.ops[consumer].inputs[slot]
                assert read.op.name == rewriter.swapin_op_name(
                    tensor.name) or read.op.name.startswith(
                        rewriter.swapin_op_name(tensor.name) + "_")
                assert read.op.inputs[0].op.inputs[0] is tensor
                for t in sin.triggers:
                    assert index_before.ops[t] in read.op.control_inputs
    for rec in plan.recomputes:
        tensor = index_before.ops[rec.producer].outputs[rec.output]
        for consumer, slot in rec.consumers:
            read = index_before.ops[consumer].inputs[slot]
            assert "-lms/recompute_" in read.op.name, read.name
            assert read.op.type == tensor.op.type
            assert read.op.get_attr(rewriter.SWAP_MARKER_ATTR) is True
            assert index_before.ops[rec.trigger] in read.op.control_inputs
    # Acyclic (build_index raises GraphCycleError on a cycle), every edge
    # goes forward.
    after = reader.build_index(graph)
    for v in range(after.num_ops):
        for w in after.level_successors(v):
            assert after.levels[w] > after.levels[v]


# The errors a drawn configuration may meet, and what their messages say.
DOCUMENTED_ERRORS = {
    ValueError: ("no operation in the graph", "matches no operation"),
    simulator.BatchSizeError: ("without the mini-batch size",),
    autotune.AutotuneError: ("found no parameter set",
                             "found no plan that fits in"),
}


def assert_documented(error):
    """`error` is one LMS documents for such input, not a bug that happens
    to be a ValueError (a GraphCycleError, a TensorFlow error...)."""
    expected = DOCUMENTED_ERRORS.get(type(error))
    assert expected is not None, "undocumented %r" % error
    assert any(text in str(error) for text in expected), repr(error)


def check_example(graph_spec, lms_spec, stats=None):
    """The fuzzing property; returns the outcome name for counting."""
    stats = stats if stats is not None else collections.Counter()
    graph, handles = build_graph(graph_spec)
    base_def = graph.as_graph_def()
    before = base_def.SerializeToString(deterministic=True)
    index_before = reader.build_index(graph)
    lms = make_lms(lms_spec)
    try:
        result = lms.run(graph)
    except ValueError as e:  # LMS's documented errors all derive from it.
        assert_documented(e)
        assert signature(graph) == before, "graph changed before %r" % e
        outcome = "error:" + type(e).__name__
        stats[outcome] += 1
        return outcome
    if result.outcome is Outcome.NOT_NEEDED:
        assert signature(graph) == before
        stats["not needed"] += 1
        return "not needed"
    edited = signature(graph)
    added = result.swapout_ops or result.rewrite.recompute_ops
    if added:
        check_structure(graph, result, lms.last_run.plan, index_before)
    again = make_lms(lms_spec).run(graph)
    assert signature(graph) == edited, "a second run changed the graph"
    assert (again.outcome is Outcome.ALREADY_REWRITTEN
            or not added), (
        "a second run on a graph with swap ops or clones did not find them")
    outcome = "swapped" if result.swapout_ops else "nothing to swap"
    stats[outcome] += 1
    stats["swap ops"] += len(result.swapout_ops) + len(result.swapin_ops)
    stats["clones"] += len(result.rewrite.recompute_ops)
    if edited == before:
        return outcome
    (base_losses, base_weights), (losses, weights) = train_twins(
        base_def, graph.as_graph_def(), handles)
    assert losses == base_losses
    for a, b in zip(base_weights, weights):
        np.testing.assert_array_equal(a, b)
    return outcome


def test_random_graphs_and_parameters():
    """`CI_EXAMPLES` draws; the outcomes must not all be trivial."""
    stats = collections.Counter()

    @settings(max_examples=CI_EXAMPLES, deadline=None, derandomize=True,
              database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(examples())
    def prop(example):
        stats["examples"] += 1
        check_example(*example, stats=stats)

    prop()
    assert stats["examples"] >= CI_EXAMPLES, stats
    assert stats["swapped"] >= CI_EXAMPLES // 4, stats
    assert stats["swap ops"] >= CI_EXAMPLES, stats
    # recompute=True is drawn too
    assert stats["clones"] >= CI_EXAMPLES // 20, stats
    assert sum(v for k, v in stats.items()
               if k.startswith("error:")) >= CI_EXAMPLES // 40, stats
    print("fuzz outcomes:", dict(stats))


@pytest.mark.parametrize("controls", [(), (0,)])
def test_one_hand_written_example(controls):
    """A fixed example, so a failure of the property has a simple twin."""
    nodes = tuple(NodeSpec("dense", (i - 1,), 5, "relu",
                           controls if i > 1 else (), None)
                  for i in range(6))
    spec = GraphSpec(nodes=nodes, loss_nodes=(5,), known_batch=True,
                     momentum=False)
    lms_spec = LMSSpec(kwargs=dict(swapout_threshold=1, swapin_ahead=1,
                                   swapin_groupby=0), batch_size=None,
                       is_training=True, autotune_gpu_mem=None, filters={})
    assert check_example(spec, lms_spec) == "swapped"


def test_the_twin_comparison_sees_a_one_bit_change():
    """`train_twins` really compares: a learning rate changed in the last
    bit of the second twin changes its weights."""
    nodes = (NodeSpec("dense", (-1,), 5, "tanh", (), None),
             NodeSpec("dense", (0,), 3, "relu", (), None))
    spec = GraphSpec(nodes=nodes, loss_nodes=(1,), known_batch=True,
                     momentum=False)
    graph, handles = build_graph(spec)
    base_def = graph.as_graph_def()
    changed = graph_pb2.GraphDef()
    changed.CopyFrom(base_def)
    rates = [n for n in changed.node
             if n.name == "train/learning_rate" and n.op == "Const"]
    assert len(rates) == 1
    value = np.float32(rates[0].attr["value"].tensor.float_val[0])
    rates[0].attr["value"].tensor.float_val[0] = float(
        np.nextafter(value, np.float32(1)))
    (_, base_w), (_, other_w) = train_twins(base_def, changed, handles)
    assert any((a != b).any() for a, b in zip(base_w, other_w))
    (_, base_w), (_, same_w) = train_twins(base_def, base_def, handles)
    for a, b in zip(base_w, same_w):
        np.testing.assert_array_equal(a, b)


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
