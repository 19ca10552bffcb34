"""Training graphs of less common shapes, each LMS vs no LMS with the same
numbers: several losses and train ops run separately, gradient
accumulation, a Saver and variable initializers in the graph (which must
stay runnable on their own), and inference-only graphs.
"""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS
from tflms.lms import Outcome

from _graphs import assert_swaps_ran, trace_options

_v1 = tf.compat.v1
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
PARAMS = {
    "fixed": FIXED,
    "serialized": dict(FIXED, serialization=["0:"]),
    "sync": dict(swapout_threshold=2, swapin_ahead=2, swapin_groupby=1,
                 sync_mode=3),
}


def _dense(h, width, name, seed, activation=tf.nn.relu):
    return _v1.layers.dense(
        h, width, activation=activation, name=name,
        kernel_initializer=_v1.glorot_uniform_initializer(seed=seed))


def _feed(placeholders, seed):
    rng = np.random.RandomState(seed)
    return {p: rng.randn(*p.shape.as_list()).astype(np.float32)
            for p in placeholders}


class Run:
    """Runs named fetches in order in one session and keeps every result,
    the final variables and the metadata of traced steps."""

    def __init__(self, graph, init, feeds):
        self.graph = graph
        self.init = init
        self.feeds = feeds
        self.metadata = _v1.RunMetadata()

    def __call__(self, schedule):
        with self.graph.as_default():
            variables = _v1.global_variables()
        out = []
        with _v1.Session(graph=self.graph) as sess:
            sess.run(self.init)
            for fetches, feed_name in schedule:
                out.append(sess.run(fetches, self.feeds[feed_name],
                                    options=trace_options(),
                                    run_metadata=self.metadata))
            weights = sess.run(variables)
        return out, weights


def _no_ops(values):
    """Session results without the None of operations."""
    if isinstance(values, (list, tuple)):
        return [_no_ops(v) for v in values if v is not None]
    return values


def assert_same(base, got):
    assert _no_ops(got[0]) == _no_ops(base[0])
    assert len(got[1]) == len(base[1])
    for a, b in zip(base[1], got[1]):
        np.testing.assert_array_equal(a, b)


# ---- several losses and train ops ------------------------------------------
def two_heads_graph():
    """A shared trunk, two heads with their own losses and optimizers (a
    trains the trunk and head a, b only head b), and a third train op that
    runs both."""
    g = tf.Graph()
    with g.as_default():
        x = _v1.placeholder(tf.float32, [6, 16], name="x")
        h = x
        for i in range(4):
            h = _dense(h, 16, "trunk%d" % i, i)
        a = _dense(_dense(h, 16, "head_a0", 10), 4, "head_a1", 11, None)
        b = _dense(_dense(_dense(h, 12, "head_b0", 20), 12, "head_b1", 21),
                   4, "head_b2", 22, None)
        loss_a = tf.reduce_mean(tf.square(a), name="loss_a")
        loss_b = tf.reduce_mean(tf.abs(b), name="loss_b")
        train_a = _v1.train.GradientDescentOptimizer(0.05).minimize(
            loss_a, name="train_a")
        # Head b trains its own variables only, so that running both train
        # ops at once is deterministic (no two updates of one variable).
        b_vars = [v for v in _v1.trainable_variables()
                  if v.op.name.startswith("head_b")]
        train_b = _v1.train.MomentumOptimizer(0.02, 0.9).minimize(
            loss_b, var_list=b_vars, name="train_b")
        train_both = tf.group(train_a, train_b, name="train_both")
        init = _v1.global_variables_initializer()
    handles = dict(loss_a=loss_a, loss_b=loss_b, train_a=train_a,
                   train_b=train_b, train_both=train_both)
    return g, init, {"x": _feed([x], 0)}, handles


@pytest.mark.parametrize("params", sorted(PARAMS))
def test_several_losses_and_train_ops(params):
    def run(lms):
        g, init, feeds, h = two_heads_graph()
        result = lms.run(g) if lms else None
        schedule = [([h["loss_a"], h["train_a"]], "x"),
                    ([h["loss_b"], h["train_b"]], "x"),
                    ([h["loss_a"], h["loss_b"]], "x"),  # evaluation only
                    ([h["loss_a"], h["loss_b"], h["train_both"]], "x"),
                    ([h["loss_b"], h["train_b"]], "x"),
                    ([h["loss_a"], h["train_a"]], "x")]
        runner = Run(g, init, feeds)
        return runner(schedule), g, result, runner.metadata

    base = run(None)[0]
    got, g, result, md = run(LMS(**PARAMS[params]))
    assert_same(base, got)
    assert result.swapout_ops
    # The last step trained head a only: its swaps ran.
    swaps_a = [n for n in result.swapin_ops if "head_b" not in n]
    assert swaps_a
    executed = {n.node_name for d in md.step_stats.dev_stats
                for n in d.node_stats}
    assert set(swaps_a) & executed


def test_evaluating_a_loss_runs_no_training_op():
    """With serialization, fetching only a loss must not update a variable
    or need more than its own inputs. (It may compute gradient values that
    serialization chained before ops of the loss: time, not numbers.)"""
    g, init, feeds, h = two_heads_graph()
    LMS(**PARAMS["serialized"]).run(g)
    with _v1.Session(graph=g) as sess:
        sess.run(init)
        with g.as_default():
            variables = _v1.global_variables()
        before = sess.run(variables)
        md = _v1.RunMetadata()
        sess.run([h["loss_a"], h["loss_b"]], feeds["x"],
                 options=trace_options(), run_metadata=md)
        for a, b in zip(before, sess.run(variables)):
            np.testing.assert_array_equal(a, b)
    executed = {n.node_name for d in md.step_stats.dev_stats
                for n in d.node_stats}
    assert executed and not [n for n in executed if "Apply" in n]


# ---- gradient accumulation -----------------------------------------------
def accumulation_graph():
    """Gradients of micro-batches summed into accumulators, applied once."""
    g = tf.Graph()
    with g.as_default():
        x = _v1.placeholder(tf.float32, [4, 12], name="x")
        h = x
        for i in range(5):
            h = _dense(h, 12, "layer%d" % i, i)
        loss = tf.reduce_mean(tf.square(_dense(h, 3, "out", 9, None)))
        params = _v1.trainable_variables()
        grads = tf.gradients(loss, params)
        accumulators = [_v1.get_variable(
            "acc%d" % i, v.shape, initializer=tf.zeros_initializer(),
            trainable=False) for i, v in enumerate(params)]
        accumulate = tf.group(*[a.assign_add(gr) for a, gr in
                                zip(accumulators, grads)], name="accumulate")
        opt = _v1.train.GradientDescentOptimizer(0.1)
        apply = opt.apply_gradients(
            [(a / 2.0, v) for a, v in zip(accumulators, params)],
            name="apply")
        with tf.control_dependencies([apply]):
            reset = tf.group(*[a.assign(tf.zeros_like(a))
                               for a in accumulators], name="reset")
        init = _v1.global_variables_initializer()
    feeds = {"a": _feed([x], 1), "b": _feed([x], 2)}
    return g, init, feeds, dict(loss=loss, accumulate=accumulate,
                                reset=reset)


@pytest.mark.parametrize("params", ["fixed", "serialized"])
def test_gradient_accumulation(params):
    def run(lms):
        g, init, feeds, h = accumulation_graph()
        # The micro-batch step, not the apply step the train_op collection
        # names (tflms.step): it is the one with activations to swap.
        result = (lms.run(g, fetches=[h["loss"], h["accumulate"]])
                  if lms else None)
        schedule = []
        for _ in range(2):
            schedule += [([h["loss"], h["accumulate"]], "a"),
                         ([h["loss"], h["accumulate"]], "b"),
                         (h["reset"], "a")]
        schedule.append(([h["loss"], h["accumulate"]], "a"))
        runner = Run(g, init, feeds)
        return runner(schedule), g, result, runner.metadata

    base = run(None)[0]
    got, g, result, md = run(LMS(**PARAMS[params]))
    assert_same(base, got)
    assert result.swapout_ops
    assert_swaps_ran(g, result, md)


# ---- Saver and initializers ---------------------------------------------
def saver_graph():
    g = tf.Graph()
    with g.as_default():
        x = _v1.placeholder(tf.float32, [4, 10], name="x")
        step = _v1.train.get_or_create_global_step()
        h = x
        for i in range(4):
            h = _dense(h, 10, "layer%d" % i, i)
        loss = tf.reduce_mean(tf.square(h))
        count = _v1.get_local_variable("seen", initializer=tf.zeros([]),
                                       use_resource=True)
        with tf.control_dependencies([count.assign_add(1.0)]):
            train = _v1.train.MomentumOptimizer(0.05, 0.9).minimize(
                loss, global_step=step)
        saver = _v1.train.Saver()
        init = tf.group(_v1.global_variables_initializer(),
                        _v1.local_variables_initializer())
    return g, init, {"x": _feed([x], 3)}, dict(loss=loss, train=train,
                                                saver=saver, step=step)


@pytest.mark.parametrize("params", sorted(PARAMS))
def test_saver_and_initializers_run_on_their_own(params, tmp_path):
    """Initializers, save and restore run without feeds after the rewrite
    (no swap op, trigger or serialization edge ties them to the training
    step), and training gives the same numbers."""
    def run(lms, tag):
        g, init, feeds, h = saver_graph()
        result = lms.run(g) if lms else None
        path = str(tmp_path / tag)
        md = _v1.RunMetadata()
        with _v1.Session(graph=g) as sess:
            sess.run(init)  # no feed: would fail if tied to x
            h["saver"].save(sess, path)
            losses = [sess.run([h["loss"], h["train"]], feeds["x"],
                               options=trace_options(),
                               run_metadata=md)[0] for _ in range(2)]
            saved_after = h["saver"].save(sess, path + "_2")
            assert sess.run(h["step"]) == 2
            sess.run(init)
            h["saver"].restore(sess, saved_after)
            losses.append(sess.run(h["loss"], feeds["x"]))
            with g.as_default():
                weights = sess.run(_v1.global_variables()
                                   + _v1.local_variables())
        return (losses, weights), g, result, md

    base = run(None, "plain")[0]
    got, g, result, md = run(LMS(**PARAMS[params]), "lms")
    assert_same(base, got)
    assert result.swapout_ops
    assert_swaps_ran(g, result, md)


# ---- inference only ------------------------------------------------------
# Softplus: an activation Grappler's remapper does not fuse with the dense
# layer's MatMul and BiasAdd. With ReLUs every op of these nets is in a
# group Grappler merges (`fusions.grappler_groups`), which LMS gives no
# control edge, so no swap-in would have a trigger and nothing is swapped.
ACTIVATION = tf.nn.softplus


def inference_graph():
    """A forward-only network with a long skip connection."""
    g = tf.Graph()
    with g.as_default():
        x = _v1.placeholder(tf.float32, [4, 16], name="x")
        first = _dense(x, 16, "first", 0, ACTIVATION)
        h = first
        for i in range(6):
            h = _dense(h, 16, "mid%d" % i, i + 1, ACTIVATION)
        out = _dense(h + first, 3, "out", 9, None)
        init = _v1.global_variables_initializer()
    return g, init, {"x": _feed([x], 4)}, out


def predict(lms):
    g, init, feeds, out = inference_graph()
    result = lms.run(g) if lms else None
    runner = Run(g, init, feeds)
    (values,), _ = runner([(out, "x")])
    return values, g, result, runner.metadata


def test_inference_graph_auto_parameters_swap_nothing():
    """is_training=False and auto-tuning: a graph that fits is left alone."""
    base = predict(None)[0]
    lms = LMS()
    lms.is_training = False
    lms.autotune_gpu_mem = 1.0
    g = inference_graph()[0]
    before = g.as_graph_def().SerializeToString(deterministic=True)
    assert lms.run(g).outcome is Outcome.NOT_NEEDED
    assert g.as_graph_def().SerializeToString(deterministic=True) == before
    got = predict(lms)[0]
    np.testing.assert_array_equal(base, got)


def test_inference_graph_swaps_when_asked():
    """Explicit parameters ask for swapping: only the skip connection is
    read far from where it is made."""
    base = predict(None)[0]
    lms = LMS(**FIXED)
    lms.is_training = False
    got, g, result, md = predict(lms)
    np.testing.assert_array_equal(base, got)
    assert result.swapout_ops == ("lms/swapout_first_Softplus_0",)
    assert_swaps_ran(g, result, md)
    lms = LMS(swapout_threshold=100, swapin_ahead=1, swapin_groupby=0)
    lms.is_training = False
    assert predict(lms)[2].swapout_ops == ()


def keras_skip_model():
    tf.keras.backend.clear_session()
    glorot = tf.keras.initializers.GlorotUniform
    inp = tf.keras.Input((8,))
    first = tf.keras.layers.Dense(8, activation="softplus",
                                  kernel_initializer=glorot(seed=0))(inp)
    h = first
    for i in range(4):
        h = tf.keras.layers.Dense(8, activation="softplus",
                                  kernel_initializer=glorot(seed=i + 1))(h)
    out = tf.keras.layers.Dense(2, kernel_initializer=glorot(seed=9))(
        tf.keras.layers.Add()([h, first]))
    return tf.keras.Model(inp, out)


@pytest.mark.parametrize("compiled", [False, True])
def test_keras_predict_with_the_callback(compiled):
    """model.predict(callbacks=[lms]) with is_training=False edits the
    prediction graph only: no train function is made (an uncompiled model
    has none to make) and predictions are unchanged."""
    x = np.random.RandomState(0).randn(4, 8).astype(np.float32)
    base = keras_skip_model().predict(x, verbose=0)
    model = keras_skip_model()
    if compiled:
        model.compile("sgd", "mse")
    lms = LMS(**FIXED)
    lms.is_training = False
    got = model.predict(x, callbacks=[lms], verbose=0)
    np.testing.assert_array_equal(base, got)
    assert lms.last_run.swapout_ops == ("lms/swapout_dense_Softplus_0",)
    graph = tf.compat.v1.get_default_graph()
    assert not [op for op in graph.get_operations()
                if "gradients" in op.name]


# ---- serialization without swaps -------------------------------------------
def test_a_serialization_only_rewrite_is_done_once():
    """Serialization adds control edges but no swap op; a marker op tells
    the next run (Keras calls LMS from set_model and set_params) that the
    graph is done."""
    def run(params):
        g, init, feeds, h = accumulation_graph()
        result = (LMS(**params).run(g, fetches=[h["loss"], h["accumulate"]])
                  if params else None)
        schedule = [([h["loss"], h["accumulate"]], "a"), (h["reset"], "a")]
        return Run(g, init, feeds)(schedule), g, result

    params = dict(swapout_threshold=10000, swapin_ahead=1, swapin_groupby=0,
                  serialization=["0:"])
    base = run(None)[0]
    got, g, result = run(params)
    assert_same(base, got)
    assert result.swapout_ops == () and result.control_edges > 0
    marker = g.get_operation_by_name("lms/serialization")
    assert marker.type == "NoOp" and not marker.inputs
    assert not marker.control_inputs and not marker.outputs
    before = g.as_graph_def().SerializeToString(deterministic=True)
    assert LMS(**params).run(g).outcome is Outcome.ALREADY_REWRITTEN
    assert LMS(**FIXED).run(g).outcome is Outcome.ALREADY_REWRITTEN
    assert g.as_graph_def().SerializeToString(deterministic=True) == before


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
