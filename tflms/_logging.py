"""The ``[LMS][level]`` log lines, through `tf.compat.v1.logging`."""

import tensorflow as tf

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
            tf.compat.v1.logging.info("%s[LMS][%d] %s%s", rank_prefix(), level,
                                      " " * indent, message)

    def warning(self, message):
        tf.compat.v1.logging.warning("%s[LMS][0] %s", rank_prefix(), message)
