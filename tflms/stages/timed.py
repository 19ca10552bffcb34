"""What the stages after the tuner share: a plan replayed with its copies
timed, and a tuned plan replaced by a changed one."""

import dataclasses

from tflms import plots
from tflms import steptime

__all__ = ["replay_at_link", "fitting_replay", "replaced_plan", "outcome"]


def replay_at_link(model, timer, plan, detail=True, instant=None):
    """``(replay, step)`` of `plan` at the link of `timer` (a
    `steptime.StepTimeModel` on the settings' gpu and interconnect), as the
    tuner judges its own plan: `steptime.replay_in_time`, except on the
    ``'instant'`` link, where copies take no time, so the replay with
    instant copies is the timed one and is not made again."""
    if timer.interconnect is steptime.INSTANT:
        if instant is None or detail:
            instant = model.replay(plan, detail=detail)
        return instant, timer.predict(plan, instant.levels,
                                      instant.num_levels)
    return steptime.replay_in_time(model, timer, plan, detail=detail,
                                   instant=instant)


def fitting_replay(model, timer, plan, budget):
    """``(replay, step)`` of `plan` with its copies timed (as
    `replay_at_link`, without detail) when it fits `budget`, else None.

    Copies that take time only hold memory longer, so a plan over the
    budget with instant copies is not timed."""
    result = model.replay(plan, detail=False)
    if not result.fits(budget):
        return None
    replay, step = replay_at_link(model, timer, plan, detail=False,
                                  instant=result)
    return (replay, step) if replay.fits(budget) else None


def replaced_plan(context, planned, plan, replay, step):
    """`planned` with the tuner's plan replaced by `plan` (its timed
    `replay` and predicted `step`); the memory plots, which the tuner drew
    for its own plan, are drawn again for the one applied."""
    if context.plot_dir:
        plots.write_plots(context.plot_dir, planned.index, context.roles,
                          planned.without_lms, replay, planned.budget_bytes,
                          batch_size=context.batch_size, log=context.log)
    # A tensor recomputed instead is no longer swapped: no wait to drop.
    swapped = {(s.producer, s.output) for s in plan.swaps}
    return dataclasses.replace(
        planned, plan=plan, with_lms=replay, step_time=step,
        unwaited=tuple(t for t in planned.unwaited if t in swapped),
        prefetched=tuple(k for k in planned.prefetched
                         if k[:2] in swapped))


def outcome(context, replay, budget, step, before):
    """The log's account of a plan a stage changed: its timed `replay`'s
    peak against `budget` and its predicted `step` against the step
    before (`before`, a `steptime.StepTime`)."""
    gib = float(1 << 30)
    return ("one step peaks at %.2f GiB of %.2f GiB with copies timed at "
            "%s; predicted step %.1f ms instead of %.1f ms"
            % (replay.peak_device_bytes / gib, budget / gib,
               context.interconnect.name, step.with_lms_s * 1e3,
               before.with_lms_s * 1e3))
