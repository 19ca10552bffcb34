"""Test-process setup.

The tests build graphs explicitly or use Keras in graph mode, so the test
process (not the library) turns eager execution off once. Tests that need
eager mode or v1 control flow run in a subprocess or toggle control flow
with a fixture that restores it.
"""

import os
import sys

# The model zoo (zoo/) and the benchmarks live next to tests/, outside the
# tflms package; make them importable however pytest was started.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN changes which kernels run and how TensorFlow rewrites graphs, and
# TensorFlow turns it on by default only on some CPUs (AVX512_VNNI,
# AVX512_BF16, AMX). A run must not depend on the CPU it lands on, so the
# mode is always explicit: off unless the caller chose
# (tools/run_tests.sh runs the suite with it off and the `numerics` tests
# again with it on). Subprocesses started by tests inherit it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
ONEDNN = os.environ["TF_ENABLE_ONEDNN_OPTS"] == "1"

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

if tf.executing_eagerly():
    tf.compat.v1.disable_eager_execution()


def pytest_report_header(config):
    return "oneDNN: TF_ENABLE_ONEDNN_OPTS=%s" % os.environ[
        "TF_ENABLE_ONEDNN_OPTS"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "numerics: compares training with and without LMS; "
        "tools/run_tests.sh runs these with oneDNN off and on")
    config.addinivalue_line(
        "markers", "one_stack: what it checks does not depend on which "
        "TensorFlow runs it (planning on graphs whose construction "
        "test_same_plans pins on both stacks, a benchmark's tables); "
        "tools/run_tests.sh runs it on TensorFlow 2.15 only")
    config.addinivalue_line(
        "markers", "both_stacks: not a numerics test, but what it checks "
        "is decided by TensorFlow's own code, which differs between the "
        "stacks (how graphs are built, what Grappler merges, what the "
        "runtime allocates, the Keras 2 each carries); tools/run_tests.sh "
        "runs it on both, the other tests on the newest only")
    config.addinivalue_line(
        "markers", "onednn_off_pass: a Keras 3 numerics case CI runs in "
        "its pass with oneDNN off (Python 3.13), not with it on; the "
        "other Keras 3 cases run with it on only")


# tools/run_tests.sh runs the newest stack's pass before the 2.15 pass
# with oneDNN on. The newest stack's pass writes the ids of the tests it
# skipped (what exists on 2.15 only: tf.estimator, Horovod) to the file
# named by TFLMS_WRITE_SKIPPED; the 2.15 pass with oneDNN on then runs only
# the tests listed in the file named by TFLMS_ONLY_TESTS.
_SKIPPED = os.environ.get("TFLMS_WRITE_SKIPPED")
_ONLY_TESTS = os.environ.get("TFLMS_ONLY_TESTS")


def _writes_skipped(config):
    # xdist's workers report to the controller, which writes: one writer.
    return bool(_SKIPPED) and not hasattr(config, "workerinput")


def pytest_sessionstart(session):
    # The file exists once the pass has started, even if it skips nothing:
    # tools/run_tests.sh tells a pass that skipped nothing from one that
    # never ran.
    global _SKIPPED
    if not _writes_skipped(session.config):
        _SKIPPED = None
    else:
        open(_SKIPPED, "a", encoding="utf-8").close()


def pytest_collection_modifyitems(config, items):
    for item in items:
        # A numerics test must run once in each oneDNN mode, so on both
        # stacks' passes (tools/run_tests.sh): never on one stack only.
        if "numerics" in item.keywords and "one_stack" in item.keywords:
            raise pytest.UsageError(
                "%s is marked both numerics and one_stack: a numerics test "
                "runs with oneDNN off on TensorFlow 2.15 and on with the "
                "newest; remove one_stack" % item.nodeid)
    if not _ONLY_TESTS:
        return
    with open(_ONLY_TESTS, encoding="utf-8") as f:
        wanted = {line.strip() for line in f if line.strip()}
    kept = [item for item in items if item.nodeid in wanted]
    config.hook.pytest_deselected(
        items=[item for item in items if item.nodeid not in wanted])
    items[:] = kept


def pytest_runtest_logreport(report):
    # xdist calls this hook in the controller for every worker's report.
    if _SKIPPED and report.skipped:
        with open(_SKIPPED, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")


@pytest.fixture
def v1_control_flow():
    """Build graphs with v1 control flow (Switch/Merge/Enter/Exit)."""
    from tensorflow.python.ops import control_flow_util
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf.compat.v1.disable_control_flow_v2()
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


@pytest.fixture
def lms_log(caplog):
    """Captured [LMS] log lines, as a list of strings."""
    import logging
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    logger = logging.getLogger("tensorflow")
    logger.propagate = True
    caplog.set_level(logging.INFO, logger="tensorflow")

    def lines():
        return [r.getMessage() for r in caplog.records
                if "[LMS]" in r.getMessage()]
    return lines


@pytest.fixture(autouse=True)
def _host_memory_of_a_gpu_server(monkeypatch):
    """Plans are made for a 64 GiB host (a DGX-1's 512 GiB per V100), not
    for the memory of the machine the tests run on: the host budget
    (`tflms.budget.host_budget`) must not make a test's plan depend on it.
    Tests of the budget itself pass `autotune_host_mem` or read
    `budget.physical_memory` directly."""
    from tflms import budget
    monkeypatch.setattr(budget, "physical_memory", lambda: 64 << 30)
