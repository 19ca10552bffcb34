"""LMS through each entry point: Session (see test_rewrite), Estimator hook,
Keras fit / fit_generator / load_model, and the eager-mode error."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS

# The Estimator model, its input and the trace hook of the tf.distribute and
# Horovod jobs.
from _graphs import assert_swaps_ran, trace_options
from dist_jobs._common import TraceHook, make_input_fn, model_fn

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


# ---- Estimator --------------------------------------------------------
def _train_estimator(model_dir, hooks):
    est = tf.compat.v1.estimator.Estimator(
        model_fn, model_dir=str(model_dir),
        config=tf.compat.v1.estimator.RunConfig(tf_random_seed=1))
    est.train(make_input_fn(0), steps=3, hooks=hooks)
    return {n: est.get_variable_value(n) for n in est.get_variable_names()}


def test_estimator_hook(tmp_path):
    base = _train_estimator(tmp_path / "plain", [])
    trace = TraceHook()
    lms = LMS(**FIXED)
    got = _train_estimator(tmp_path / "lms", [lms, trace])
    assert lms.last_result.swapout_ops
    assert set(lms.last_result.swapin_ops) <= trace.executed
    assert base.keys() == got.keys()
    for name in base:
        np.testing.assert_array_equal(base[name], got[name])


# ---- Keras ------------------------------------------------------------
def _keras_model(run_metadata=None):
    tf.keras.backend.clear_session()
    inp = tf.keras.Input((12, 12, 3))
    h = inp
    for i in range(3):
        h = tf.keras.layers.Conv2D(
            8, 3, padding="same",
            kernel_initializer=tf.keras.initializers.GlorotUniform(seed=i))(h)
        h = tf.keras.layers.BatchNormalization()(h)
        h = tf.keras.layers.Activation("relu")(h)
    h = tf.keras.layers.GlobalAveragePooling2D()(h)
    out = tf.keras.layers.Dense(
        4, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=9))(h)
    model = tf.keras.Model(inp, out)
    kwargs = {}
    if run_metadata is not None:
        kwargs = dict(options=trace_options(), run_metadata=run_metadata)
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), **kwargs)
    return model


def _data():
    rng = np.random.RandomState(0)
    return (rng.randn(8, 12, 12, 3).astype(np.float32),
            (np.arange(8) % 4).astype(np.int32))


def _fit(lms, use_generator):
    md = tf.compat.v1.RunMetadata()
    model = _keras_model(md)
    x, y = _data()
    callbacks = [lms] if lms else []
    if use_generator:
        def gen():
            while True:
                for i in (0, 4):
                    yield x[i:i + 4], y[i:i + 4]
        hist = model.fit_generator(gen(), steps_per_epoch=2, epochs=2,
                                   verbose=0, callbacks=callbacks)
    else:
        hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                         verbose=0, callbacks=callbacks)
    return hist.history["loss"], model.get_weights(), md


@pytest.mark.parametrize("use_generator", [False, True])
def test_keras_fit(use_generator):
    base_loss, base_w, _ = _fit(None, use_generator)
    lms = LMS(**FIXED)
    loss, weights, md = _fit(lms, use_generator)
    assert lms.last_result.swapout_ops
    assert_swaps_ran(tf.compat.v1.get_default_graph(), lms.last_result, md)
    assert loss == base_loss
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)
    if not use_generator:
        assert lms.batch_size == 4  # taken from fit's parameters


def test_keras_load_model_then_fit(tmp_path):
    x, y = _data()
    model = _keras_model()
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "model.h5")
    model.save(path)

    def resume(lms):
        tf.keras.backend.clear_session()
        md = tf.compat.v1.RunMetadata()
        loaded = tf.keras.models.load_model(path)
        loaded.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), options=trace_options(), run_metadata=md)
        hist = loaded.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                          verbose=0, callbacks=[lms] if lms else [])
        return hist.history["loss"], loaded.get_weights(), md

    base_loss, base_w, _ = resume(None)
    lms = LMS(**FIXED)
    loss, weights, md = resume(lms)
    assert_swaps_ran(tf.compat.v1.get_default_graph(), lms.last_result, md)
    assert loss == base_loss
    for a, b in zip(base_w, weights):
        np.testing.assert_array_equal(a, b)


# ---- eager mode -------------------------------------------------------
EAGER_SCRIPT = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    from tflms import LMS, EagerModeError
    try:
        LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0).run()
    except EagerModeError as e:
        print("RUN:", e)
    m = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(3,))])
    m.compile("sgd", "mse")
    try:
        m.fit(np.zeros((4, 3)), np.zeros((4, 2)), verbose=0,
              callbacks=[LMS(swapout_threshold=1, swapin_ahead=1,
                             swapin_groupby=0)])
    except EagerModeError as e:
        print("FIT:", e)
    print("EAGER STILL ON:", tf.executing_eagerly())
""")


def test_eager_mode_errors_say_what_to_call():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", EAGER_SCRIPT], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    advice = "Call tf.compat.v1.disable_eager_execution() at the start"
    assert "RUN: LMS rewrites TensorFlow graphs and cannot work in eager " \
        "mode. " + advice in out.stdout
    assert "FIT: LMS rewrites" in out.stdout and advice in out.stdout
    # Importing tflms changed nothing global.
    assert "EAGER STILL ON: True" in out.stdout


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
