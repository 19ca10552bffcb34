"""Waits only where memory needs them (`tflms.stages.fewer_waits`,
docs/autotuning.md step 9): a tuned plan with synchronous swap-outs keeps
the wait of a swap-out only where the budget has no room for what is
allocated during its copy, and trains as without LMS."""

import dataclasses

import pytest

from tflms.tf import reader as tf_reader
from tflms import LMS
from tflms import autotune
from tflms import pipeline
from tflms import simulator
from tflms import steptime
from tflms.settings import Settings
from tflms.stages import records

from _graphs import assert_same_training, zoo_model
from test_equivalence import train

_GIB = float(1 << 30)


def _replay(planned, plan):
    """`plan` replayed with its copies timed, as the tuner judges it."""
    return steptime.replay_in_time(
        simulator.SimulationModel(planned.index, planned.context.roles,
                                  planned.context.settings.batch_size),
        steptime.StepTimeModel(planned.index, planned.context.roles,
                               planned.context.settings.batch_size),
        plan, detail=False)


def test_unet_352_waits_only_for_its_largest_copy(monkeypatch):
    # The 3D U-Net at 352^3 in 16 GiB, 14.24 GiB planned (at 14.4 GiB the
    # deferral of ops on held inputs lets `sync_mode` 0 fit): the search
    # needs `sync_mode` 1. Of its 14 swap-outs only pool2's copy (21 MB) must
    # hold its reader (down3_a's convolution) back: copies to the host run
    # in order, so waiting for it also waits for the 6.8 GiB of earlier
    # copies (down0 to down2), whose tensors are held until then. Waiting
    # for the other 13 only cost time. (With element-wise ops written in
    # place the 5.2 GiB concat0 is no longer swapped.)
    from benchmarks import models as bench_models
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "0.89")
    built = bench_models.build("unet3d", volume=352, base_filters=16,
                               depth=4, batch=1)
    index = tf_reader.build_index(built.graph)
    # Swaps only: the waits dropped are the swap plan's.
    settings = Settings(batch_size=built.batch_size, autotune_gpu_mem=16.0,
                        recompute=False)
    roles = pipeline.classify(index, settings)
    by_time = pipeline.plan(index, settings, roles=roles)
    by_bytes = pipeline.plan(index, settings, roles=roles,
                             by_step_time=False)
    plan = by_time.plan
    assert plan.params.sync_mode == 1
    assert by_bytes.plan.params == plan.params
    # The same swaps; by bytes (the tuner before the step-time model)
    # every swap-out still waits.
    assert [(s.producer, s.output) for s in by_bytes.plan.swaps] == \
        [(s.producer, s.output) for s in plan.swaps]
    assert len(plan.swaps) == 14
    assert all(s.waiters for s in by_bytes.plan.swaps)
    waited = [by_time.index.names[s.producer] for s in plan.swaps
              if s.waiters]
    assert waited == ["unet3d/pool2"]
    assert len(by_time.unwaited) == 13 and by_bytes.unwaited == ()
    timed, step = _replay(by_time, plan)
    assert timed.fits(by_time.budget_bytes)
    assert timed.peak_device_bytes == by_time.with_lms.peak_device_bytes
    assert step.with_lms_s == by_time.step_time.with_lms_s
    # The budget leaves the prefetch stage no room to start a swap-in
    # earlier (tests/test_prefetch.py covers it).
    assert round(step.with_lms_s * 1e3, 1) == 1453.1
    assert by_time.record(records.Prefetched).swap_ins == ()
    _, every_wait = _replay(by_bytes, by_bytes.plan)
    assert round(every_wait.with_lms_s * 1e3, 1) == 1666.1
    # The one wait kept is needed: without it the step would not fit.
    unwaited = dataclasses.replace(plan, swaps=tuple(
        dataclasses.replace(s, waiters=()) for s in plan.swaps))
    over, _ = _replay(by_time, unwaited)
    assert round(over.peak_device_bytes / _GIB, 2) == 14.55
    assert not over.fits(by_time.budget_bytes)


def test_fixed_parameters_keep_every_wait():
    model = zoo_model("keras_resnet", seed=1, image=64, batch=4,
                      blocks=(2, 2))
    index = tf_reader.build_index(model.graph)
    planned = pipeline.plan(index, Settings(
        swapout_threshold=7, swapin_ahead=1, swapin_groupby=0, sync_mode=3))
    assert planned.plan.swaps
    # Every swapped tensor with a reader left on the device (its near
    # readers) makes them wait; a weight gradient read only by the
    # optimizer's IdentityN far away has none to wait.
    waited = 0
    for swap in planned.plan.swaps:
        rerouted = {c for sin in swap.swap_ins for c in sin.consumers}
        near = [c for c in index.consumers[swap.producer][swap.output]
                if c not in rerouted and not index.hands_on_unread(*c)]
        assert bool(swap.waiters) == bool(near)
        waited += bool(near)
    assert waited >= 10


def _resnet64():
    return zoo_model("keras_resnet", image=64, batch=4, blocks=(2, 2))


@pytest.mark.numerics
def test_a_plan_with_some_waits_dropped_trains_as_without_lms(
        monkeypatch, lms_log):
    """A small Keras ResNet tuned for a quarter of its peak needs
    `sync_mode` 3; 9 of its 16 swap-outs no longer wait. The rewritten
    graph has the waits of the other 7 only, every swap op runs, and three
    training steps give the same losses and weights as without LMS."""
    monkeypatch.setenv(autotune.MEM_RATIO_ENV, "1")
    model = _resnet64()
    index = tf_reader.build_index(model.graph)
    settings = Settings()
    without = pipeline.simulate_without(
        index, pipeline.classify(index, settings), settings)
    lms = LMS(recompute=False)  # the swap plan's waits, none recomputed
    lms.autotune_gpu_mem = 0.25 * without.peak_device_bytes / _GIB
    result = lms.run(model.graph)
    planned = result.planned
    plan = planned.plan
    assert plan.params.sync_mode == 3
    assert len(plan.swaps) == 16
    waited = [s for s in plan.swaps if s.waiters]
    assert len(waited) == 7
    assert any("9 of 16 swap-outs no longer make their readers wait" in line
               for line in lms_log())
    assert any("except for 9 swap-outs, whose waits the plan does not need "
               "to fit" in line for line in lms_log())
    assert len(planned.unwaited) == 9
    assert {(s.producer, s.output) for s in plan.swaps if not s.waiters} \
        == set(planned.unwaited)
    graph = model.graph
    names = planned.index.names
    swapouts = dict(zip(((s.producer, s.output) for s in plan.swaps),
                        result.swapout_ops))
    for swap in plan.swaps:
        swapout = graph.get_operation_by_name(
            swapouts[(swap.producer, swap.output)])
        held = [op.name for op in swapout.outputs[0].graph.get_operations()
                if swapout in op.control_inputs]
        assert sorted(held) == sorted(names[w] for w in swap.waiters)
    assert_same_training(graph, result, train(_resnet64()), train(model))
