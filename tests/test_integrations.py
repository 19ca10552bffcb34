"""LMS through each entry point: Session (see test_rewrite), Estimator hook,
MonitoredTrainingSession hook, Keras fit / fit_generator / load_model (via
tf.keras, and via `import tf_keras` on TensorFlow 2.16+), the eager-mode
error and the Keras 3 error."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tflms import LMS

import _graphs
from _stack import NEW_STACK, needs_estimator

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


@needs_estimator
def test_estimator_hook(tmp_path):
    base = _train_estimator(tmp_path / "plain", [])
    trace = TraceHook()
    lms = LMS(**FIXED)
    got = _train_estimator(tmp_path / "lms", [lms, trace])
    assert lms.last_run.swapout_ops
    assert set(lms.last_run.swapin_ops) <= trace.executed
    assert base.keys() == got.keys()
    for name in base:
        np.testing.assert_array_equal(base[name], got[name])


def _train_monitored(hooks):
    graph, h = _graphs.dense_net(depth=4, batch=16)
    with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        losses = []
        with tf.compat.v1.train.MonitoredTrainingSession(
                hooks=hooks, save_checkpoint_secs=None,
                save_summaries_steps=None, log_step_count_steps=None) as sess:
            for _ in range(3):
                losses.append(sess.run([h["train"], h["loss"]],
                                       h["feed"])[1])
    return losses


def test_monitored_training_session_hook():
    """The hook without tf.estimator (on every TensorFlow stack)."""
    base = _train_monitored([])
    trace = TraceHook()
    lms = LMS(**FIXED)
    got = _train_monitored([lms, trace])
    assert lms.last_run.swapout_ops
    assert set(lms.last_run.swapin_ops) <= trace.executed
    assert got == base


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
    assert lms.last_run.swapout_ops
    assert_swaps_ran(tf.compat.v1.get_default_graph(), lms.last_run, md)
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
    assert_swaps_ran(tf.compat.v1.get_default_graph(), lms.last_run, md)
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


# ---- TensorFlow 2.16+: tf_keras, Keras 3 ------------------------------
new_stack_only = pytest.mark.skipif(
    not NEW_STACK, reason="Keras 3 and the tf-keras package are the "
    "TensorFlow 2.16+ stack; this is TensorFlow %s" % tf.__version__)

TF_KERAS_SCRIPT = textwrap.dedent("""
    import numpy as np, tensorflow as tf
    import tf_keras as keras
    from tflms import LMS
    tf.compat.v1.disable_eager_execution()
    def fit(lms):
        keras.backend.clear_session()
        keras.utils.set_random_seed(3)
        m = keras.Sequential([
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
        m.compile(keras.optimizers.legacy.SGD(0.1), "mse")
        rng = np.random.RandomState(0)
        h = m.fit(rng.rand(8, 12, 12, 3), rng.rand(8, 3), batch_size=4,
                  epochs=2, shuffle=False, verbose=0,
                  callbacks=[lms] if lms else [])
        return h.history["loss"]
    base = fit(None)
    lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    got = fit(lms)
    print("TF.KERAS IS KERAS 3:", tf.keras.__version__.startswith("3"))
    print("SWAPPED:", len(lms.last_run.swapout_ops))
    print("SAME LOSS:", got == base, got)
""")


def _env_without_legacy_keras():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


@new_stack_only
def test_callback_with_import_tf_keras_and_keras3_tf_keras():
    """`import tf_keras as keras` models, while tf.keras is Keras 3."""
    out = subprocess.run([sys.executable, "-c", TF_KERAS_SCRIPT],
                         env=_env_without_legacy_keras(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TF.KERAS IS KERAS 3: True" in out.stdout
    swapped = int(out.stdout.split("SWAPPED:")[1].split()[0])
    assert swapped > 0, out.stdout
    assert "SAME LOSS: True" in out.stdout, out.stdout


KERAS3_SCRIPT = textwrap.dedent("""
    import sys
    if sys.argv[1] == "no-tf-keras":
        sys.modules["tf_keras"] = None   # as if tf-keras were not installed
    import numpy as np, tensorflow as tf
    import tflms
    from tflms import LMS, EagerModeError
    print("BASE:", LMS.__mro__[1].__module__)
    if sys.argv[2] == "graph":
        tf.compat.v1.disable_eager_execution()
    m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    m.compile("sgd", "mse")
    lms = LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
    try:
        m.fit(np.zeros((4, 3)), np.zeros((4, 2)), verbose=0, callbacks=[lms])
        print("FIT:", lms.last_run.outcome.value)
    except EagerModeError as e:
        print("FIT:", e)
""")


@new_stack_only
@pytest.mark.parametrize("tf_keras", ["tf-keras", "no-tf-keras"])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_keras3_model_trains_or_gets_a_clear_error(tf_keras, mode):
    """tf.keras is Keras 3: the callback serves it in eager mode (with or
    without tf-keras installed: the callback's base class is then LMS's
    own, with every hook Keras 3 calls); with eager execution off it says
    what to do (tests/test_keras3_fit.py has the training checks)."""
    out = subprocess.run([sys.executable, "-c", KERAS3_SCRIPT, tf_keras,
                          mode], env=_env_without_legacy_keras(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    base = out.stdout.split("BASE:")[1].split()[0]
    assert base == ("tf_keras.src.callbacks" if tf_keras == "tf-keras"
                    else "tflms.tf.compat"), base
    if mode == "eager":
        assert "FIT: rewritten" in out.stdout, out.stdout + out.stderr[-3000:]
    else:
        assert ("FIT: LMS was given a Keras 3 model while eager execution "
                "is off (tf.compat.v1.disable_eager_execution()). Keras 3 "
                "trains with tf.function in eager mode") in out.stdout, \
            out.stdout


# ---- models saved with TF2 optimizers (_graphs.save_tf2_keras_model) ---


@pytest.mark.parametrize("fmt", ["h5", "keras"])
def test_callback_trains_model_saved_with_tf2_optimizer(fmt, tmp_path):
    """keras_models.load_model recompiles with the legacy optimizer; LMS
    then trains it as a callback, with the same losses as without LMS."""
    from tflms.tf import keras_models
    from tflms.tf import compat
    path, saved_kernel = _graphs.save_tf2_keras_model(
        "sgd", tmp_path / ("model." + fmt))
    rng = np.random.RandomState(0)
    x, y = rng.rand(8, 12, 12, 3), rng.rand(8, 3)

    def fit(lms):
        tf.keras.backend.clear_session()
        model = keras_models.load_model(path)
        # The saved weights, not fresh ones (a .keras archive loaded into a
        # graph only adds assign ops; load_model runs them).
        kernel = compat.keras_backend_for(model).get_session().run(
            model.weights[0])
        np.testing.assert_array_equal(kernel.ravel(),
                                      saved_kernel.astype(np.float32))
        config = model.optimizer.get_config()
        hist = model.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                         verbose=0, callbacks=[lms] if lms else [])
        return model, config, hist.history

    model, config, base = fit(None)
    assert hasattr(model.optimizer, "get_updates"), type(model.optimizer)
    assert type(model.optimizer).__name__ == "SGD"
    assert config["momentum"] == pytest.approx(0.9)
    assert config["nesterov"] is True
    assert config["learning_rate"] == pytest.approx(0.05)
    assert "mae" in base  # the saved metrics came along
    lms = LMS(**FIXED)
    _, _, got = fit(lms)
    assert lms.last_run.swapout_ops
    assert got == base


def test_tf2_optimizer_without_legacy_twin_is_a_clear_error(tmp_path):
    from tflms import UnsupportedStackError
    from tflms.tf import keras_models
    path, _ = _graphs.save_tf2_keras_model("adamw", tmp_path / "model.h5")
    with pytest.raises(UnsupportedStackError) as info:
        keras_models.load_model(path)
    package = "keras" if not NEW_STACK else "tf_keras"
    assert str(info.value) == (
        "the model was saved with the optimizer AdamW, which cannot build a "
        "graph-mode training step and has no graph-mode equivalent in "
        "%s.optimizers.legacy; compile the model with a graph-mode optimizer "
        "from %s.optimizers.legacy before fit()" % (package, package))


# Trains with and without LMS: run with oneDNN off and on (tools/run_tests.sh).
pytestmark = pytest.mark.numerics
