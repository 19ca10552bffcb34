"""The floor (`tflms.floor`): device memory no plan goes below, in closed
form on a literal graph, and never beaten by the tuner on the zoo's
models; and the tuner's answers hold as the budget grows (a plan found at
one budget is found at every larger one, and the smallest plan a failed
search names is found when it is the budget)."""

import pytest

from tflms.tf import reader
from tflms import analysis
from tflms import autotune
from tflms import budget as budget_mod
from tflms import floor
from tflms import graph_index as gi
from tflms import pipeline
from tflms import run_log
from tflms._logging import Logger
from tflms import simulator
from tflms.settings import Settings

from tests._graphs import zoo_model

EXACT = {budget_mod.MEM_RATIO_ENV: "1"}


def _literal():
    """A variable w (5000 B) and a constant k (7 B), resident; x (100 B);
    three products m1, m2, m3 (1000 B each) of x, m1, m2 with w; an
    IdentityN passing all three on (it reads 3000 B, more than any op, and
    allocates nothing); last = m1' x m2' through it (reads 2000 B, makes
    10 B); s = AddN(m1, m2), which may write into either (reads 2000 B,
    makes nothing of its own); r = Relu(m3), in place likewise (1000 B);
    h = a CPU op (50 B) read by the device op back (20 B), which reads m3
    (1000 B) too.

    The floor is 5007 + 2000 + 10 = 7017 bytes, set by `last`."""
    return gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("w", "VariableV2", {"outputs": [((25, 50), 4)],
                              "variable_bytes": 5000, "stateful": True}),
         ("k", "Const", {"outputs": [7]}),
         ("read", "Identity", {"outputs": [((25, 50), 4)]}),
         ("m1", "MatMul", {"outputs": [1000]}),
         ("m2", "MatMul", {"outputs": [1000]}),
         ("m3", "MatMul", {"outputs": [1000]}),
         ("pass", "IdentityN", {"outputs": [1000, 1000, 1000]}),
         ("last", "MatMul", {"outputs": [10]}),
         ("s", "AddN", {"outputs": [1000]}),
         ("r", "Relu", {"outputs": [1000]}),
         ("h", "Relu", {"outputs": [50], "device": "/cpu:0"}),
         ("back", "MatMul", {"outputs": [20]})],
        edges=[("w", "read"), ("x", "m1"), ("read", "m1"), ("m1", "m2"),
               ("read", "m2"), ("m2", "m3"), ("read", "m3"),
               ("m1", "pass"), ("m2", "pass"), ("m3", "pass"),
               ("pass:0", "last"), ("pass:1", "last"), ("k", "last"),
               ("m1", "s"), ("m2", "s"), ("m3", "r"), ("x", "h"),
               ("h", "back"), ("m3", "back")])


def _model(index, batch_size=None):
    return simulator.SimulationModel(index, analysis.classify_ops(index),
                                     batch_size)


def test_floor_in_closed_form_on_a_literal_graph():
    index = _literal()
    model = _model(index)
    found = floor.step_floor(model)
    assert found == floor.StepFloor(
        floor_bytes=7017, resident_bytes=5007, op_name="last",
        op_type="MatMul", input_bytes=2000, output_bytes=10)
    assert "last (MatMul) needs its inputs" in found.describe()
    # Without a plan the step peaks at or above its floor.
    assert model.replay(None).peak_device_bytes >= found.floor_bytes


def test_forwarding_ops_never_set_the_floor():
    index = _literal()
    ids = {name: k for k, name in enumerate(index.names)}
    assert floor.forwards_only(index, ids["pass"])
    assert floor.forwards_only(index, ids["read"])
    assert not floor.forwards_only(index, ids["s"])
    # Without `last`, the largest op is m2 or m3 (1000 in, 1000 out), not
    # the IdentityN reading 3000 bytes.
    trimmed = gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("m1", "MatMul", {"outputs": [1000]}),
         ("m2", "MatMul", {"outputs": [1000]}),
         ("m3", "MatMul", {"outputs": [1000]}),
         ("pass", "IdentityN", {"outputs": [1000, 1000, 1000]})],
        edges=[("x", "m1"), ("m1", "m2"), ("m2", "m3"), ("m1", "pass"),
               ("m2", "pass"), ("m3", "pass")])
    found = floor.step_floor(_model(trimmed))
    assert (found.op_name, found.floor_bytes) == ("m2", 2000)


def test_the_log_never_names_a_forwarding_op_the_largest(lms_log):
    index = _literal()
    roles = analysis.classify_ops(index)
    run_log.log_graph_facts(Logger(), index, roles, Settings())
    line = next(m for m in lms_log() if "The largest operation is" in m)
    # `read` (the variable's 5000 bytes in and out) and `pass` (an
    # IdentityN, 3000 bytes in and out) hand buffers on and allocate
    # nothing; m2 reads m1 and the variable and makes 1000 bytes.
    assert "The largest operation is m2 " in line, line


def test_a_host_input_counts_as_its_device_copy():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [100]}),
         ("h", "Relu", {"outputs": [5000], "device": "/cpu:0"}),
         ("d", "MatMul", {"outputs": [30]})],
        edges=[("x", "h"), ("h", "d")])
    found = floor.step_floor(_model(index))
    assert (found.op_name, found.input_bytes, found.output_bytes) == (
        "d", 5000, 30)


def test_the_floor_sizes_the_batch():
    index = gi.from_edges(
        [("x", "Placeholder", {"outputs": [((None, 10), 4)]}),
         ("y", "MatMul", {"outputs": [((None, 20), 4)]})],
        edges=[("x", "y")])
    for batch in (1, 8):
        found = floor.step_floor(_model(index, batch))
        assert found.floor_bytes == batch * (40 + 80)


def _budgets(without, lowest):
    """Budgets from the floor to the peak without LMS."""
    span = without - lowest
    return [lowest + int(span * f) for f in (0, 0.2, 0.4, 0.6, 0.8, 0.95)]


def _plan(index, budget, **settings):
    return pipeline.plan(index, Settings(
        autotune_gpu_mem=budget / float(1 << 30), **settings), env=EXACT)


@pytest.mark.parametrize("name,sizes", [
    ("cnn_bn", dict(image=32, channels=8, depth=4, batch=8)),
    ("keras_resnet", dict(image=32, batch=4)),
    ("unet3d", dict(volume=16, base_filters=4, depth=3)),
])
def test_no_plan_goes_below_the_floor_and_answers_hold(name, sizes):
    model = zoo_model(name, **sizes)
    index = reader.build_index(model.graph)
    roles = pipeline.classify(index, Settings())
    sim = simulator.SimulationModel(index, roles, None)
    lowest = floor.step_floor(sim)
    without = sim.replay(None).peak_device_bytes
    assert lowest.op_name and lowest.floor_bytes < without
    # Below the floor nothing fits, and the error says why.
    with pytest.raises(autotune.AutotuneError,
                       match="That is over the budget, so no LMS setting"):
        _plan(index, lowest.floor_bytes - 1)
    found_at = []
    for budget in _budgets(without, lowest.floor_bytes):
        try:
            planned = _plan(index, budget)
        except autotune.AutotuneError as err:
            assert err.smallest_peak_bytes >= lowest.floor_bytes, (
                budget, err.smallest_peak_bytes)
            assert "No plan can go below" in str(err)
            assert ("That is over the budget" in str(err)) == (
                lowest.floor_bytes > budget)
            # The smallest plan it names, given as the budget, is found.
            again = _plan(index, err.smallest_peak_bytes)
            assert again.plan is not None
            assert (again.with_lms.peak_device_bytes
                    >= lowest.floor_bytes)
            found_at.append(False)
            continue
        found_at.append(True)
        if planned.plan is not None:
            assert planned.with_lms.peak_device_bytes >= lowest.floor_bytes
            assert planned.with_lms.peak_device_bytes <= budget
    # A plan found at one budget is found at every larger one.
    assert found_at == sorted(found_at), found_at
    assert found_at[-1]
