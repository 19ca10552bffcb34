"""benchmarks/tflmsv2.py: the capacity worker without a checkout of the
original TFLMSv2, and the harness's refusals."""

import os

import pytest

from _benchmarks import tiny_capacity_case
from benchmarks import capacity
from benchmarks import tflmsv2

# The harness's refusals and a capacity search on a tf.compat.v1 graph:
# the same on both stacks, so run once (tools/run_tests.sh).
pytestmark = pytest.mark.one_stack


def test_capacity_says_tflmsv2_was_not_measured_without_its_path(tmp_path):
    """Without ``--tflmsv2`` or ``$TFLMSV2_PATH`` the capacity worker does
    not probe the original TFLMSv2 and says so in its result and in the
    table; the other methods search as before. The harness itself refuses
    to run without a checkout, or with a folder that holds none."""
    from benchmarks import common
    case = dict(tiny_capacity_case(), methods=["none", "tflmsv2"])
    r = common.run_case("capacity", case, case["timeout_s"] * 4,
                        env={"TFLMSV2_PATH": ""})
    assert "error" not in r and r["done"], r.get("error")
    assert r["results"]["tflmsv2"]["not_measured"] == \
        "not measured: TFLMSV2_PATH not set"
    assert r["results"]["tflmsv2"]["largest"] is None
    assert {p["method"] for p in r["probes"]} == {"none"}
    assert r["results"]["none"]["largest"] > 0
    # The first table's row (the step table's comes later).
    row = [line for line in capacity.tables([r]).splitlines()
           if line.startswith("| %s |" % case["label"])][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[6] == "not measured: TFLMSV2_PATH not set"
    assert cells[12] == "-"  # what stopped TFLMSv2
    # Results from before TFLMSv2 was a method: n/a, as for any method
    # a search did not run.
    older = dict(r, results={"none": r["results"]["none"]})
    assert "| n/a |" in capacity.tables([older])

    assert tflmsv2.path_from(None) == os.environ.get("TFLMSV2_PATH") or None
    assert tflmsv2.path_from("/x") == "/x"
    with pytest.raises(ValueError, match="no tensorflow_large_model_support"
                       "/lms.py under"):
        tflmsv2.load(str(tmp_path))
    saved = os.environ.pop("TFLMSV2_PATH", None)
    try:
        with pytest.raises(ValueError, match="not measured: TFLMSV2_PATH "
                           "not set; give --tflmsv2 PATH"):
            tflmsv2.apply(None, 16)
    finally:
        if saved is not None:
            os.environ["TFLMSV2_PATH"] = saved
    with pytest.raises(ValueError, match="method must be one of"):
        capacity.measure_probe("tflmsv3", None, 16)
    from benchmarks import run
    assert run._parse(["--tflmsv2", "/x"]).tflmsv2 == "/x"
