"""Checkpoints, MetaGraphs and SavedModels of LMS graphs: nothing is lost.

* A checkpoint written by the rewritten graph restores into the plain
  graph and the other way round, variable for variable.
* A MetaGraph or SavedModel exported after the rewrite keeps its swap ops
  (with the attributes that protect them from Grappler); loaded into a
  fresh graph it trains to the same numbers, its swap ops run, and LMS on
  it is a no-op.
* A Keras model trained with the LMS callback, saved and loaded again,
  continues training with swaps and the numbers of a model that never
  used LMS.
"""

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS
from tflms.lms import Outcome
from tflms.tf import rewriter

from _graphs import assert_swaps_ran, dense_net, trace_options

_v1 = tf.compat.v1
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def build(lms=False):
    """An MLP with momentum, a Saver and collections naming its handles."""
    graph, h = dense_net(depth=4, width=16, batch=8, optimizer="momentum")
    with graph.as_default():
        _v1.add_to_collection("lms_test_train", h["train"])
        _v1.add_to_collection("lms_test_loss", h["loss"])
        h["saver"] = _v1.train.Saver()
        h["variables"] = _v1.global_variables()
    h["result"] = LMS(**FIXED).run(graph) if lms else None
    return graph, h


def swap_op_names(graph):
    """(swap-out names, swap-in names) of the ops LMS added."""
    outs, ins = [], []
    for op in graph.get_operations():
        if op.type == "Identity" and "_tflms" in op.node_def.attr:
            last = op.name.split("/")[-1]
            (outs if last.startswith("swapout") else ins).append(op.name)
    return outs, ins


def steps(sess, loss, train, feed, n=2, run_metadata=None):
    opts = trace_options() if run_metadata is not None else None
    return [sess.run([loss, train], feed, options=opts,
                     run_metadata=run_metadata)[0] for _ in range(n)]


def values(sess, variables):
    return {v.op.name: w for v, w in zip(variables, sess.run(variables))}


def assert_same_values(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def feed_for(graph, h):
    """The dense_net feed, keyed by this graph's placeholders."""
    return {graph.get_tensor_by_name(k.name): v for k, v in h["feed"].items()}


# ---- checkpoints -----------------------------------------------------------
@pytest.mark.parametrize("writer", ["lms", "plain"])
def test_checkpoint_restores_across_the_rewrite(writer, tmp_path):
    """Train 2 steps in one graph and save; restore into the other graph
    (rewritten or not): identical variables, then 2 identical steps."""
    w_graph, w = build(lms=writer == "lms")
    r_graph, r = build(lms=writer == "plain")
    path = str(tmp_path / "ckpt")
    with _v1.Session(graph=w_graph) as sess:
        sess.run(w["init"])
        steps(sess, w["loss"], w["train"], w["feed"])
        saved = values(sess, w["variables"])
        w["saver"].save(sess, path)
        after_w = steps(sess, w["loss"], w["train"], w["feed"])
        final_w = values(sess, w["variables"])
    md = _v1.RunMetadata()
    with _v1.Session(graph=r_graph) as sess:
        r["saver"].restore(sess, path)
        assert_same_values(values(sess, r["variables"]), saved)
        after_r = steps(sess, r["loss"], r["train"], r["feed"],
                        run_metadata=md)
        final_r = values(sess, r["variables"])
    assert after_r == after_w
    assert_same_values(final_r, final_w)
    lms_graph, lms_h = (w_graph, w) if writer == "lms" else (r_graph, r)
    assert lms_h["result"].swapout_ops
    if writer == "plain":
        assert_swaps_ran(lms_graph, lms_h["result"], md)


# ---- MetaGraph -------------------------------------------------------------
def reference_run(tmp_path):
    """Plain graph: initial checkpoint, then 2 steps from it."""
    graph, h = build()
    path = str(tmp_path / "init_ckpt")
    with _v1.Session(graph=graph) as sess:
        sess.run(h["init"])
        h["saver"].save(sess, path)
        losses = steps(sess, h["loss"], h["train"], h["feed"])
        final = values(sess, h["variables"])
    return path, h, losses, final


def check_loaded_graph(graph, original_result):
    """Swap ops kept, with their attributes; LMS leaves the graph alone."""
    outs, ins = swap_op_names(graph)
    assert sorted(outs) == sorted(original_result.swapout_ops)
    assert sorted(ins) == sorted(original_result.swapin_ops)
    for name in outs + ins:
        op = graph.get_operation_by_name(name)
        assert op.get_attr("_grappler_do_not_remove") is True
        assert op.get_attr(rewriter.SWAP_MARKER_ATTR) is True
        assert op.device.lower().endswith("cpu:0")
    before = graph.as_graph_def().SerializeToString(deterministic=True)
    assert LMS(**FIXED).run(graph).outcome is Outcome.ALREADY_REWRITTEN
    assert LMS(swapout_threshold=3, swapin_ahead=2,
               swapin_groupby=1).run(graph).outcome is \
        Outcome.ALREADY_REWRITTEN
    assert graph.as_graph_def().SerializeToString(
        deterministic=True) == before
    return rewriter.RewriteResult(tuple(outs), tuple(ins), 0, 0)


def test_meta_graph_keeps_swaps_and_trains_the_same(tmp_path):
    init_path, plain_h, ref_losses, ref_final = reference_run(tmp_path)
    graph, h = build(lms=True)
    meta = str(tmp_path / "lms.meta")
    with graph.as_default():
        _v1.train.export_meta_graph(meta)

    loaded = tf.Graph()
    with loaded.as_default():
        saver = _v1.train.import_meta_graph(meta)
        variables = _v1.global_variables()
    result = check_loaded_graph(loaded, h["result"])
    loss = loaded.get_collection("lms_test_loss")[0]
    train = loaded.get_collection("lms_test_train")[0]
    md = _v1.RunMetadata()
    with _v1.Session(graph=loaded) as sess:
        saver.restore(sess, init_path)
        losses = steps(sess, loss, train, feed_for(loaded, plain_h),
                       run_metadata=md)
        final = values(sess, variables)
    assert losses == ref_losses
    assert_same_values(final, ref_final)
    assert_swaps_ran(loaded, result, md)


def test_meta_graph_under_an_import_scope_is_recognised(tmp_path):
    graph, _ = build(lms=True)
    meta = str(tmp_path / "lms.meta")
    with graph.as_default():
        _v1.train.export_meta_graph(meta)
    loaded = tf.Graph()
    with loaded.as_default():
        _v1.train.import_meta_graph(meta, import_scope="replica")
    assert any(op.name.startswith("replica/lms/swapout")
               for op in loaded.get_operations())
    before = loaded.as_graph_def().SerializeToString(deterministic=True)
    assert LMS(**FIXED).run(loaded).outcome is Outcome.ALREADY_REWRITTEN
    assert loaded.as_graph_def().SerializeToString(
        deterministic=True) == before


# ---- SavedModel ------------------------------------------------------------
def test_saved_model_keeps_swaps_and_trains_the_same(tmp_path):
    init_path, plain_h, ref_losses, ref_final = reference_run(tmp_path)
    graph, h = build(lms=True)
    export = str(tmp_path / "saved_model")
    with _v1.Session(graph=graph) as sess:
        h["saver"].restore(sess, init_path)
        builder = _v1.saved_model.Builder(export)
        builder.add_meta_graph_and_variables(sess, ["train"])
        builder.save()

    loaded = tf.Graph()
    md = _v1.RunMetadata()
    with _v1.Session(graph=loaded) as sess:
        # The loader restores the variables in this session: LMS must be a
        # no-op here (a graph already run cannot be edited usefully anyway).
        _v1.saved_model.loader.load(sess, ["train"], export)
        result = check_loaded_graph(loaded, h["result"])
        with loaded.as_default():
            variables = _v1.global_variables()
        loss = loaded.get_tensor_by_name(h["loss"].name)
        train = loaded.get_operation_by_name(h["train"].name)
        assert_same_values(values(sess, variables),
                           _initial_values(init_path, variables))
        losses = steps(sess, loss, train, feed_for(loaded, plain_h),
                       run_metadata=md)
        final = values(sess, variables)
    assert losses == ref_losses
    assert_same_values(final, ref_final)
    assert_swaps_ran(loaded, result, md)


def _initial_values(path, variables):
    reader = tf.train.load_checkpoint(path)
    return {v.op.name: reader.get_tensor(v.op.name) for v in variables}


# ---- Keras -----------------------------------------------------------------
def keras_model(run_metadata=None):
    tf.keras.backend.clear_session()
    glorot = tf.keras.initializers.GlorotUniform
    inp = tf.keras.Input((10, 10, 3))
    h = inp
    for i in range(3):
        h = tf.keras.layers.Conv2D(6, 3, padding="same", activation="relu",
                                   kernel_initializer=glorot(seed=i))(h)
    h = tf.keras.layers.Flatten()(h)
    out = tf.keras.layers.Dense(3, kernel_initializer=glorot(seed=9))(h)
    model = tf.keras.Model(inp, out)
    compile_model(model, run_metadata)
    return model


def compile_model(model, run_metadata=None):
    kwargs = {}
    if run_metadata is not None:
        kwargs = dict(options=trace_options(), run_metadata=run_metadata)
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), **kwargs)


def keras_data():
    rng = np.random.RandomState(0)
    return (rng.randn(8, 10, 10, 3).astype(np.float32),
            (np.arange(8) % 3).astype(np.int32))


@pytest.mark.parametrize("fmt", ["h5", "tf"])
def test_keras_save_load_continues_with_swaps(fmt, tmp_path):
    x, y = keras_data()

    def session(use_lms):
        tag = "lms" if use_lms else "plain"
        first = LMS(**FIXED) if use_lms else None
        model = keras_model()
        h1 = model.fit(x, y, batch_size=4, epochs=1, shuffle=False,
                       verbose=0, callbacks=[first] if first else [])
        if first:
            assert first.last_run.swapout_ops
        path = str(tmp_path / (tag + (".h5" if fmt == "h5" else "_tf")))
        model.save(path, save_format=fmt)

        tf.keras.backend.clear_session()
        md = _v1.RunMetadata()
        loaded = tf.keras.models.load_model(path, compile=False)
        compile_model(loaded, md)
        second = LMS(**FIXED) if use_lms else None
        h2 = loaded.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                        verbose=0, callbacks=[second] if second else [])
        return (h1.history["loss"] + h2.history["loss"],
                loaded.get_weights(), second, md)

    base_loss, base_w, _, _ = session(False)
    loss, weights, lms, md = session(True)
    assert loss == base_loss
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    assert lms.last_run.swapout_ops
    assert_swaps_ran(tf.compat.v1.get_default_graph(), lms.last_run, md)


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
