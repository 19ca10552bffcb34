"""Which TensorFlow stack tflms runs on, and the Keras 2 it works with.

tflms rewrites `tf.compat.v1` graphs, so its Keras callback needs Keras 2
(the Keras that builds graphs and trains them in a Session):

* TensorFlow 2.15 and older: ``tf.keras`` is Keras 2 (the ``keras`` 2.x
  package).
* TensorFlow 2.16 and newer: ``tf.keras`` is Keras 3 unless the environment
  variable ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported;
  Keras 2 lives on as the ``tf_keras`` package (``pip install tf-keras``).
  Keras 3 has no graph mode and no session, so LMS cannot act on it.

Nothing here changes a TensorFlow setting: the user chooses Keras 2 by
installing tf-keras and either setting ``TF_USE_LEGACY_KERAS=1`` (then
``tf.keras`` is tf_keras) or writing ``import tf_keras as keras``.
"""

import importlib
import sys

import tensorflow as tf

from tflms.errors import LMSError

__all__ = ["UnsupportedStackError", "TF_VERSION", "tf_version_text",
           "has_estimator", "require_estimator", "keras2", "keras2_backend",
           "is_keras3_model", "keras_backend_for", "keras3_message",
           "keras3_model_message", "onednn_enabled", "runs_on_onednn_cpu",
           "CallbackBase"]


class UnsupportedStackError(LMSError, RuntimeError):
    """The installed TensorFlow / Keras cannot do what was asked (e.g.
    tf.estimator on TensorFlow 2.16+, or a Keras 3 model)."""


def _parse_version(text):
    parts = []
    for piece in text.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


TF_VERSION = _parse_version(tf.__version__)

_KERAS2_HOWTO = (
    "install Keras 2 with `pip install tf-keras~=%d.%d.0` (or "
    "`pip install 'tflms[tf]'`) and either set the environment variable "
    "TF_USE_LEGACY_KERAS=1 before Python starts (then tf.keras is Keras 2) "
    "or build the model with `import tf_keras as keras`")


def tf_version_text():
    """'TensorFlow 2.21.0' for messages."""
    return "TensorFlow %s" % tf.__version__


def has_estimator():
    """True if this TensorFlow has tf.estimator (removed in 2.16)."""
    if TF_VERSION >= (2, 16, 0):
        return False
    try:
        importlib.import_module("tensorflow_estimator")
    except ImportError:
        return False
    return True


def require_estimator(what="tf.estimator"):
    """Raise `UnsupportedStackError` unless tf.estimator is available.

    Args:
      what: what needs it, for the message (e.g. a script's name).
    """
    if has_estimator():
        return
    if TF_VERSION >= (2, 16, 0):
        raise UnsupportedStackError(
            "%s needs tf.estimator, which was removed in TensorFlow 2.16; "
            "this is %s. Run it on TensorFlow 2.15 (`pip install "
            "'tflms[tf215]'`), or port the model_fn to a Session: build the "
            "graph, call LMS().run(graph), then train with "
            "tf.compat.v1.Session or "
            "tf.compat.v1.train.MonitoredTrainingSession(hooks=[lms])."
            % (what, tf_version_text()))
    raise UnsupportedStackError(
        "%s needs tf.estimator, which is not installed with %s: "
        "`pip install tensorflow-estimator==%d.%d.*`."
        % (what, tf_version_text(), TF_VERSION[0], TF_VERSION[1]))


def keras2():
    """The Keras 2 module LMS works with, or None if there is none.

    TensorFlow <= 2.15: ``tf.keras``. TensorFlow >= 2.16: ``tf_keras`` if it
    is installed (it is also what ``tf.keras`` is with
    ``TF_USE_LEGACY_KERAS=1``).
    """
    if TF_VERSION < (2, 16, 0):
        return tf.keras
    if "tf_keras" in sys.modules:
        return sys.modules["tf_keras"]
    try:
        return importlib.import_module("tf_keras")
    except ImportError:
        return None


def _backend_of(root):
    return importlib.import_module(root + ".src.backend")


def keras2_backend():
    """Keras 2's backend module (``keras.src.backend`` on 2.15,
    ``tf_keras.src.backend`` on 2.16+), which holds the graph-mode session.

    Raises:
      UnsupportedStackError: no Keras 2 is installed.
    """
    if TF_VERSION < (2, 16, 0):
        return _backend_of("keras")
    if keras2() is None:
        raise UnsupportedStackError(keras3_message("The Keras callback"))
    return _backend_of("tf_keras")


def _model_root(model):
    return type(model).__module__.split(".")[0]


def is_keras3_model(model):
    """True if `model` is a Keras 3 model (no graph mode: the callback
    serves it through tflms.tf.adapters.keras3), a subclass defined elsewhere
    (a custom ``train_step``) too."""
    if not any(cls.__module__.split(".")[0] == "keras"
               for cls in type(model).__mro__):
        return False
    keras = sys.modules.get("keras")
    version = getattr(keras, "__version__", "2")
    return _parse_version(version) >= (3, 0, 0)


def keras_backend_for(model):
    """The backend module of the Keras 2 package `model` belongs to
    (``keras.src.backend`` or ``tf_keras.src.backend``); falls back to
    `keras2_backend()` for objects that are not Keras models."""
    root = _model_root(model)
    if root in ("keras", "tf_keras") and not is_keras3_model(model):
        return _backend_of(root)
    return keras2_backend()


_KERAS2_INSTALLED_HOWTO = (
    "use the tf-keras %s that is installed: either set the environment "
    "variable TF_USE_LEGACY_KERAS=1 before Python starts (then tf.keras is "
    "Keras 2) or build the model with `import tf_keras as keras`")


def _keras2_howto():
    """How to get Keras 2: use tf_keras when it is importable, else install
    it."""
    installed = keras2() if TF_VERSION >= (2, 16, 0) else None
    if installed is not None:
        return _KERAS2_INSTALLED_HOWTO % getattr(installed, "__version__", "")
    return _KERAS2_HOWTO % (TF_VERSION[0], TF_VERSION[1])


def keras3_message(what):
    """Why Keras 3 cannot be used, and what to do instead (installing
    tf-keras only when it is not importable)."""
    return (
        "%s needs Keras 2 (graph mode and a Session), but with %s tf.keras "
        "is Keras 3, which runs eagerly or in tf.function and has no graph "
        "for LMS to rewrite. To use LMS, %s; then call "
        "tf.compat.v1.disable_eager_execution() before building the model. "
        "Without Keras, build the graph yourself and call "
        "LMS().run(graph) before creating the tf.compat.v1.Session."
        % (what, tf_version_text(), _keras2_howto()))


def keras3_model_message(model, what="This callback"):
    """Why a graph-mode-only callback (Horovod's broadcast in
    tflms.tf.distributed) cannot serve a Keras 3 model. The LMS callback
    itself serves Keras 3 models (tflms.tf.adapters.keras3)."""
    keras = sys.modules.get("keras")
    return ("%s was given a Keras %s model (%s). " % (
        what, getattr(keras, "__version__", "3"), type(model).__name__)
        + keras3_message(what))


class _NoKeras2Callback:
    """Stand-in base when no Keras 2 is installed (TensorFlow 2.16+ without
    tf-keras): LMS still imports and works with Sessions and tf.function
    steps, and as a Keras 3 callback (see `LMS.on_train_begin`), which
    calls every hook of this class."""

    def __init__(self):
        self.params = None
        self.model = None
        self.validation_data = None

    def set_params(self, params):
        self.params = params

    def set_model(self, model):
        self.model = model


def _no_op(self, *args, **kwargs):
    """A callback hook that does nothing (as Keras' own do)."""


for _hook in ("on_batch_begin", "on_batch_end", "on_epoch_begin",
              "on_epoch_end", "on_train_batch_begin", "on_train_batch_end",
              "on_test_batch_begin", "on_test_batch_end",
              "on_predict_batch_begin", "on_predict_batch_end",
              "on_train_begin", "on_train_end", "on_test_begin",
              "on_test_end", "on_predict_begin", "on_predict_end"):
    setattr(_NoKeras2Callback, _hook, _no_op)
del _hook


def _callback_base():
    module = keras2()
    if module is None:
        return _NoKeras2Callback
    return module.callbacks.Callback


CallbackBase = _callback_base()


def onednn_enabled():
    """True if this process runs oneDNN kernels and graph passes
    (TF_ENABLE_ONEDNN_OPTS, or the CPU's default)."""
    from tensorflow.python.util import _pywrap_util_port
    return bool(_pywrap_util_port.IsMklEnabled())


def runs_on_onednn_cpu():
    """True if a step built here runs on oneDNN's CPU kernels: oneDNN on
    (`onednn_enabled`) and no GPU to place the step on (a Session graph
    and a tf.function alike: `graph_step.step_target`)."""
    return onednn_enabled() and not tf.config.list_physical_devices("GPU")
