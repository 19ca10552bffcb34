"""`LMSError`: the base class of every error tflms raises of its own.

``except tflms.LMSError`` catches them all. Each error also keeps the
built-in base it always had (`ValueError` for a bad graph or setting,
`RuntimeError` for a stack or mode LMS cannot work in), so code that
catches those still does. Standard library only.
"""

__all__ = ["LMSError"]


class LMSError(Exception):
    """An error tflms raises of its own; the message names what was wrong
    and what to do instead."""
