"""Conditionals and loops, in both control-flow styles: v1 (Switch/Merge,
Enter/Exit) and v2 (If/While ops)."""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS
from tflms import analysis
from tflms import graph_index as gi

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def keras_bn_graph():
    """A Keras CNN with batch norm; its learning-phase conds are v1 or v2
    depending on the control-flow setting when it is built."""
    tf.keras.backend.clear_session()
    inp = tf.keras.Input((10, 10, 3))
    h = inp
    for i in range(3):
        h = tf.keras.layers.Conv2D(
            6, 3, padding="same",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=i))(h)
        h = tf.keras.layers.BatchNormalization()(h)
        h = tf.keras.layers.Activation("relu")(h)
    h = tf.keras.layers.Flatten()(h)
    out = tf.keras.layers.Dense(
        3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=5))(h)
    model = tf.keras.Model(inp, out)
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    model._make_train_function()  # pylint: disable=protected-access
    return model, tf.compat.v1.get_default_graph()


def fit_keras(lms):
    model, _ = keras_bn_graph()
    rng = np.random.RandomState(0)
    x = rng.randn(8, 10, 10, 3).astype(np.float32)
    y = (np.arange(8) % 3).astype(np.int32)
    hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                     callbacks=[lms] if lms else [])
    return hist.history["loss"], model.get_weights()


def check_triggers_are_safe(index, plan, roles):
    assert plan.swaps
    maybe_dead = analysis.maybe_dead_ops(index)
    for swap in plan.swaps:
        for sin in swap.swap_ins:
            for t in sin.triggers:
                assert not index.in_v1_cond[t], index.names[t]
                assert not index.in_v1_loop[t], index.names[t]
                assert t not in roles.inactive, index.names[t]
                assert t not in maybe_dead, index.names[t]
                assert index.types[t] not in gi.CONTROL_FLOW_V1_TYPES


def test_keras_learning_phase_v1(v1_control_flow):
    _, graph = keras_bn_graph()
    index = gi.build_index(graph)
    assert "Switch" in index.types and "Merge" in index.types
    roles = analysis.classify_ops(index, is_training=True)
    # The inference branch of every batch norm is inactive in training.
    bn_inference = [i for i, t in enumerate(index.types)
                    if t == "FusedBatchNormV3"
                    and index.bn_is_training[i] is False]
    assert bn_inference and set(bn_inference) <= roles.inactive
    bn_training = [i for i, t in enumerate(index.types)
                   if t == "FusedBatchNormV3" and index.bn_is_training[i]]
    assert bn_training and not set(bn_training) & roles.inactive
    # In inference mode it is the other way round.
    roles_inf = analysis.classify_ops(index, is_training=False)
    assert set(bn_training) <= roles_inf.inactive
    lms = LMS(**FIXED)
    lms.run(graph)
    check_triggers_are_safe(index, lms.last_plan, roles)


def test_keras_learning_phase_v1_numbers(v1_control_flow):
    base = fit_keras(None)
    got = fit_keras(LMS(**FIXED))
    assert got[0] == base[0]
    for a, b in zip(base[1], got[1]):
        np.testing.assert_array_equal(a, b)


def test_keras_learning_phase_v2():
    _, graph = keras_bn_graph()
    index = gi.build_index(graph)
    assert "Switch" not in index.types
    assert {"If", "StatelessIf"} & set(index.types)
    lms = LMS(**FIXED)
    lms.run(graph)
    check_triggers_are_safe(index, lms.last_plan,
                            analysis.classify_ops(index))
    base = fit_keras(None)
    got = fit_keras(LMS(**FIXED))
    assert got[0] == base[0]


def user_cond_graph(seed=0):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 16])
        flag = tf.compat.v1.placeholder(tf.bool, [])
        w = [tf.compat.v1.get_variable(
            "w%d" % i, [16, 16],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + i))
            for i in range(4)]
        h = tf.nn.relu(tf.matmul(x, w[0]))
        h = tf.cond(flag, lambda: tf.nn.relu(tf.matmul(h, w[1])),
                    lambda: tf.tanh(tf.matmul(h, w[2])))
        h = tf.nn.relu(tf.matmul(h, w[3]))
        loss = tf.reduce_sum(h * h)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
            loss)
        init = tf.compat.v1.global_variables_initializer()
    feed = {x: np.random.RandomState(seed).randn(4, 16).astype(np.float32)}
    return g, x, flag, loss, train, init, feed


@pytest.mark.parametrize("style", ["v1", "v2"])
def test_user_cond(style, request):
    if style == "v1":
        request.getfixturevalue("v1_control_flow")

    def train(lms):
        g, _, flag, loss, train_op, init, feed = user_cond_graph()
        if lms:
            lms.run(g)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            out = []
            for step in range(4):
                feed[flag] = bool(step % 2)
                out.append(sess.run([loss, train_op], feed)[0])
        return out

    lms = LMS(**FIXED)
    assert train(lms) == train(None)
    assert lms.last_result.swapout_ops
    if style == "v1":
        # Gradients of branch ops are built outside the cond's context but
        # can still be dead: they must never trigger a swap-in.
        g = user_cond_graph()[0]
        index = gi.build_index(g)
        dead = analysis.maybe_dead_ops(index)
        assert index.id_of["gradients/cond/MatMul_1_grad/MatMul"] in dead
        check_triggers_are_safe(index, lms.last_plan,
                                analysis.classify_ops(index))


def lstm_graph(swap_memory=False):
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(3)
        x = tf.compat.v1.placeholder(tf.float32, [4, 6, 8])
        cell = tf.compat.v1.nn.rnn_cell.LSTMCell(
            16, initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        pre = tf.compat.v1.layers.dense(
            x, 8, activation=tf.nn.relu,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
        out, _ = tf.compat.v1.nn.dynamic_rnn(cell, pre, dtype=tf.float32,
                                             swap_memory=swap_memory)
        logits = tf.compat.v1.layers.dense(
            out[:, -1], 3,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=4))
        loss = tf.reduce_mean(tf.square(logits))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    feed = {x: np.random.RandomState(0).randn(4, 6, 8).astype(np.float32)}
    return g, loss, train, init, feed


def run_lstm(lms):
    g, loss, train, init, feed = lstm_graph()
    index = gi.build_index(g)
    if lms:
        lms.run(g)
    with g.as_default():
        variables = tf.compat.v1.trainable_variables()
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(init)
        losses = [sess.run([loss, train], feed)[0] for _ in range(3)]
        return index, losses, sess.run(variables)


@pytest.mark.parametrize("style", ["v1", "v2"])
def test_lstm_loops(style, request, lms_log):
    if style == "v1":
        request.getfixturevalue("v1_control_flow")
    _, base_losses, base_w = run_lstm(None)
    lms = LMS(**FIXED)
    index, losses, weights = run_lstm(lms)
    assert losses == base_losses
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    assert any("swap_memory=True" in line for line in lms_log())
    if style == "v1":
        assert {"Enter", "Exit", "NextIteration"} <= set(index.types)
    else:
        assert {"While", "StatelessWhile"} & set(index.types)
    for swap in lms.last_plan.swaps:
        assert not index.in_v1_loop[swap.producer]
        for sin in swap.swap_ins:
            for c, _ in sin.consumers:
                assert (not index.in_v1_loop[c]
                        or index.types[c] == "Enter"), index.names[c]
            for t in sin.triggers:
                assert not index.in_v1_loop[t]
