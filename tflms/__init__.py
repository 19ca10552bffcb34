"""tflms: Large Model Support for TensorFlow graph-mode training.

``from tflms import LMS`` is the public entry point. Importing tflms does not
change any TensorFlow setting; LMS needs graph mode, which the caller
chooses (``tf.compat.v1.disable_eager_execution()`` for Keras, or building a
``tf.Graph`` explicitly).
"""

from tflms.lms import LMS, EagerModeError, UnsupportedStackError

__all__ = ["LMS", "EagerModeError", "UnsupportedStackError"]
__version__ = "0.1.0"
