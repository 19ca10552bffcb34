"""Fewer waits: swap-outs the tuner's `sync_mode` makes readers wait for,
made asynchronous where memory allows and the step gets shorter.

A synchronous mode holds every early reader of a swapped tensor back until
its copy to the host has finished, so that nothing new is allocated while
the tensor still occupies the device. The tuner sets the mode for the whole
plan; where the budget has room for the allocations made during one copy,
its wait only costs time (a large 3D activation waits for its whole copy
to the host). The stage runs before the recompute stage and, where
recomputes replaced swaps, again after it (`after_recompute`): they free
device memory that can hold what a copy no longer waited for holds
(docs/benchmarks.md measures both passes). Each swap-out, most bytes
first, is one replay with copies timed;
`timed.replays_for` bounds how many are tried. Only plans the tuner
chose by predicted step time are changed: without a step time a wait costs
nothing.
"""

import dataclasses

from tflms.stages import timed
from tflms.stages.records import Unwaited

__all__ = ["stage", "after_recompute"]

_GIB = float(1 << 30)


def after_recompute(context, planned):
    """`stage` again when the recompute stage replaced swaps: the memory
    their clones do not hold may let more swap-outs go without a wait.
    Not where the predicted step waits for copies less than
    `timed.MIN_EXPOSED_SHARE` of its time."""
    if planned.plan is None or not planned.plan.recomputes:
        return planned
    step = planned.step_time
    if step is None or step.exposed_transfer_s < (
            timed.MIN_EXPOSED_SHARE * step.with_lms_s):
        return planned
    return stage(context, planned)


def stage(context, planned):
    """`planned` with the waits that cost time and no memory dropped."""
    if not (planned.autotuned and context.judging.by_step_time
            and planned.plan is not None):
        return planned
    plan = planned.plan
    waited = sorted((s for s in plan.swaps if s.waiters),
                    key=lambda s: (-(s.nbytes or 0), s.producer, s.output))
    if not waited or planned.step_time is None:
        return planned
    model = context.model(planned.index)
    timer = context.timer(planned.index)
    budget = context.budget_bytes
    # The tuner timed its plan at the levels of its replay, as
    # `timed.replay_at_link` does.
    best = planned.step_time.with_lms_s
    current = plan
    freed = []
    for swap in waited[:timed.replays_for(planned.index.num_ops)]:
        candidate = dataclasses.replace(current, swaps=tuple(
            dataclasses.replace(s, waiters=()) if s is swap else s
            for s in current.swaps))
        replay, step = timed.replay_at_link(model, timer, candidate,
                                            detail=False)
        if replay.fits(budget) and step.with_lms_s < best:
            current, best = candidate, step.with_lms_s
            freed.append(swap)
    if not freed:
        return planned
    final, step = timed.replay_at_link(model, timer, current)
    context.log.info(
        "[Simulator] %d of %d swap-outs no longer make their readers wait "
        "(%.2f GiB): %s"
        % (len(freed), len(waited), sum(s.nbytes or 0 for s in freed) / _GIB,
           timed.outcome(context, final, budget, step, planned.step_time)))
    unwaited = planned.record(Unwaited).tensors + tuple(
        (s.producer, s.output) for s in freed)
    return planned.with_record(Unwaited(unwaited)).with_plan(current, final,
                                                             step)
