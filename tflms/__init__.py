"""tflms: Large Model Support for TensorFlow graph-mode training.

``from tflms import LMS`` is the public entry point (its `run()` returns a
`RunResult` whose `Outcome` says what it did); `EagerModeError` and
`UnsupportedStackError` (Keras 3, tf.estimator or Horovod where the installed
TensorFlow lacks them) are its errors, and `tflms.keras_models.load_model`
loads Keras models compiled in eager mode for graph-mode training. Importing tflms does not
change any TensorFlow setting; LMS needs graph mode, which the caller
chooses (``tf.compat.v1.disable_eager_execution()`` for Keras, or building a
``tf.Graph`` explicitly).
"""

__all__ = ["LMS", "RunResult", "Outcome", "EagerModeError",
           "UnsupportedStackError"]
__version__ = "0.1.0"


def __getattr__(name):
    # The public names come from tflms.lms, which imports TensorFlow; they
    # are loaded on first use so that `tflms.settings` (the flags of the
    # example scripts) answers --help without loading TensorFlow.
    if name in __all__:
        from tflms import lms  # pylint: disable=import-outside-toplevel
        return getattr(lms, name)
    raise AttributeError("module 'tflms' has no attribute %r" % (name,))
