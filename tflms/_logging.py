"""The ``[LMS][level]`` log lines, through TensorFlow's logger.

TensorFlow's logger (``tf.get_logger()``, what `tf.compat.v1.logging`
writes to) is the Python logger ``"tensorflow"`` with TensorFlow's handler.
This module does not import TensorFlow, so the planning core can log without
it: when TensorFlow is loaded, its logger is used as it configures it; when
it is not (the core on literal graphs), the plain ``"tensorflow"`` logger.
"""

import logging
import sys

from tflms import ranks

__all__ = ["Logger", "rank_prefix"]


def rank_prefix():
    """``'[rank 3] '`` under Horovod/MPI, ``'[worker 1] '`` for a
    tf.distribute task described by ``TF_CONFIG``, else ''.

    From `ranks.rank_info`, which reads the environment that launchers
    set; a malformed variable gives no prefix here (logging must not fail),
    and the error where the value is used.
    """
    try:
        info = ranks.rank_info()
    except ValueError:
        return ""
    if info.launcher in ("horovod", "mpi"):
        return "[rank %d] " % info.rank
    if info.task_type:
        return "[%s %d] " % (info.task_type, info.task_index)
    return ""


def _logger():
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "get_logger"):
        return tf.get_logger()
    return logging.getLogger("tensorflow")


class Logger:
    """Formats ``[LMS][level] message`` lines; level 0 always prints.

    Levels 1 and 2 print only with ``debug=True`` and ``debug_level`` at
    least that level.
    """

    def __init__(self, debug=False, debug_level=1):
        self.debug = debug
        self.debug_level = debug_level

    def enabled(self, level):
        return level == 0 or (self.debug and self.debug_level >= level)

    def info(self, message, level=0, indent=0):
        if self.enabled(level):
            _logger().info("%s[LMS][%d] %s%s", rank_prefix(), level,
                           " " * indent, message)

    def warning(self, message):
        _logger().warning("%s[LMS][0] %s", rank_prefix(), message)
