"""tflms: Large Model Support for TensorFlow graph-mode training.

``from tflms import LMS`` is the public entry point (its `run()` returns a
`RunResult` whose `Outcome` says what it did); `EagerModeError` and
`UnsupportedStackError` (Keras 3, tf.estimator or Horovod where the installed
TensorFlow lacks them) are its errors, and `LMSError` the base of every
error tflms raises of its own. `watch_swaps(lms)` tells which swap
operations TensorFlow ran (TensorFlow 2 code), and
`BroadcastGlobalVariablesCallback` replaces Horovod's for Keras 2 with LMS;
`tflms.tf.keras_models.load_model` loads Keras models compiled in eager
mode for graph-mode training. Importing tflms does not
change any TensorFlow setting; LMS needs graph mode, which the caller
chooses (``tf.compat.v1.disable_eager_execution()`` for Keras, or building a
``tf.Graph`` explicitly).
"""

__all__ = ["LMS", "RunResult", "Outcome", "EagerModeError",
           "UnsupportedStackError", "LMSError", "watch_swaps",
           "BroadcastGlobalVariablesCallback"]
__version__ = "0.1.0"

# The module of each public name.
_PUBLIC = {
    "LMS": "tflms.lms", "RunResult": "tflms.lms", "Outcome": "tflms.lms",
    "EagerModeError": "tflms.lms", "UnsupportedStackError": "tflms.lms",
    "LMSError": "tflms.errors",
    "watch_swaps": "tflms.tf.swaps_ran",
    "BroadcastGlobalVariablesCallback": "tflms.tf.distributed",
}


def __getattr__(name):
    # The public names come from modules that import TensorFlow; they are
    # loaded on first use so that `tflms.settings` (the flags of the example
    # scripts) and `tflms --help` answer without loading TensorFlow.
    if name in _PUBLIC:
        import importlib
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError("module 'tflms' has no attribute %r" % (name,))
