"""tflms.tf.compat: the TensorFlow and Keras stacks.

The version read, the Keras 2 module and its backend on this stack, which
models are Keras 3, tf.estimator's presence; and `compat.keras3_message`,
whose fix depends on what is installed: on TensorFlow 2.16+ without
tf-keras it says to install it; with tf-keras importable it says to use it
(TF_USE_LEGACY_KERAS=1 or `import tf_keras`) and not to install it again.
Both stacks run the message tests with a stand-in TensorFlow version and
Keras 2 module.
"""

import types

import pytest
import tensorflow as tf

from tflms.tf import compat


# What TensorFlow itself decides: run on both stacks (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


@pytest.mark.parametrize("text, version", [
    ("2.15.1", (2, 15, 1)), ("2.21.0-rc1", (2, 21, 0)),
    ("2.16.0rc0", (2, 16, 0)), ("2.17", (2, 17, 0)),
    ("2.18.0.dev20240101", (2, 18, 0))])
def test_versions_are_read_as_three_numbers(text, version):
    assert compat._parse_version(text) == version


def test_this_stacks_keras2_builds_graph_mode_models():
    assert compat.TF_VERSION == compat._parse_version(tf.__version__)
    keras = compat.keras2()
    graph = tf.Graph()
    with graph.as_default():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert not compat.is_keras3_model(model)
    # The backend that holds the model's graph-mode session is its own
    # package's (keras on 2.15, tf_keras on 2.16+).
    backend = compat.keras_backend_for(model)
    assert backend.__name__ == type(model).__module__.split(".")[0] + \
        ".src.backend"
    assert backend is compat.keras2_backend()
    assert issubclass(compat.CallbackBase, keras.callbacks.Callback)


def test_estimator_is_there_on_2_15_only():
    assert compat.has_estimator() == (compat.TF_VERSION < (2, 16, 0))
    if compat.has_estimator():
        compat.require_estimator()
    else:
        with pytest.raises(compat.UnsupportedStackError,
                           match="my_job.py needs tf.estimator, which was "
                           "removed in TensorFlow 2.16; this is TensorFlow "):
            compat.require_estimator("my_job.py")


def _message(monkeypatch, keras2):
    monkeypatch.setattr(compat, "TF_VERSION", (2, 21, 0))
    monkeypatch.setattr(compat, "keras2", lambda: keras2)
    return compat.keras3_message("The LMS Keras callback")


def test_with_tf_keras_importable_it_is_not_installed_again(monkeypatch):
    message = _message(monkeypatch,
                       types.SimpleNamespace(__version__="2.21.0"))
    assert "pip install" not in message
    assert ("To use LMS, use the tf-keras 2.21.0 that is installed: either "
            "set the environment variable TF_USE_LEGACY_KERAS=1 before "
            "Python starts (then tf.keras is Keras 2) or build the model "
            "with `import tf_keras as keras`; then call "
            "tf.compat.v1.disable_eager_execution()") in message


def test_without_tf_keras_it_says_how_to_install_it(monkeypatch):
    message = _message(monkeypatch, None)
    assert ("To use LMS, install Keras 2 with `pip install tf-keras~=2.21.0` "
            "(or `pip install 'tflms[tf]'`)") in message
