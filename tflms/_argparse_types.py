"""argparse ``type=`` converters shared by the ``tflms`` command and the
example scripts (examples/_lms_flags.py).

Each converter raises `argparse.ArgumentTypeError` with a message that says
what the flag accepts and repeats the value given; argparse puts the flag in
front of it::

    tflms plan: error: argument --batch-size: must be an int >= 1; got '0'

This module imports nothing but the standard library.
"""

import argparse
import math

__all__ = ["positive_int", "positive_float", "nonnegative_float", "auto_int",
           "choice_int"]


def _convert(text, to_number, accepts, expected):
    """`to_number(text)` if that works and `accepts` the result, else an
    `argparse.ArgumentTypeError` saying that the value must be `expected`."""
    try:
        value = to_number(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not accepts(value):
        raise argparse.ArgumentTypeError(
            "must be %s; got %r" % (expected, text))
    return value


def positive_int(text):
    """An int >= 1 (sizes, step counts)."""
    return _convert(text, int, lambda v: v >= 1, "an int >= 1")


def positive_float(text):
    """A finite number > 0 (memory sizes in GiB)."""
    return _convert(text, float, lambda v: 0 < v < math.inf,
                    "a number > 0")


def nonnegative_float(text):
    """A finite number >= 0 (thresholds in GiB where 0 turns a feature
    off)."""
    return _convert(text, float, lambda v: 0 <= v < math.inf,
                    "a number >= 0")


def choice_int(choices):
    """A converter for one of the ints `choices` (modes and levels)."""
    expected = "one of %s" % ", ".join(str(c) for c in choices)

    def parse(text):
        return _convert(text, int, lambda v: v in choices, expected)

    parse.__name__ = "choice_int"
    return parse


def auto_int(minimum):
    """A converter for ints >= `minimum`, or -1 for "let the auto-tuner
    choose" (the LMS swap parameters)."""
    expected = "-1 (auto) or an int >= %d" % minimum

    def parse(text):
        return _convert(text, int, lambda v: v == -1 or v >= minimum,
                        expected)

    parse.__name__ = "auto_int_%d" % minimum
    return parse
