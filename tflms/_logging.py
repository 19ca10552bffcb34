"""The ``[LMS][level]`` log lines, through `tf.compat.v1.logging`."""

import json
import os

import tensorflow as tf

__all__ = ["Logger", "rank_prefix"]


def rank_prefix():
    """``'[rank 3] '`` under Horovod/MPI, ``'[worker 1] '`` for a
    tf.distribute task described by ``TF_CONFIG``, else ''.

    Read from the environment that launchers set, so no distributed package
    needs to be imported.
    """
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = os.environ.get(var)
        if value is not None:
            return "[rank %s] " % value
    config = os.environ.get("TF_CONFIG")
    if config:
        try:
            task = json.loads(config).get("task") or {}
        except (ValueError, AttributeError):
            return ""
        if task.get("type"):
            return "[%s %s] " % (task["type"], task.get("index", 0))
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
