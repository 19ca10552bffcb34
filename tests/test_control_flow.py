"""Conditionals and loops, in both control-flow styles: v1 (Switch/Merge,
Enter/Exit) and v2 (If/While ops).

Keras learning-phase conds, a user tf.cond, batch norm in training, frozen
(inference-mode batch norm in a training graph) and switched by a
placeholder; LSTM/GRU through dynamic_rnn and Keras RNN layers. Each trains
to the same numbers with LMS as without, the swap ops whose consumers run
are executed, LMS swaps around loops and never inside them, and it logs the
swap_memory=True hint. v1 control flow comes from the `v1_control_flow`
fixture (control flow only, restored afterwards), and the full
disable_v2_behavior() runs in a subprocess.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS
from tflms import analysis
from tflms import graph_index as gi
from tflms.tf import rewriter
from tflms.tf import reader

from _graphs import assert_swaps_ran, trace_options

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def keras_bn_graph(**compile_kwargs):
    """A Keras CNN with batch norm; its learning-phase conds are v1 or v2
    depending on the control-flow setting when it is built.
    `compile_kwargs` go to `Model.compile` (e.g. run options)."""
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
        from_logits=True), **compile_kwargs)
    model._make_train_function()
    return model, tf.compat.v1.get_default_graph()


def fit_keras(lms):
    model, _ = keras_bn_graph()
    rng = np.random.RandomState(0)
    x = rng.randn(8, 10, 10, 3).astype(np.float32)
    y = (np.arange(8) % 3).astype(np.int32)
    hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                     callbacks=[lms] if lms else [])
    return hist.history["loss"], model.get_weights()


def assert_live_swaps_ran(graph, result, run_metadata):
    """`assert_swaps_ran` for the swaps whose consumers ran.

    Keras' RNN code calls the cell once outside the loop only to learn its
    output shapes; nothing reads those ops, so the session prunes them, and
    with them the swap ops LMS added for their tensors. Every swap-in some
    executed op reads must have run; at least one must exist.
    """
    executed = {n.node_name for d in run_metadata.step_stats.dev_stats
                for n in d.node_stats}
    live_in, live_out = [], []
    for name in result.swapin_ops:
        op = graph.get_operation_by_name(name)
        if any(c.name in executed for c in op.outputs[0].consumers()):
            live_in.append(name)
            live_out.append(op.inputs[0].op.name)
    assert live_in, "no swap-in feeds an executed op"
    live = dataclasses.replace(
        result, swapin_ops=tuple(live_in),
        swapout_ops=tuple(n for n in result.swapout_ops if n in live_out))
    assert_swaps_ran(graph, live, run_metadata)


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
    index = reader.build_index(graph)
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
    check_triggers_are_safe(index, lms.last_run.plan, roles)


def test_keras_learning_phase_v1_numbers(v1_control_flow):
    base = fit_keras(None)
    got = fit_keras(LMS(**FIXED))
    assert got[0] == base[0]
    for a, b in zip(base[1], got[1]):
        np.testing.assert_array_equal(a, b)


def test_keras_learning_phase_v1_switch_swaps_and_deferred_zeros(
        v1_control_flow):
    """In v1 control flow the backward batch norm reads the forward
    activation through its cond's Switch, and the gradient zeros of the
    untaken (inference) branch are made from forward shapes alone: the plan
    swaps the Switch outputs and delays those fills until just before the
    backward pass needs them. A traced fit step shows both happened, and
    training matches the run without LMS
    (`test_keras_learning_phase_v1_numbers` and the losses here)."""

    def fit(lms):
        md = tf.compat.v1.RunMetadata()
        model, graph = keras_bn_graph(options=trace_options(),
                                      run_metadata=md)
        rng = np.random.RandomState(0)
        x = rng.randn(4, 10, 10, 3).astype(np.float32)
        y = (np.arange(4) % 3).astype(np.int32)
        hist = model.fit(x, y, batch_size=4, epochs=1, shuffle=False,
                         verbose=0, callbacks=[lms] if lms else [])
        return hist.history["loss"], model.get_weights(), graph, md

    base_loss, base_weights, _, _ = fit(None)
    lms = LMS(**FIXED)
    loss, weights, graph, md = fit(lms)
    assert loss == base_loss
    for a, b in zip(base_weights, weights):
        np.testing.assert_array_equal(a, b)

    plan, result = lms.last_run.plan, lms.last_run.rewrite
    # The plan's ids are those of the training step's index.
    index = lms.last_run.planned.index
    ops = index.ops
    executed = {n.node_name: n for d in md.step_stats.dev_stats
                for n in d.node_stats}
    # One Switch per batch norm feeds its training branch and the backward
    # FusedBatchNormGradV3; each is swapped and the swap ops ran.
    switch_swaps = [s for s in plan.swaps if ops[s.producer].type == "Switch"]
    assert len(switch_swaps) == 3
    names = {name(ops[s.producer].outputs[s.output].name)
             for s in switch_swaps
             for name in (lambda t: rewriter.swap_op_name("swapout", t),
                          rewriter.swapin_op_name)}
    assert names <= set(executed), sorted(names - set(executed))
    assert_live_swaps_ran(graph, result, md)
    # The three untaken-branch gradient zeros wait for an op of the backward
    # pass, and ran after it.
    assert len(plan.deferral_edges) == 3
    maybe_dead = analysis.maybe_dead_ops(index)
    for trigger, fill in plan.deferral_edges:
        assert ops[fill].type == "Fill"
        assert ops[trigger] in ops[fill].control_inputs
        assert trigger not in maybe_dead and not index.in_v1_cond[trigger]
        t, f = executed[ops[trigger].name], executed[ops[fill].name]
        assert f.all_start_micros >= t.all_start_micros + t.op_end_rel_micros
        # Made in the backward pass: after the loss's own gradient ops
        # started, i.e. long after the forward pass.
        first_reader = min(index.levels[c] for c in index.successors(fill))
        assert index.levels[trigger] <= first_reader - 2


def _real_peak_resnet50_v1(defer):
    """Keras ResNet50 (128x128, batch 2, learning phase fed 1) in v1 control
    flow: the simulator's peak and the real CPU allocator peak of a traced
    step, with the plan's deferral edges applied or not (no swaps, which on a
    CPU-only machine would not move memory anyway)."""
    import test_fidelity
    from benchmarks import models as bench_models
    from tflms import planner, simulator
    from tflms.tf import rewriter as rw
    built = bench_models.resnet50(128, batch=2, learning_phase="placeholder")
    graph = built.graph
    index = reader.build_index(graph)
    roles = analysis.classify_ops(index)
    deferral = planner.deferral_edges(index, roles)
    plan = planner.make_plan(index, roles, planner.SwapParams(10**6, 1, 0, 0),
                             batch_size=2, deferral=deferral)
    assert not plan.swaps and len(deferral) == 53
    sim = simulator.SimulationModel(index, roles, batch_size=2)
    predicted = sim.replay(plan if defer else None).peak_device_bytes
    if defer:
        rw.apply_plan(graph, index, plan, "/cpu:0")
    phase = [op.outputs[0] for op in graph.get_operations()
             if op.type == "PlaceholderWithDefault"
             and "learning_phase" in op.name]
    feed = built.make_feed()
    feed[phase[0]] = True
    md = tf.compat.v1.RunMetadata()
    # One inter-op thread: the executor then runs ready ops in one order, so
    # the allocator's peak does not depend on how threads happen to race
    # (with two, TensorFlow 2.21 once started the deferred Fills early
    # enough to halve the measured saving).
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(built.init_op)
        loss = sess.run([built.loss, built.train_op], feed)[0]
        sess.run(built.train_op, feed, options=trace_options(),
                 run_metadata=md)
        variables = sess.run(graph.get_collection("variables"))
    real = sum(v.nbytes for v in variables) + \
        test_fidelity.highest_running_sum(test_fidelity.step_allocations(md))
    return predicted, real, loss


def test_deferred_zeros_lower_the_real_peak(v1_control_flow):
    """The deferral edges move real memory: on this machine's CPU allocator
    the traced step peaks lower by about what the simulator predicts, and
    the step computes the same loss."""
    sim_before, real_before, loss_before = _real_peak_resnet50_v1(False)
    sim_after, real_after, loss_after = _real_peak_resnet50_v1(True)
    predicted = sim_before - sim_after
    measured = real_before - real_after
    assert predicted > 10 << 20, predicted
    assert measured > 0.5 * predicted, (predicted, measured)
    assert loss_after == loss_before


def test_keras_learning_phase_v2():
    _, graph = keras_bn_graph()
    index = reader.build_index(graph)
    assert "Switch" not in index.types
    assert {"If", "StatelessIf"} & set(index.types)
    lms = LMS(**FIXED)
    lms.run(graph)
    check_triggers_are_safe(index, lms.last_run.plan,
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
    assert lms.last_run.swapout_ops
    if style == "v1":
        # Gradients of branch ops are built outside the cond's context but
        # can still be dead: they must never trigger a swap-in.
        g = user_cond_graph()[0]
        index = reader.build_index(g)
        dead = analysis.maybe_dead_ops(index)
        assert index.id_of["gradients/cond/MatMul_1_grad/MatMul"] in dead
        check_triggers_are_safe(index, lms.last_run.plan,
                                analysis.classify_ops(index))


def lstm_graph(swap_memory=False, cell_type="lstm"):
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(3)
        x = tf.compat.v1.placeholder(tf.float32, [4, 6, 8])
        if cell_type == "lstm":
            cell = tf.compat.v1.nn.rnn_cell.LSTMCell(
                16,
                initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        else:
            cell = tf.compat.v1.nn.rnn_cell.GRUCell(
                16, kernel_initializer=(
                    tf.compat.v1.glorot_uniform_initializer(seed=1)))
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


def run_lstm(lms, cell_type="lstm"):
    g, loss, train, init, feed = lstm_graph(cell_type=cell_type)
    index = reader.build_index(g)
    if lms:
        lms.run(g)
    with g.as_default():
        variables = tf.compat.v1.trainable_variables()
    md = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=g) as sess:
        sess.run(init)
        losses = [sess.run([loss, train], feed, options=trace_options(),
                           run_metadata=md)[0] for _ in range(3)]
        return index, losses, sess.run(variables), (g, md)


@pytest.mark.parametrize("cell_type", ["lstm", "gru"])
@pytest.mark.parametrize("style", ["v1", "v2"])
def test_lstm_loops(style, cell_type, request, lms_log):
    if style == "v1":
        request.getfixturevalue("v1_control_flow")
    _, base_losses, base_w, _ = run_lstm(None, cell_type)
    lms = LMS(**FIXED)
    index, losses, weights, (graph, md) = run_lstm(lms, cell_type)
    assert losses == base_losses
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    assert_live_swaps_ran(graph, lms.last_run.rewrite, md)
    assert any("swap_memory=True" in line for line in lms_log())
    if style == "v1":
        assert {"Enter", "Exit", "NextIteration"} <= set(index.types)
        # Around the loops: some tensor that feeds the forward loop is read
        # after the gradient loop, through a swap-in whose trigger also
        # comes after it (the trigger reads a loop's Exit).
        def after_a_loop(op):
            return any(index.types[a] == "Exit"
                       for a in analysis.ancestors_within(index, op, 0))

        def feeds_a_loop(op):
            stack, seen = [op], {op}
            while stack:
                for c in index.successors(stack.pop()):
                    if index.types[c] == "Enter":
                        return True
                    if c not in seen:
                        seen.add(c)
                        stack.append(c)
            return False
        assert any(feeds_a_loop(swap.producer)
                   and after_a_loop(sin.first_consumer)
                   and all(after_a_loop(t) for t in sin.triggers)
                   for swap in lms.last_run.plan.swaps
                   for sin in swap.swap_ins)
    else:
        assert {"While", "StatelessWhile"} & set(index.types)
    for swap in lms.last_run.plan.swaps:
        assert not index.in_v1_loop[swap.producer]
        for sin in swap.swap_ins:
            for c, _ in sin.consumers:
                assert (not index.in_v1_loop[c]
                        or index.types[c] == "Enter"), index.names[c]
            for t in sin.triggers:
                assert not index.in_v1_loop[t]


# ---- Keras RNN layers ---------------------------------------------------
def fit_keras_rnn(lms, layer):
    """Dense layers around a Keras LSTM or GRU layer, two epochs of fit."""
    tf.keras.backend.clear_session()
    glorot = tf.keras.initializers.GlorotUniform
    inp = tf.keras.Input((6, 8))
    h = tf.keras.layers.Dense(8, activation="relu",
                              kernel_initializer=glorot(seed=1))(inp)
    h = tf.keras.layers.Dense(8, activation="relu",
                              kernel_initializer=glorot(seed=2))(h)
    rnn = {"lstm": tf.keras.layers.LSTM, "gru": tf.keras.layers.GRU}[layer]
    h = rnn(12, kernel_initializer=glorot(seed=3),
            recurrent_initializer=tf.keras.initializers.Orthogonal(seed=4))(h)
    h = tf.keras.layers.Dense(12, activation="relu",
                              kernel_initializer=glorot(seed=5))(h)
    out = tf.keras.layers.Dense(3, kernel_initializer=glorot(seed=6))(h)
    model = tf.keras.Model(inp, out)
    md = tf.compat.v1.RunMetadata()
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), options=trace_options(), run_metadata=md)
    rng = np.random.RandomState(0)
    x = rng.randn(8, 6, 8).astype(np.float32)
    y = (np.arange(8) % 3).astype(np.int32)
    hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                     callbacks=[lms] if lms else [])
    return hist.history["loss"], model.get_weights(), md


def assert_v1_swaps_outside_loops(graph, result):
    """Around the loop, never inside: swapped tensors come from outside any
    v1 loop, inside one only an Enter reads a swap-in, and no op inside a
    loop or a conditional starts one."""
    kind = reader._control_flow_kind
    for name in result.swapin_ops:
        swapin = graph.get_operation_by_name(name)
        source = swapin.inputs[0].op.inputs[0].op
        assert kind(source) != "while", source.name
        for consumer in swapin.outputs[0].consumers():
            assert (kind(consumer) != "while"
                    or consumer.type == "Enter"), consumer.name
        for trigger in swapin.control_inputs:
            assert kind(trigger) is None, trigger.name


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_keras_rnn_layers(layer, lms_log):
    """v2 control flow (While ops) here; v1 in
    `test_under_disable_v2_behavior`: Keras RNN layers need all of
    disable_v2_behavior() for v1 loops (with only control flow v2 off their
    TensorArray writes fail, LMS or not)."""
    base_loss, base_w, _ = fit_keras_rnn(None, layer)
    lms = LMS(**FIXED)
    loss, weights, md = fit_keras_rnn(lms, layer)
    assert loss == base_loss
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    graph = tf.compat.v1.get_default_graph()
    assert_live_swaps_ran(graph, lms.last_run.rewrite, md)
    assert any("swap_memory=True" in line for line in lms_log())
    loops = [op for op in graph.get_operations()
             if op.type in ("While", "StatelessWhile")]
    assert loops
    # The loop runs as one op: LMS may swap its inputs and outputs, and
    # never swaps a loop's variant (TensorList) tensors.
    for name in lms.last_run.swapout_ops:
        tensor = graph.get_operation_by_name(name).inputs[0]
        assert tensor.dtype != tf.variant and tensor.dtype != tf.resource


# ---- batch norm ----------------------------------------------------------
def keras_frozen_bn_model():
    """A Keras CNN fine-tuned with frozen batch norm: the layers run in
    inference mode (FusedBatchNormV3 with is_training=False) in every
    training step, outside any conditional."""
    tf.keras.backend.clear_session()
    inp = tf.keras.Input((10, 10, 3))
    h = inp
    for i in range(3):
        h = tf.keras.layers.Conv2D(
            6, 3, padding="same",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=i))(h)
        bn = tf.keras.layers.BatchNormalization()
        bn.trainable = False
        h = bn(h)
        h = tf.keras.layers.Activation("relu")(h)
    h = tf.keras.layers.Flatten()(h)
    out = tf.keras.layers.Dense(
        3, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=5))(h)
    model = tf.keras.Model(inp, out)
    md = tf.compat.v1.RunMetadata()
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), options=trace_options(), run_metadata=md)
    return model, md


def test_frozen_batch_norm_in_training_is_active():
    model, _ = keras_frozen_bn_model()
    model._make_train_function()
    index = reader.build_index(tf.compat.v1.get_default_graph())
    frozen = [i for i, flag in enumerate(index.bn_is_training)
              if flag is False]
    assert len(frozen) == 6  # three batch norms and their gradients
    roles = analysis.classify_ops(index, is_training=True)
    # They always run: nothing downstream of them is inactive, and the
    # activations after them can be swapped and start swap-ins.
    assert not roles.inactive
    relus = [i for i, t in enumerate(index.types) if t == "Relu"]
    assert relus and set(relus) <= roles.sources & roles.triggers


def test_frozen_batch_norm_numbers():
    def fit(lms):
        model, md = keras_frozen_bn_model()
        rng = np.random.RandomState(0)
        x = rng.randn(8, 10, 10, 3).astype(np.float32)
        y = (np.arange(8) % 3).astype(np.int32)
        hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                         verbose=0, callbacks=[lms] if lms else [])
        return hist.history["loss"], model.get_weights(), md
    base_loss, base_w, _ = fit(None)
    lms = LMS(**FIXED)
    loss, weights, md = fit(lms)
    assert loss == base_loss
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    graph = tf.compat.v1.get_default_graph()
    assert_swaps_ran(graph, lms.last_run, md)
    # The frozen batch-norm gradients read the conv outputs late in the
    # step: those reads go through swap-ins too.
    readers = {c.type for name in lms.last_run.swapin_ops
               for c in graph.get_operation_by_name(name)
               .outputs[0].consumers()}
    assert "FusedBatchNormGradV3" in readers


def bn_flag_graph():
    """Conv + tf.compat.v1.layers.batch_normalization(training=flag): both
    modes in one graph, chosen per step by a placeholder."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 8, 8, 3])
        flag = tf.compat.v1.placeholder(tf.bool, [])
        h = x
        for i in range(3):
            h = tf.compat.v1.layers.conv2d(
                h, 4, 3, padding="same", kernel_initializer=(
                    tf.compat.v1.glorot_uniform_initializer(seed=i)))
            h = tf.compat.v1.layers.batch_normalization(h, training=flag)
            h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.square(h))
        updates = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(updates):
            train = tf.compat.v1.train.GradientDescentOptimizer(
                0.1).minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
        variables = tf.compat.v1.global_variables()
    feed = {x: np.random.RandomState(1).randn(2, 8, 8, 3).astype(np.float32)}
    return g, flag, loss, train, init, variables, feed


@pytest.mark.parametrize("style", ["v1", "v2"])
def test_batch_norm_training_flag(style, request):
    if style == "v1":
        request.getfixturevalue("v1_control_flow")

    def run(lms):
        g, flag, loss, train_op, init, variables, feed = bn_flag_graph()
        result = lms.run(g) if lms else None
        md = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            losses = []
            for mode in (True, False, True, True):
                feed[flag] = mode
                losses.append(sess.run([loss, train_op], feed,
                                       options=trace_options(),
                                       run_metadata=md)[0])
            return losses, sess.run(variables), g, result, md

    base = run(None)
    lms = LMS(**FIXED)
    losses, weights, g, result, md = run(lms)
    assert losses == base[0]
    for a, b in zip(base[1], weights):
        np.testing.assert_array_equal(a, b)
    assert result.swapout_ops
    assert_swaps_ran(g, result, md)
    index = reader.build_index(bn_flag_graph()[0])
    check_triggers_are_safe(index, lms.last_run.plan,
                            analysis.classify_ops(index))


# ---- full v1 behaviour, in its own process -------------------------------
V1_SCRIPT = textwrap.dedent("""
    import logging, sys
    import numpy as np, tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    sys.path.insert(0, %(tests)r)
    import test_control_flow as t
    from tflms import LMS
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("tensorflow").addHandler(handler)
    FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)

    _, base_l, base_w, _ = t.run_lstm(None, "gru")
    lms = LMS(**FIXED)
    index, l, w, (g, md) = t.run_lstm(lms, "gru")
    assert "Enter" in index.types and "While" not in index.types
    assert l == base_l and all((a == b).all() for a, b in zip(base_w, w))
    t.assert_live_swaps_ran(g, lms.last_run.rewrite, md)
    t.assert_v1_swaps_outside_loops(g, lms.last_run)
    print("DYNAMIC_RNN OK", len(lms.last_run.swapout_ops))

    for layer in ("lstm", "gru"):
        base_l, base_w, _ = t.fit_keras_rnn(None, layer)
        lms = LMS(**FIXED)
        l, w, md = t.fit_keras_rnn(lms, layer)
        assert l == base_l and all((a == b).all() for a, b in zip(base_w, w))
        graph = tf.compat.v1.get_default_graph()
        types = {op.type for op in graph.get_operations()}
        assert "Enter" in types and "While" not in types
        t.assert_live_swaps_ran(graph, lms.last_run.rewrite, md)
        t.assert_v1_swaps_outside_loops(graph, lms.last_run)
        print("KERAS_" + layer.upper() + " OK",
              len(lms.last_run.swapout_ops))

    base = t.fit_keras(None)
    lms = LMS(**FIXED)
    got = t.fit_keras(lms)
    assert got[0] == base[0]
    assert all((a == b).all() for a, b in zip(base[1], got[1]))
    assert "Switch" in {o.type for o in
                        tf.compat.v1.get_default_graph().get_operations()}
    print("KERAS_BN OK", len(lms.last_run.swapout_ops))
    print("HINT", any("swap_memory=True" in r for r in records))
""")


def test_under_disable_v2_behavior():
    """`disable_v2_behavior()` switches far more than control flow (ref
    variables, v1 shapes...) and cannot be undone, so it runs in a
    subprocess: dynamic_rnn GRU, Keras LSTM and Keras batch norm."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.path.dirname(tests))
    out = subprocess.run(
        [sys.executable, "-c", V1_SCRIPT % dict(tests=tests)], env=env,
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("DYNAMIC_RNN OK", "KERAS_LSTM OK", "KERAS_GRU OK",
                 "KERAS_BN OK", "HINT True"):
        assert line in out.stdout, out.stdout
    counts = [int(l.split()[-1]) for l in out.stdout.splitlines()
              if " OK " in l]
    assert len(counts) == 4 and min(counts) > 0, out.stdout


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
