"""The graph index: literal graphs (`from_edges`), its bad-input errors, and
the facts `build_index` reads from TensorFlow."""

import dataclasses
import random

import pytest
import tensorflow as tf

from tflms.tf import reader
from tflms import analysis
from tflms import graph_index as gi
from tflms import dag_levels


def diamond():
    """x -> a, b; a -> c (slot 0), b:1 -> c (slot 1); x ~> b (control);
    a ~> d (control), c -> d.

    Levels: x 0, a 1, b 1, c 2, d 3.
    """
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [((None, 8), 4)]}),
         ("a", "Relu", {"outputs": [64]}),
         ("b", "Split", {"outputs": [16, ((2, 3), 2)]}),
         ("c", "AddV2", {"outputs": [(None, 4)]}),
         ("d", "NoOp")],
        edges=[("x", "a"), ("x", "b"), ("a", "c"), ("b:1", "c"),
               ("c", "d")],
        control_edges=[("x", "b"), ("a", "d")])


def test_literal_index_structure():
    index = diamond()
    assert index.ops is None
    assert index.names == ("x", "a", "b", "c", "d")
    assert index.id_of == {"x": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    assert index.types == ("Placeholder", "Relu", "Split", "AddV2", "NoOp")
    assert index.devices == (gi.DEFAULT_DEVICE,) * 5
    assert index.levels == (0, 1, 1, 2, 3)
    assert index.ops_by_level == ((0,), (1, 2), (3,), (4,))
    assert index.inputs == ((), ((0, 0),), ((0, 0),), ((1, 0), (2, 1)),
                            ((3, 0),))
    assert index.consumers == (
        (((1, 0), (2, 0)),), (((3, 0),),), ((), ((3, 1),)), (((4, 0),),),
        ((),))
    assert index.fanins == ((), (0,), (0,), (1, 2), (3,))
    assert index.fanouts == ((1, 2), (3,), (3,), (4,), ())
    assert index.control_inputs == ((), (), (0,), (), (1,))
    assert index.control_outputs == ((2,), (4,), (), (), ())
    assert index.predecessors(4) == (1, 3)
    assert index.successors(0) == (1, 2)
    assert index.successors(1) == (3, 4)
    assert index.num_ops == 5
    assert index.num_levels == 4
    # 5 data edges between distinct ops, 2 control edges.
    assert index.num_edges == 7


def test_literal_sizes():
    index = diamond()
    assert index.output_shapes == (((None, 8),), ((1, 64),),
                                   ((1, 16), (2, 3)), (None,), (None,))
    assert index.output_itemsizes == ((4,), (1,), (1, 2), (4,), (0,))
    assert gi.tensor_bytes(index, 0, 0) is None
    assert gi.tensor_bytes(index, 0, 0, batch_size=3) == 3 * 8 * 4
    assert gi.tensor_bytes(index, 1, 0) == 64
    assert gi.tensor_bytes(index, 2, 0) == 16
    assert gi.tensor_bytes(index, 2, 1) == 12
    assert gi.tensor_bytes(index, 3, 0, batch_size=3) is None  # unknown rank
    # Default output: unknown shape, no bytes.
    assert gi.tensor_bytes(index, 4, 0) == 0


def test_literal_facts_and_defaults():
    index = gi.from_edges(
        [("w", "VariableV2", {"variable_bytes": 400, "trainable": True,
                              "stateful": True, "device": "/cpu:0"}),
         ("m", "VariableV2", {"variable_bytes": 100, "stateful": True}),
         ("bn", "FusedBatchNormV3", {"bn_is_training": False,
                                     "in_v1_cond": True}),
         ("l", "Mul", {"in_v1_loop": True}),
         ("f", "StatefulPartitionedCall", {"calls_collective": True})],
        default_device="/device:GPU:1")
    assert index.devices == ("/cpu:0",) + ("/device:GPU:1",) * 4
    assert index.variable_bytes == (400, 100, 0, 0, 0)
    assert index.trainable_bytes == (400, 0, 0, 0, 0)
    assert index.is_stateful == (True, True, False, False, False)
    assert index.bn_is_training == (None, None, False, None, None)
    assert index.in_v1_cond == (False, False, True, False, False)
    assert index.in_v1_loop == (False, False, False, True, False)
    assert index.calls_collective == (False, False, False, False, True)
    assert analysis.learning_parameter_bytes(index) == 400
    assert index.levels == (0,) * 5


def test_next_iteration_is_no_edge_for_levels():
    ops = [("enter", "Enter"), ("merge", "Merge"), ("body", "Relu"),
           ("next", "NextIteration")]
    edges = [("enter", "merge"), ("next", "merge"), ("merge", "body"),
             ("body", "next")]
    index = gi.from_edges(ops, edges)
    assert index.levels == (0, 1, 2, 3)
    assert index.inputs[1] == ((0, 0), (3, 0))
    # The same loop with an ordinary op closing it is a cycle.
    ops[3] = ("next", "Identity")
    with pytest.raises(dag_levels.GraphCycleError,
                       match=r"the graph has a cycle: 3 of 4 nodes"):
        gi.from_edges(ops, edges)


def _tf_graph_and_literal_twin():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 8], use_resource=False)
        h = tf.matmul(x, w, name="h")
        parts = tf.split(h, 2, axis=1, name="parts")
        with tf.control_dependencies([parts[0].op]):
            y = tf.concat([parts[1], h], 1, name="y")
        tf.identity(y, name="out")
    literal = gi.from_edges(
        [(op.name, op.type) for op in graph.get_operations()],
        edges=[(t.name, op.name) for op in graph.get_operations()
               for t in op.inputs],
        control_edges=[(c.name, op.name) for op in graph.get_operations()
                       for c in op.control_inputs])
    return graph, literal


def test_literal_twin_of_a_tf_graph_has_its_structure():
    graph, literal = _tf_graph_and_literal_twin()
    index = reader.build_index(graph)
    for field in ("names", "types", "inputs", "control_inputs",
                  "control_outputs", "fanins", "fanouts", "levels",
                  "ops_by_level", "id_of"):
        assert getattr(literal, field) == getattr(index, field), field
    # Consumers agree on every output the edges read.
    for i in range(index.num_ops):
        for out, readers in enumerate(literal.consumers[i]):
            assert readers == index.consumers[i][out]


def test_build_index_reads_trainable_bytes_and_collective_calls():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        tf.compat.v1.get_variable("w", [3, 5], dtype=tf.float64)
        tf.compat.v1.get_variable("frozen", [7], trainable=False)

        @tf.function
        def reduce(t):
            return tf.raw_ops.CollectiveReduceV2(
                input=t, group_size=1, group_key=1, instance_key=1,
                ordering_token=[], merge_op="Add", final_op="Id")

        @tf.function
        def outer(t):
            return reduce(t) * 2.0

        @tf.function
        def plain(t):
            return t + 1.0

        outer(x)
        plain(x)
    index = reader.build_index(graph)
    by_name = dict(zip(index.names, index.trainable_bytes))
    assert by_name["w"] == 3 * 5 * 8
    assert by_name["frozen"] == 0
    assert sum(index.trainable_bytes) == 120
    calls = [(index.types[i], index.calls_collective[i])
             for i in range(index.num_ops)
             if index.types[i] in gi.FUNCTION_CALL_TYPES]
    # outer calls reduce, which holds the collective; plain holds none.
    assert sorted(calls) == [("PartitionedCall", False),
                             ("StatefulPartitionedCall", True)]


# ---- bad input -------------------------------------------------------------
BAD_LITERALS = [
    (dict(ops=["x"]),
     r"^ops\[0\] must be a \(name, type\) or \(name, type, facts\) tuple "
     r"with non-empty strings; got 'x'$"),
    (dict(ops=[("x", "")]),
     r"^ops\[0\] must be .*; got \('x', ''\)$"),
    (dict(ops=[("x", "Relu"), ("x", "Relu")]),
     r"^ops\[1\]: op name 'x' is already ops\[0\]; names must be unique$"),
    (dict(ops=[("x", "Relu", [1024])]),
     r"^ops\[0\] \('x'\): facts must be a dict such as \{'outputs': "
     r"\[1024\]\}; got \[1024\]$"),
    (dict(ops=[("x", "Relu", {"devcie": "/cpu:0"})]),
     r"^ops\[0\] \('x'\): unknown fact 'devcie'; the facts are "
     r"bn_is_training, calls_collective, device, flops, forwards_input, "
     r"in_v1_cond, in_v1_loop, outputs, stateful, trainable, variable_bytes$"),
    (dict(ops=[("x", "MatMul", {"flops": -1})]),
     r"^ops\[0\] \('x'\): flops must be an int >= 0 or a \(fixed, "
     r"per_example\) pair of ints >= 0 such as \(0, 2048\); got -1$"),
    (dict(ops=[("x", "MatMul", {"flops": (1, 2, 3)})]),
     r"^ops\[0\] \('x'\): flops must be .*; got \(1, 2, 3\)$"),
    (dict(ops=[("x", "Relu")], edges=[("y", "x")]),
     r"^edges\[0\]: no op named 'y'; edges name ops of `ops`$"),
    (dict(ops=[("x", "Relu")], edges=[("x", "y")]),
     r"^edges\[0\]: no op named 'y'; edges name ops of `ops`$"),
    (dict(ops=[("x", "Relu")], edges=["x"]),
     r"^edges\[0\] must be a \(tensor, consumer\) pair such as "
     r"\('a:0', 'b'\); got 'x'$"),
    (dict(ops=[("x", "Relu"), ("y", "Relu")], edges=[("x:one", "y")]),
     r"^edges\[0\]: tensor 'x:one' must be 'op' or 'op:k' with k an "
     r"int >= 0$"),
    (dict(ops=[("x", "Relu", {"outputs": [8]}), ("y", "Relu")],
          edges=[("x:1", "y")]),
     r"^ops\[0\] \('x'\): the edges read output 1 but outputs lists 1; "
     r"list one entry per output$"),
    (dict(ops=[("x", "Relu", {"outputs": [-5]})]),
     r"^ops\[0\] \('x'\): outputs\[0\] must be a byte count \(int >= 0\) "
     r"or a \(shape, itemsize\) pair such as \(\(None, 128\), 4\); "
     r"got -5$"),
    (dict(ops=[("x", "Relu", {"outputs": [((2, -1), 4)]})]),
     r"^ops\[0\] \('x'\): outputs\[0\] must be .*; got \(\(2, -1\), 4\)$"),
    (dict(ops=[("x", "Relu", {"outputs": 8})]),
     r"^ops\[0\] \('x'\): outputs must be a list with one entry per "
     r"output, e.g. \[1024\]; got 8$"),
    (dict(ops=[("x", "Relu", {"stateful": 1})]),
     r"^ops\[0\] \('x'\): stateful must be True or False; got 1$"),
    (dict(ops=[("x", "Relu", {"bn_is_training": "yes"})]),
     r"^ops\[0\] \('x'\): bn_is_training must be None, True or False; "
     r"got 'yes'$"),
    (dict(ops=[("x", "Relu", {"variable_bytes": 1.5})]),
     r"^ops\[0\] \('x'\): variable_bytes must be an int >= 0; got 1.5$"),
    (dict(ops=[("x", "Relu", {"device": 0})]),
     r"^ops\[0\] \('x'\): device must be a string such as "
     r"'/device:GPU:0' \(\'\' for unplaced\); got 0$"),
    (dict(ops=[("x", "Relu", {"device": "/device:GPU:zero"})]),
     r"^ops\[0\] \('x'\): device string '/device:GPU:zero' cannot be "
     r"parsed \(invalid literal for int\(\) .*\); use a string such as "
     r"'/device:GPU:0' or '/job:worker/task:1/device:CPU:0'$"),
    (dict(ops=[("x", "Relu")], control_edges=[("x", "z")]),
     r"^control_edges\[0\]: no op named 'z'; edges name ops of `ops`$"),
    (dict(ops=[("x", "Relu")], control_edges=[("x",)]),
     r"^control_edges\[0\] must be a \(from_op, to_op\) pair of names; "
     r"got \('x',\)$"),
]


@pytest.mark.parametrize("kwargs, message", BAD_LITERALS,
                         ids=[str(i) for i in range(len(BAD_LITERALS))])
def test_from_edges_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gi.from_edges(**kwargs)


# ---- device strings --------------------------------------------------------
DEVICES = [
    "", "/cpu:0", "/CPU:1", "/gpu:0", "/GPU", "/device:GPU:1",
    "/device:gpu:0", "/device:GPU:*", "/job:ps/cpu:1", "/task:1",
    "/job:worker/replica:0/task:2/device:GPU:3", "/CPU:0/job:x",
    "/job:localhost/replica:0/task:0/device:CPU:0",
]


@pytest.mark.parametrize("device", DEVICES)
def test_parse_device_agrees_with_tensorflow(device):
    spec = tf.DeviceSpec.from_string(device)
    want = (spec.job, spec.replica, spec.task,
            spec.device_type.upper() if spec.device_type else None,
            spec.device_index)
    assert tuple(gi.parse_device(device)) == want
    assert gi.is_cpu_device(device) == (want[3] == "CPU")


@pytest.mark.parametrize("device", [
    "/device:GPU:0/device:CPU:0", "/gpu:0/cpu:0", "/task:x", "/a:b:c",
    "/device:GPU:1:2", "/job", "/device:GPU:x",
])
def test_parse_device_refuses_what_tensorflow_refuses(device):
    with pytest.raises(ValueError):
        tf.DeviceSpec.from_string(device)
    with pytest.raises(ValueError, match=r"^device string %r cannot be "
                       r"parsed \(.*\); use a string such as" % device):
        gi.parse_device(device)


def test_both_constructors_fill_every_per_op_field():
    """`build_index` and `from_edges` end in the same assembly; each gives
    every per-op field one entry per op of the step."""
    graph, literal = _tf_graph_and_literal_twin()
    index = reader.build_index(graph)
    whole = ("ops", "ops_by_level", "id_of", "planned_edges", "fetches",
             "step_rule", "graph_num_ops")
    for built in (literal, index):
        short = [f.name for f in dataclasses.fields(built)
                 if f.name not in whole
                 and len(getattr(built, f.name)) != built.num_ops]
        assert not short, short
    assert literal.planned_edges == index.planned_edges == ()



# ---- tensors whose unknown first dimension is not the batch ----------------
def test_shape_vectors_have_their_rank_bound_and_counts_no_size():
    """`unbatched_elements`: a BroadcastGradientArgs of a 3- and a 2-long
    shape has at most 3 reduction axes, arithmetic on it as many, a
    concatenation the sum; Where's rows and the rows gathered by them are
    counted by the data (no size); a batch-sized int vector (labels), and
    a Tile whose multiples are a shape vector, keep the batch rule."""
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [((4, 6, 16), 4)]}),
         ("s0", "Const", {"outputs": [((3,), 4)]}),
         ("s1", "Const", {"outputs": [((2,), 4)]}),
         ("one", "Const", {"outputs": [((), 4)]}),
         ("bga", "BroadcastGradientArgs",
          {"outputs": [((None,), 4), ((None,), 4)]}),
         ("axes", "AddV2", {"outputs": [((None,), 4)]}),
         ("cat", "ConcatV2", {"outputs": [((None,), 8)]}),
         ("labels", "Placeholder", {"outputs": [((None,), 4)]}),
         ("cast", "Cast", {"outputs": [((None,), 8)]}),
         ("tile", "Tile", {"outputs": [((None,), 4)]}),
         ("where", "Where", {"outputs": [((None, 3), 8)]}),
         ("rows", "GatherNd", {"outputs": [((None,), 4)]}),
         ("flat", "Reshape", {"outputs": [((None,), 8)]}),
         ("unique", "Unique", {"outputs": [((None,), 4), ((None,), 4)]})],
        edges=[("s0", "bga"), ("s1", "bga"), ("bga:1", "axes"),
               ("one", "axes"), ("axes", "cat"), ("s1", "cat"),
               ("one", "cat"), ("labels", "cast"), ("one", "tile"),
               ("cat", "tile"), ("x", "where"), ("x", "rows"),
               ("where", "rows"), ("where", "flat"), ("one", "flat"),
               ("labels", "unique")])
    by_name = dict(zip(index.names, index.unbatched_elements))
    assert by_name["bga"] == (3, 3)
    assert by_name["axes"] == (3,)
    assert by_name["cat"] == (5,)
    dependent = gi.unbatched.DATA_DEPENDENT
    assert by_name["where"] == by_name["rows"] == by_name["flat"] == (
        dependent,)
    # Unique's values are counted by the data, its indices are as long as
    # its input: the batch.
    assert by_name["unique"] == (dependent, None)
    for name in ("x", "s0", "labels", "cast", "tile"):
        assert by_name[name] == (None,), name
    size = {name: [gi.tensor_bytes(index, index.id_of[name], k, batch)
                   for k in range(len(index.output_shapes[index.id_of[
                       name]])) for batch in (None, 50)]
            for name in ("bga", "cat", "where", "rows", "cast", "unique")}
    assert size["bga"] == [12, 12, 12, 12]
    assert size["cat"] == [40, 40]
    assert size["where"] == size["rows"] == [None, None]
    assert size["cast"] == [None, 400]
    assert size["unique"] == [None, None, None, 200]


def test_tensorflow_shape_vectors_and_masks_are_not_batch_sized():
    """The ops TensorFlow makes: the gradient of a matrix product that
    broadcasts its batch dimensions computes BroadcastGradientArgs of the
    two batch shapes (1 and 0 long) even when every shape is static, with
    outputs of shape (?), as in Keras 3's MultiHeadAttention; a boolean
    mask is a Where, a reshape and a GatherV2. Only the batch-sized
    tensors keep the batch rule."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (4, 6, 16))
        w = tf.compat.v1.placeholder(tf.float32, (16, 16))
        labels = tf.compat.v1.placeholder(tf.int32, (None,))
        y = tf.linalg.matmul(x, w)
        picked = tf.boolean_mask(tf.reshape(y, (24, 16)),
                                 tf.reshape(y[:, :, 0] > 0, (24,)))
        loss = tf.reduce_sum(picked) + tf.reduce_sum(
            tf.cast(labels, tf.float32))
        grads = tf.gradients(loss, [x, w])
    index = reader.build_index(graph, [g.op for g in grads] + [loss.op])
    by_type = {}
    for i, t in enumerate(index.types):
        by_type.setdefault(t, []).append(index.unbatched_elements[i])
    assert by_type["BroadcastGradientArgs"]
    for entry in by_type["BroadcastGradientArgs"]:
        assert entry == (1, 1)
    bga = index.types.index("BroadcastGradientArgs")
    assert gi.tensor_bytes(index, bga, 0) == 4  # no batch size needed
    dependent = gi.unbatched.DATA_DEPENDENT
    assert by_type["Where"] == [(dependent,)]
    assert (dependent,) in by_type["GatherV2"]
    labels_id = index.id_of[labels.op.name]
    assert index.unbatched_elements[labels_id] == (None,)
    assert gi.tensor_bytes(index, labels_id, 0, 8) == 32


# ---- FLOPs ------------------------------------------------------------------
def test_literal_flops():
    index = gi.from_edges([("a", "MatMul", {"flops": 12}),
                           ("b", "Conv2D", {"flops": (5, 7)}),
                           ("c", "Relu")])
    assert index.flops == ((12, 0), (5, 7), (0, 0))
    assert gi.op_flops(index, 0) == 12
    assert gi.op_flops(index, 1, batch_size=3) == 26
    assert gi.op_flops(index, 1) is None
    assert gi.op_flops(index, 2, batch_size=3) == 0


def _tf_flops(graph, op):
    from tensorflow.python.framework import ops as tf_ops
    return tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value


def test_flops_agree_with_tensorflows_statistics():
    """Forward ops at static shapes: the index's count is TensorFlow's
    registered statistic; their gradients cost the forward op's count."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 9, 9, 3])
        w = tf.compat.v1.get_variable("w", [3, 3, 3, 8])
        conv = tf.nn.conv2d(x, w, 2, "SAME")
        v = tf.compat.v1.placeholder(tf.float32, [2, 5, 6, 6, 2])
        k = tf.compat.v1.get_variable("k", [2, 3, 3, 2, 4])
        conv3d = tf.nn.conv3d(v, k, [1, 1, 1, 1, 1], "VALID")
        flat = tf.reshape(conv, [4, 5 * 5 * 8])
        m = tf.compat.v1.get_variable("m", [10, 200])
        product = tf.matmul(flat, m, transpose_b=True)
        batched = tf.matmul(tf.ones([3, 4, 5]), tf.ones([3, 5, 6]))
        d = tf.compat.v1.get_variable("d", [3, 3, 3, 2])
        depthwise = tf.compat.v1.nn.depthwise_conv2d_native(
            x, d, [1, 1, 1, 1], "SAME", name="Depthwise")
        loss = (tf.reduce_sum(product) + tf.reduce_sum(conv3d)
                + tf.reduce_sum(batched) + tf.reduce_sum(depthwise))
        tf.compat.v1.gradients(loss, [x, w, m, v, k, d])
    index = reader.build_index(graph)
    by_name = {op.name: op for op in graph.get_operations()}
    for name in ("Conv2D", "Conv3D", "MatMul", "Depthwise"):
        op = by_name[name]
        assert index.flops[index.id_of[name]] == (_tf_flops(graph, op), 0)
    assert index.flops[index.id_of["Conv2D"]] == (2 * 4 * 5 * 5 * 8 * 27, 0)
    assert index.flops[index.id_of["MatMul_1"]] == (2 * 3 * 4 * 6 * 5, 0)
    for forward, grads in (("Conv2D", ("Conv2DBackpropInput",
                                       "Conv2DBackpropFilter")),
                           ("Conv3D", ("Conv3DBackpropInputV2",
                                       "Conv3DBackpropFilterV2")),
                           ("MatMul", ("MatMul",)),
                           ("Depthwise", (
                               "DepthwiseConv2dNativeBackpropInput",
                               "DepthwiseConv2dNativeBackpropFilter"))):
        want = index.flops[index.id_of[forward]]
        found = [index.flops[i] for i, op in enumerate(index.types)
                 if op in grads and index.names[i].startswith(
                     "gradients/%s_grad/" % forward)]
        assert found and all(f == want for f in found), (forward, found)
    assert all(index.flops[i] == (0, 0) for i, t in enumerate(index.types)
               if t not in gi.FLOP_TYPES)


def test_flops_grow_with_an_unknown_batch():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6])
        w = tf.compat.v1.get_variable("w", [6, 5])
        y = tf.matmul(x, w)
        tf.compat.v1.gradients(tf.reduce_sum(y), [w])
        z = tf.compat.v1.placeholder(tf.float32, [None, None])
        tf.matmul(z, w[:, :1] * tf.ones([1, 7]), name="unknown")
    index = reader.build_index(graph)
    assert index.flops[index.id_of["MatMul"]] == (0, 60)
    # The weight gradient x^T dy: its output is known, its inner dimension
    # is the batch.
    assert index.flops[index.id_of[
        "gradients/MatMul_grad/MatMul_1"]] == (0, 60)
    assert gi.op_flops(index, index.id_of["MatMul"], 32) == 60 * 32
    # Two unknown dimensions: no count.
    assert index.flops[index.id_of["unknown"]] == (0, 0)


def test_acyclic_edges_drops_each_edge_that_closes_a_cycle():
    """All edges kept when they close no cycle; otherwise each edge that
    closes one with the graph or with the edges kept before it is left
    out, and the others kept in their order."""
    index = gi.from_edges(
        [("a", "Relu"), ("b", "Relu"), ("c", "Relu"), ("d", "Relu")],
        edges=[("a", "b"), ("b", "c")])
    a, b, c, d = (index.id_of[n] for n in "abcd")
    assert gi.acyclic_edges(index, [(a, d), (d, c)]) == ((a, d), (d, c))
    assert gi.acyclic_edges(index, [(c, d), (c, a), (d, b), (a, d)]) == (
        (c, d), (a, d))
    assert gi.acyclic_edges(index, []) == ()


@pytest.mark.parametrize("seed", range(8))
def test_acyclic_edges_keeps_what_levelling_edge_by_edge_keeps(seed):
    """On random graphs, the edges kept are those `with_planned_edges`
    accepts one after the other (the definition), planned edges of the
    index counted."""
    rng = random.Random(seed)
    n = 40
    names = ["n%d" % i for i in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    edges = [(names[order[i]], names[order[j]]) for i in range(n)
             for j in range(i + 1, n) if rng.random() < 0.06]
    index = gi.from_edges([(m, "Relu") for m in names], edges=edges)
    pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(12)]
    index = gi.with_planned_edges(index, gi.acyclic_edges(index, pairs[:3]))
    offered = [(rng.randrange(n), rng.randrange(n)) for _ in range(40)]
    kept, ordered = [], index
    for edge in offered:
        try:
            ordered = gi.with_planned_edges(ordered, (edge,))
        except dag_levels.GraphCycleError:
            continue
        kept.append(edge)
    assert gi.acyclic_edges(index, offered) == tuple(kept)


def test_readers_through_passing_ops():
    """`readers_through` hands a value on through the passing types (an
    IdentityN slot by slot), leaves out the ignored readers, and lists a
    reader once."""
    index = gi.from_edges(
        [("x", "Placeholder"), ("y", "Placeholder"), ("i", "Identity"),
         ("n", "IdentityN"), ("s", "Shape"), ("m", "MatMul"),
         ("r", "Relu"), ("q", "Neg")],
        edges=[("x", "i"), ("x", "s"), ("i", "m"), ("x", "m"),
               ("y", "n"), ("x", "n"), ("n:0", "r"), ("n:1", "q")])
    passing = frozenset({"Identity", "IdentityN"})
    assert sorted(index.names[r] for r in index.readers_through(
        (0, 0), passing, ignored=frozenset({"Shape"}))) == ["m", "q"]
    assert sorted(index.names[r] for r in index.readers_through(
        (0, 0), passing)) == ["m", "q", "s"]
    # Without IdentityN passing, it is a reader itself.
    assert sorted(index.names[r] for r in index.readers_through(
        (0, 0), frozenset({"Identity"}))) == ["m", "n", "s"]
