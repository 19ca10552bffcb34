"""`Lazy`: the stand-in for a module the command line imports only once a
command runs."""

import importlib


class Lazy:
    """A module imported on its first attribute access.

    TensorFlow takes seconds to import; ``tflms --help`` and argument errors
    must not wait for it, so this module imports only the standard library
    and the TensorFlow-free `tflms.settings` up front, and everything that
    loads TensorFlow through these stand-ins once a command runs."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)
