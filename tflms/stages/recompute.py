"""Recompute: swaps replaced by clones of the ops that made the tensor,
where that costs less (`Settings.recompute`: by default when auto-tuning).

* A tuned plan: a recompute is taken where a replay with copies timed
  still fits the budget and the predicted step (then the bytes moved) is
  lower (`recompute_cost`). Clones of convolutions and matrix products, and
  longer chains (`planner.MAX_TIMED_RECOMPUTE_OPS`), are offered too, since
  each is timed.
* Fixed parameters give no budget, so the swap-only plan's own peak is the
  memory a recompute must stay within, and the cost is the bytes moved: no
  step-time choice was asked for.
"""

import dataclasses
import math

from tflms import planner
from tflms import simulator
from tflms import steptime
from tflms.stages import timed

__all__ = ["stage", "recompute_cost", "slower_than"]

_GIB = float(1 << 30)


def stage(context, planned):
    """`planned` with the recomputes that cost less than their swaps:
    with `Settings.recompute` None (the default) when auto-tuning only,
    with True also for fixed parameters, with False never."""
    wanted = context.settings.recompute
    if wanted is False or planned.plan is None:
        return planned
    if planned.autotuned:
        return _within_budget(context, planned)
    if wanted and planned.plan.swaps:
        return _within_peak(context, planned)
    return planned


def recompute_cost(plan, timer=None, result=None):
    """What planning minimises when it replaces swaps by recomputes (lower
    is better).

    Args:
      plan: a `planner.Plan`.
      timer: a `steptime.StepTimeModel` of the planning index, or None.
      result: the plan's `simulator.SimulationResult` (its levels time the
        plan), needed with `timer`.

    Returns:
      With `timer`: ``(predicted step seconds, bytes moved)``, so a
      recompute is taken when its clones cost less time than the copies they
      save, and equal times go to fewer bytes moved. Without: the bytes a
      plan copies between device and host per step.
    """
    if timer is None:
        return plan.moved_bytes()
    if result is None:
        raise ValueError("recompute_cost needs the plan's replay (result=) "
                         "to time it with a step-time model; got None")
    step = timer.predict(plan, result.levels, result.num_levels)
    return (step.with_lms_s, plan.moved_bytes())


def slower_than(candidate, step_s, timer, compute_s):
    """True if `candidate` cannot take less than `step_s` seconds: the
    compute stream alone runs every op and every clone one after the other,
    so the step is never shorter than that sum. When the current plan's
    copies are all hidden, every recompute fails this test, and neither its
    replay nor its timing (each about a replay) is spent on it."""
    # Clones count as `StepTimeModel.predict` times them: before a reader
    # that runs.
    clones_s = math.fsum(timer.op_seconds[op] for rec in candidate.recomputes
                         if any(timer.runs[c] for c, _ in rec.consumers)
                         for op in rec.ops)
    bound = compute_s + clones_s
    # Clear of float rounding: the sums are made in different orders.
    return bound - step_s > 1e-9 * step_s


def _within_budget(context, planned):
    model = context.model(planned.index)
    timer = context.timer(planned.index)
    budget = context.budget_bytes
    start = model.replay(planned.plan, detail=False)
    # Plans accepted so far and their cost (kept alive, so ids stay theirs).
    costs = {id(planned.plan): (planned.plan,
                                recompute_cost(planned.plan, timer, start))}
    compute_s = math.fsum(timer.op_seconds)
    # The timed replay of each plan offered: the searches below offer many
    # plans more than once, and a plan (frozen, compared by value) replays
    # the same.
    replays = {}

    def accept(candidate, current):
        if slower_than(candidate, costs[id(current)][1][0], timer, compute_s):
            return False
        if candidate not in replays:
            replays[candidate] = timed.fitting_replay(model, timer,
                                                      candidate, budget)
        fitting = replays[candidate]
        if fitting is None:
            return False
        value = (fitting[1].with_lms_s, candidate.moved_bytes())
        if value < costs[id(current)][1]:
            costs[id(candidate)] = (candidate, value)
            return True
        return False

    # Each recompute here is timed, so clones of convolutions and matrix
    # products are offered too: one is taken only where it shortens the
    # predicted step.
    clone_types = planner.TIMED_RECOMPUTABLE_TYPES
    # The search keeps the swaps an accepted recompute reads, so which
    # tensor is tried first decides what can follow: of tensors moving as
    # many bytes, it tries those made first, or (another search from the
    # tuner's plan) those made last; and a swap recomputes read is kept, or
    # (`unpin`) also tried with those recomputes planned again. All four
    # run, and the fastest plan is kept: no order wins on every model (a
    # swap kept only because another recompute reads its swap-in is what
    # unpinning frees; docs/benchmarks.md compares the four).
    searches = ((False, False), (True, False), (False, True), (True, True))
    step_s = costs[id(planned.plan)][1][0]
    if step_s - compute_s <= 1e-9 * step_s:
        # The compute hides every copy, and no recompute can change that (a
        # step is never shorter than its compute): only clones that take no
        # time pass `slower_than`, so only those are looked for, in one
        # search instead of four (`benchmarks/plan_speed.py ... --recompute`
        # measures what that saves).
        clone_types = clone_types & steptime.NO_KERNEL_TYPES
        searches = ((False, False),)

    def search(plan):
        found = {}
        for latest, unpin in searches:
            if unpin and not _reads_swap_ins(found[(latest, False)]):
                # The same search without unpinning never kept a swap for
                # a recompute reading it, so unpinning would change
                # nothing: the plans are the same.
                continue
            found[(latest, unpin)] = planner.Recomputer(
                planned.index, context.roles, context.batch_size,
                clone_types=clone_types,
                max_ops=planner.MAX_TIMED_RECOMPUTE_OPS).with_recomputes(
                    plan, accept, latest_first=latest, unpin=unpin)
        return min(found.values(), key=lambda plan: costs[id(plan)][1])

    chosen = search(planned.plan)
    # Recomputes taken one at a time clone some ops twice (one taken first
    # runs after one taken later): those read the earlier clones instead,
    # and with fewer clones each, a second search may take more.
    shared = planner.Recomputer(
        planned.index, context.roles, context.batch_size,
        clone_types=clone_types,
        max_ops=planner.MAX_TIMED_RECOMPUTE_OPS).with_shared_clones(
            chosen, accept)
    if shared is not chosen:
        chosen = search(shared)
    log = context.log
    if chosen is planned.plan:
        log.info("[Simulator] No swapped tensor can be recomputed within "
                 "the budget in less predicted time than it is swapped")
        return planned
    final, step = timed.replay_at_link(model, timer, chosen)
    if not final.fits(budget):
        # Every recompute taken was judged with its copies timed; this
        # only guards the plan returned. The tuner's plan fits with its
        # copies timed, so it stays.
        log.info("[Simulator] With recomputes and copies timed at %s one "
                 "step would peak at %.2f GiB, over the %.2f GiB budget; "
                 "keeping the swap-only plan" % (
                     context.interconnect.name,
                     final.peak_device_bytes / _GIB, budget / _GIB))
        return planned
    _log_recomputes(log, planned.index, chosen)
    log.info("[Simulator] With LMS and recomputes one step peaks at %.2f "
             "GiB of %.2f GiB at level %d (%s); predicted step %.1f ms, "
             "%.1f ms of it exposed transfer, %.1f ms recomputing" % (
                 final.peak_device_bytes / _GIB, budget / _GIB,
                 final.peak_level, final.peak_op, step.with_lms_s * 1e3,
                 step.exposed_transfer_s * 1e3, step.recompute_s * 1e3))
    return planned.with_plan(chosen, final, step)


def _reads_swap_ins(plan):
    """True if one of `plan`'s recomputes reads a swap-in."""
    return any(any(rec.sources("swapin")) for rec in plan.recomputes)


def _within_peak(context, planned):
    try:
        model = context.model(planned.index)
        limit = model.replay(planned.plan, detail=False).peak_device_bytes
    except simulator.BatchSizeError:
        context.log.warning(
            "Not recomputing: choosing what to recompute needs every "
            "tensor's size, and some shapes have an unknown batch dimension; "
            "set lms.batch_size = <your mini-batch size> to recompute with "
            "fixed parameters (the swaps are applied as planned)")
        return planned

    def accept(candidate, current):
        if candidate.moved_bytes() >= current.moved_bytes():
            return False
        return model.replay(candidate, detail=False).fits(limit)

    chosen = planner.Recomputer(
        planned.index, context.roles,
        context.batch_size).with_recomputes(planned.plan, accept)
    _log_recomputes(context.log, planned.index, chosen)
    return dataclasses.replace(planned, plan=chosen)


def _log_recomputes(log, index, plan):
    """Which swapped tensors `plan` recomputes, each with the number of
    operations cloned for it (debug level 1 lists the operations)."""
    if plan.recomputes:
        log.info("Recomputing %d swapped tensors (%.3f GiB) by cloning the "
                 "operations that made them instead: %.3f GiB moved per "
                 "step; recomputed (cloned ops): %s"
                 % (len(plan.recomputes), plan.recompute_bytes() / _GIB,
                    plan.moved_bytes() / _GIB, ", ".join(
                        "%s:%d (%d)" % (index.names[rec.producer],
                                        rec.output, len(rec.ops))
                        for rec in plan.recomputes)))
