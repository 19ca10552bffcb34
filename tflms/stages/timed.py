"""What the stages after the tuner share: a plan replayed with its copies
timed, whether it fits, and the log's account of a changed plan (a stage
puts it in place with `Planned.with_plan`)."""

from tflms import steptime

__all__ = ["replay_at_link", "fitting_replay", "outcome"]


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
