"""tflms.tf.reader, the one reader of a tf.Graph: the step's fetches by
`tflms.step`'s rules, in order, and the facts `build_index` reads of the
ops (which of them forward an input). tests/test_step.py checks that LMS
plans and edits only the step; tests/test_graph_index.py the index's other
facts."""

import pytest
import tensorflow as tf

from tflms import LMS
from tflms.tf import reader
from tflms.tf import rewriter

from _graphs import tiny_step


def test_rules_in_order():
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.get_variable("w", [4], use_resource=True)
        loss = tf.reduce_sum(w * w)
        grad = tf.gradients(loss, [w])[0]
        update = w.assign_sub(0.1 * grad)
        other = tf.reduce_max(w, name="other")
    # 3b: an assignment to a trainable variable from a gradient.
    found = reader.find_fetches(graph)
    assert found.ops == (update.op,)
    assert found.rule == "the optimizer updates of the graph (1 op)"
    # 1: the fetches given win, as names, tensors or nested lists.
    given = reader.find_fetches(graph, {"a": [other, "AssignSubVariableOp"]})
    assert [op.name for op in given.ops] == [update.op.name, "other"]
    assert given.rule == "the fetches passed to run() (2 ops)"
    with graph.as_default():
        apply = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss)
    # 2: the train_op collection (the v1 optimizer adds its op).
    assert reader.find_fetches(graph).ops == (apply,)
    graph.clear_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    # 3a: Apply* ops.
    assert [op.type for op in reader.find_fetches(graph).ops] == [
        "ResourceApplyGradientDescent"]


def test_whole_graph_when_nothing_names_the_step():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        tf.nn.relu(x)
    found = reader.find_fetches(graph)
    assert found.whole_graph and found.ops == ()
    assert found.rule.startswith("the whole graph")
    index = reader.build_index(graph)
    assert index.num_ops == index.graph_num_ops == 2 and index.fetches == ()


@pytest.mark.parametrize("fetches, message", [
    ([], r"^fetches is empty: pass the train op"),
    ("nope", r"^fetches: 'nope' names nothing in the graph .*; pass an op "
             r"name such as 'train_op'"),
    ([3], r"^fetches: 3 is not an op, a tensor, a variable or a name"),
])
def test_bad_fetches(fetches, message):
    graph, train_op, _ = tiny_step()
    with pytest.raises(ValueError, match=message):
        reader.find_fetches(graph, fetches)
    with pytest.raises(ValueError, match=message):
        LMS().run(graph, fetches=fetches)
    assert not rewriter.is_rewritten(graph)


def test_fetch_of_another_graph():
    graph, _, _ = tiny_step()
    _, other_op, _ = tiny_step()
    with pytest.raises(ValueError, match=r"^fetches: .* belongs to another "
                       r"graph than the one LMS edits; pass ops of that"):
        reader.find_fetches(graph, other_op)


def test_forwards_input_of_real_ops():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 4], name="x")
        ops = {
            "x_times_one": x * 1.0, "one_times_x": tf.multiply(1.0, x),
            "x_plus_zero": x + tf.zeros([4]), "x_minus_zero": x - 0.0,
            "x_over_one": x / 1.0, "stop": tf.stop_gradient(x),
            "x_times_two": x * 2.0, "zero_minus_x": 0.0 - x,
            # Broadcasting makes a new, larger tensor: not an identity.
            "broadcast": x * tf.ones([3, 2, 4]),
        }
    index = reader.build_index(graph)
    got = {name: index.forwards_input[index.id_of[t.op.name]]
           for name, t in ops.items()}
    assert got == {"x_times_one": 0, "one_times_x": 1, "x_plus_zero": 0,
                   "x_minus_zero": 0, "x_over_one": 0, "stop": 0,
                   "x_times_two": None, "zero_minus_x": None,
                   "broadcast": None}


def test_fan_in_follows_data_and_control_inputs_only():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
        a = tf.nn.relu(x, name="a")
        marker = tf.no_op(name="marker")
        with tf.control_dependencies([marker]):
            b = tf.identity(a, name="b")
        tf.square(b, name="reads_b")  # a consumer: not in b's fan-in
        tf.square(x, name="beside")
    assert set(reader.fan_in([b.op])) == {"x", "a", "marker", "b"}
    assert set(reader.fan_in([graph.get_operation_by_name("beside")])) == \
        {"x", "beside"}


def test_fetch_ops_of_takes_what_session_run_takes():
    graph, train_op, loss = tiny_step()
    with graph.as_default():
        w = tf.compat.v1.global_variables()[0]
    got = reader.fetch_ops_of(
        graph, {"step": [train_op, "eval_head"], "loss": (loss, loss.op),
                "w": w, "by_tensor_name": "eval_head:0"})
    # Graph order, each op once; the variable is its op.
    order = [op.name for op in graph.get_operations()]
    assert [op.name for op in got] == sorted(
        {w.op.name, loss.op.name, "eval_head", train_op.name},
        key=order.index)


def test_keras_train_fetches_are_the_train_functions():
    """A Keras 2 model in graph mode: none before it made its train
    function (predict, evaluate), then its outputs and updates."""
    from tflms.tf import compat
    keras = compat.keras2()
    graph = tf.Graph()
    with graph.as_default():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        assert reader.keras_train_fetches(graph, model) is None
        model._make_train_function()
    found = reader.keras_train_fetches(graph, model)
    assert found.rule.startswith("the Keras train function's fetches (")
    # One step of it runs the optimizer's update of the kernel and bias.
    applied = [op for op in reader.fan_in(found.ops).values()
               if op.type == "ResourceApplyGradientDescent"]
    assert len(applied) == 2
    # Another graph's model gives nothing to fetch here.
    assert reader.keras_train_fetches(tf.Graph(), model) is None
