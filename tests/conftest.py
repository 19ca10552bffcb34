"""Test-process setup.

The tests build graphs explicitly or use Keras in graph mode, so the test
process (not the library) turns eager execution off once. Tests that need
eager mode or v1 control flow run in a subprocess or toggle control flow
with a fixture that restores it.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()


@pytest.fixture
def v1_control_flow():
    """Build graphs with v1 control flow (Switch/Merge/Enter/Exit)."""
    from tensorflow.python.ops import control_flow_util  # pylint: disable=import-outside-toplevel
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


@pytest.fixture
def lms_log(caplog):
    """Captured [LMS] log lines, as a list of strings."""
    import logging  # pylint: disable=import-outside-toplevel
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logger = logging.getLogger("tensorflow")
    logger.propagate = True
    caplog.set_level(logging.INFO, logger="tensorflow")

    def lines():
        return [r.getMessage() for r in caplog.records
                if "[LMS]" in r.getMessage()]
    return lines
