"""tflms.run_log: the lines `LMS.run` logs about the step and its plan, on
literal graphs planned with fixed parameters. (The one-line summary a
rewrite logs is checked through `LMS.run` in tests/test_lms.py.)"""

import types

import pytest

from tflms import graph_index as gi
from tflms import pipeline
from tflms import run_log
from tflms._logging import Logger
from tflms.settings import Settings
from tflms.stages.records import Tuned

FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)


def _chain(fetches=("train",)):
    """x -> a -> b -> c -> d, the backward ops reading a and b late, a
    train op at the end and an evaluation head beside it."""
    t = {"outputs": [1 << 20]}
    ops = [("x", "Placeholder", t), ("a", "Relu", t), ("b", "Relu", t),
           ("c", "Relu", t), ("d", "Relu", t), ("gb", "ReluGrad", t),
           ("ga", "ReluGrad", t), ("train", "NoOp"), ("eval", "Relu", t)]
    edges = [("x", "a"), ("a", "b"), ("b", "c"), ("c", "d"), ("d", "gb"),
             ("b", "gb"), ("gb", "ga"), ("a", "ga"), ("d", "eval")]
    return gi.from_edges(ops, edges, control_edges=[("ga", "train")],
                         fetches=list(fetches))


def test_the_step_line_says_how_the_step_was_found(lms_log):
    run_log.log_step(Logger(), _chain())
    run_log.log_step(Logger(), _chain(fetches=()))
    step, whole = lms_log()
    assert "The training step is the fan-in of " in step
    assert ": 8 of the graph's 9 operations; LMS leaves the 1 others alone" \
        in step
    assert "The training step is the whole graph" in whole
    assert "pass what the step runs: lms.run(graph, fetches=train_op)" \
        in whole


def test_parameters_are_logged_to_paste_into_the_constructor(lms_log):
    planned = pipeline.plan(_chain(), Settings(**FIXED))
    # The same plan as if the tuner had chosen its parameters (every tensor
    # past the threshold, then only one of them): the swaps stage's record
    # is what tells them apart.
    tuned = planned.with_record(Tuned(types.SimpleNamespace(
        only_tensors=None)))
    selected = planned.with_record(Tuned(types.SimpleNamespace(
        only_tensors=((1, 0),))))
    for shown in (tuned, selected, planned):
        run_log.log_parameters(Logger(), shown)
    lines = lms_log()
    pasted = ("LMS(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0, "
              "sync_mode=0)")
    assert ("to skip tuning next time, pass: " + pasted) in lines[0]
    chosen = next(l for l in lines if "chosen by the simulator" in l)
    assert "LMS will swap 1 tensors" in chosen and pasted in chosen
    assert "only auto-tuning reproduces this selection" in chosen
    assert any("LMS will use the following parameter set:" in l
               for l in lines)
    assert sum("swapout_threshold: 1" in l for l in lines) == 3


def test_plan_details_only_at_debug_level(lms_log):
    planned = pipeline.plan(_chain(), Settings(**FIXED))
    plan = planned.plan
    assert plan.swaps
    run_log.log_plan_details(Logger(), planned.index, plan)
    assert lms_log() == []
    run_log.log_plan_details(Logger(debug=True), planned.index, plan)
    lines = lms_log()
    swapped = ["%s:%d" % (planned.index.names[s.producer], s.output)
               for s in plan.swaps]
    for name in swapped:
        assert any("Swap-out: %s (level " % name in l for l in lines), name
    assert sum("Swap-in for " in l for l in lines) == sum(
        len(s.swap_ins) for s in plan.swaps)


@pytest.mark.parametrize("nbytes, text", [
    (50 << 20, "50.0 MiB"), (102 << 20, "102.0 MiB"),  # < 0.1 GiB
    (103 << 20, "0.10 GiB"), (3 << 30, "3.00 GiB")])
def test_size_text_switches_to_gib_at_a_tenth_of_one(nbytes, text):
    assert run_log.size_text(nbytes) == text
