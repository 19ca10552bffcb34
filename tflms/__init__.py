"""tflms: Large Model Support for TensorFlow graph-mode training.

``from tflms import LMS`` is the public entry point; `EagerModeError` and
`UnsupportedStackError` (Keras 3, tf.estimator or Horovod where the installed
TensorFlow lacks them) are its errors, and `tflms.keras_models.load_model`
loads Keras models compiled in eager mode for graph-mode training. Importing tflms does not
change any TensorFlow setting; LMS needs graph mode, which the caller
chooses (``tf.compat.v1.disable_eager_execution()`` for Keras, or building a
``tf.Graph`` explicitly).
"""

from tflms.lms import LMS, EagerModeError, UnsupportedStackError

__all__ = ["LMS", "EagerModeError", "UnsupportedStackError"]
__version__ = "0.1.0"
