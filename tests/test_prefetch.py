"""The prefetch stage (`tflms.stages.prefetch`): swap-ins their readers wait
for, started earlier where memory allows and the step gets shorter.

On a Keras ResNet (`test_equivalence`'s ``keras_resnet`` at 64x64) tuned for
half its peak on an H100 over PCIe 3.0, the tuner's swap-ins start two
levels ahead of their readers, which wait for them; the stage starts two
of the seven earlier (a predicted step of 818 us instead of 848 us). What the
stage changed is checked against the plan of the same stages without it, and
the rewritten step is trained beside the step without LMS (same losses and
weights, every swap op run, each moved swap-in waiting on its new trigger).
"""

import dataclasses

import pytest

from tflms.tf import reader as tf_reader
from tflms import LMS
from tflms import pipeline
from tflms import stages
from tflms.settings import Settings
from tflms.stages import prefetch
from tflms.stages import records

import test_equivalence as eq
from _graphs import assert_same_training

SIZE = dict(image=64, batch=2, blocks=(1, 1))
# Swap-only plans (the recompute cases below ask for recomputes
# themselves): the swap-ins moved are counted on the tuner's swaps.
SETTINGS = Settings(gpu="H100-SXM5-80GB", interconnect="pcie3",
                    recompute=False)


def _model():
    return eq.zoo_model("keras_resnet", **SIZE)


def _settings(index, share=0.5):
    """`SETTINGS` with a budget of `share` of the step's simulated peak
    (TF_LMS_SIMULATOR_MEM_RATIO is 1 here, so that is the budget)."""
    roles = pipeline.classify(index, SETTINGS)
    without = pipeline.simulate_without(index, roles, SETTINGS)
    return SETTINGS.replace(
        autotune_gpu_mem=share * without.peak_device_bytes / (1 << 30))


@pytest.fixture(autouse=True)
def _whole_budget(monkeypatch):
    monkeypatch.setenv("TF_LMS_SIMULATOR_MEM_RATIO", "1")


def _without_prefetch(monkeypatch):
    monkeypatch.setattr(stages, "STAGES", tuple(
        s for s in stages.STAGES if s.run is not prefetch.stage))


def _swap_in(plan, key):
    producer, output, j = key
    swap = next(s for s in plan.swaps
                if (s.producer, s.output) == (producer, output))
    return swap, swap.swap_ins[j]


def test_waited_swap_ins_start_earlier_within_the_budget(monkeypatch):
    index = tf_reader.build_index(_model().graph)
    settings = _settings(index)
    planned = pipeline.plan(index, settings)
    with monkeypatch.context() as patch:
        _without_prefetch(patch)
        tuned = pipeline.plan(index, settings)
    assert len(planned.record(records.Prefetched).swap_ins) == 2
    assert tuned.record(records.Prefetched).swap_ins == ()
    levels = planned.index.levels
    step = tuned.step_time
    for key in planned.record(records.Prefetched).swap_ins:
        swap, before = _swap_in(tuned.plan, key)
        _, after = _swap_in(planned.plan, key)
        # The tuner's swap-in ended no earlier than its reader started:
        # the reader waited for it.
        copy = step.swaps[tuned.plan.swaps.index(swap)].swap_ins[key[2]]
        assert copy.end_s >= step.op_start_s[before.first_consumer]
        # Same readers, one trigger, earlier in the step.
        assert after.consumers == before.consumers
        assert not after.synchronous and len(after.triggers) == 1
        assert levels[after.triggers[0]] < min(levels[t]
                                                for t in before.triggers)
    # Everything else is the tuner's plan.
    prefetched = planned.record(records.Prefetched).swap_ins
    moved = {key[:2] for key in prefetched}
    assert [s for s in planned.plan.swaps if (s.producer, s.output)
            not in moved] == [s for s in tuned.plan.swaps
                              if (s.producer, s.output) not in moved]
    assert planned.plan.params == tuned.plan.params
    # Within the budget with the copies timed, and faster.
    assert planned.with_lms.fits(planned.budget_bytes)
    assert planned.step_time.with_lms_s < tuned.step_time.with_lms_s
    assert (planned.step_time.exposed_transfer_s
            < tuned.step_time.exposed_transfer_s)


def test_plans_with_nothing_to_gain_are_left_alone(monkeypatch):
    index = tf_reader.build_index(_model().graph)
    settings = _settings(index)
    _without_prefetch(monkeypatch)
    tuned = pipeline.plan(index, settings)
    context = tuned.context
    assert tuned.step_time.exposed_transfer_s > 0
    # Chosen by bytes moved, not step time: a wait costs nothing.
    by_bytes = dataclasses.replace(context, judging=dataclasses.replace(
        context.judging, by_step_time=False))
    assert prefetch.stage(by_bytes, tuned) is tuned
    # A step that (as predicted) waits for no copy.
    step = tuned.step_time
    unwaiting = dataclasses.replace(tuned, step_time=dataclasses.replace(
        step, with_lms_s=step.without_lms_s))
    assert prefetch.stage(context, unwaiting) is unwaiting
    # Fixed parameters (no record of the tuner's): applied as given.
    fixed = dataclasses.replace(tuned, records=())
    assert prefetch.stage(context, fixed) is fixed


def test_a_budget_with_no_room_keeps_the_tuners_triggers(monkeypatch):
    index = tf_reader.build_index(_model().graph)
    settings = _settings(index)
    _without_prefetch(monkeypatch)
    tuned = pipeline.plan(index, settings)
    # The tuner's own peak as the budget: an earlier swap-in that holds
    # memory at the peak no longer fits, so only swap-ins whose earlier
    # start misses the peak may move, and the plan stays within it.
    context = tuned.context
    tight = dataclasses.replace(context, budgets=dataclasses.replace(
        context.budgets, device_bytes=tuned.with_lms.peak_device_bytes))
    planned = prefetch.stage(tight, tuned)
    assert planned.with_lms.peak_device_bytes <= \
        tuned.with_lms.peak_device_bytes
    for key in planned.record(records.Prefetched).swap_ins:
        assert key in {(s.producer, s.output, j) for s in tuned.plan.swaps
                       for j in range(len(s.swap_ins))}


# (case, model sizes, budget share, recompute, swap-ins moved, of them
# read by a recompute's clones). With recompute, on a deeper ResNet, the
# swap-ins moved are ones clones read: their trigger comes before the
# recompute's readers too.
TRAINED = [
    ("swap", SIZE, 0.5, False, 2, 0),
    ("recompute", dict(image=64, batch=4, blocks=(2, 2)), 0.55, True, 2, 2),
]


@pytest.mark.numerics
@pytest.mark.parametrize("case,size,share,recompute,moved,clone_read",
                         TRAINED, ids=[t[0] for t in TRAINED])
def test_a_prefetched_plan_trains_the_same_and_runs_every_swap(
        case, size, share, recompute, moved, clone_read, lms_log):
    base = eq.train(eq.zoo_model("keras_resnet", **size))
    model = eq.zoo_model("keras_resnet", **size)
    index = tf_reader.build_index(model.graph)
    lms = LMS.from_settings(_settings(index, share).replace(
        recompute=recompute))
    result = lms.run(model.graph)
    planned = result.planned
    prefetched = planned.record(records.Prefetched).swap_ins
    assert len(prefetched) == moved, case
    read = {src[1:] for rec in planned.plan.recomputes
            for src in rec.sources("swapin")}
    assert len([k for k in prefetched if k in read]) == clone_read
    lines = lms_log()
    assert any("%d swap-ins start earlier, where memory allows" % moved
               in line for line in lines)
    assert any("except for %d swap-ins started earlier" % moved in line
               for line in lines)
    run = eq.train(model)
    assert_same_training(model.graph, result, base, run)
    if recompute:
        # Clones compute the same kernels on the same inputs: exact.
        assert run[0] == base[0]
    # Each moved swap-in waits on its new trigger in the rewritten graph.
    plan = planned.plan
    names = iter(result.rewrite.swapin_ops)
    swapin_of = {(s.producer, s.output, j): next(names)
                 for s in plan.swaps for j in range(len(s.swap_ins))}
    graph = model.graph
    for key in planned.record(records.Prefetched).swap_ins:
        _, sin = _swap_in(plan, key)
        op = graph.get_operation_by_name(swapin_of[key])
        assert [c.name for c in op.control_inputs] == [
            planned.index.names[sin.triggers[0]]]


def test_a_swap_in_clones_read_is_triggered_before_the_clones_readers():
    # two_readers (test_shared_clones): conv's output is read late by gbn
    # (level 12) and swapped; z's recompute clones bn and z from conv's
    # swap-in for gz (level 10), and w's reads z's clone of bn for gw (11).
    # The swap-in feeds every clone, so its trigger must come before gz:
    # the lowest reader is gz, not its own reader gbn, and not gw.
    from test_shared_clones import two_readers
    from tflms import planner
    index = two_readers()
    n = index.id_of
    rec_z = planner.RecomputePlan(
        producer=n["z"], output=0, nbytes=4000, ops=(n["bn"], n["z"]),
        inputs=((("swapin", n["conv"], 0, 0),), (("clone", 0, 0),)),
        consumers=((n["gz"], 0),), trigger=n["m4"])
    rec_w = planner.RecomputePlan(
        producer=n["w"], output=0, nbytes=3000, ops=(n["w"],),
        inputs=((("recompute", n["z"], 0, 0, 0),),),
        consumers=((n["gw"], 1),), trigger=n["m6"])
    swap = planner.SwapPlan(
        producer=n["conv"], output=0, nbytes=1000,
        swap_ins=(planner.SwapInPlan(((n["gbn"], 1),), (n["m5"],), False),),
        waiters=())
    plan = planner.Plan(params=planner.SwapParams(1, 1, 0, 0), swaps=(swap,),
                        serialization_edges=(), num_levels=index.num_levels,
                        recomputes=(rec_z, rec_w))
    assert prefetch._lowest_readers(index, plan) == {
        (n["conv"], 0, 0): [n["gz"]]}
    assert index.levels[n["gz"]] < index.levels[n["gbn"]]
