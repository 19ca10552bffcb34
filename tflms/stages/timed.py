"""What the stages after the tuner share: a plan replayed with its copies
timed, whether it fits, the log's account of a changed plan (a stage puts
it in place with `Planned.with_plan`), how many replays a search may spend
and when waiting for copies is worth a search."""

from tflms import steptime

__all__ = ["replay_at_link", "fitting_replay", "outcome", "replays_for",
           "MAX_REPLAYS", "MIN_EXPOSED_SHARE"]

# Replays one search may spend. One round of `order.peaks` tries at most a
# dozen edges and a peak takes a few rounds. A replay costs time in
# proportion to the graph's ops, so the bound shrinks with the graph
# (`replays_for`): the ops replayed per search stay bounded, and ordering,
# which only runs when nothing fits or a plan needs synchronous swap-ins,
# stays within seconds.
MAX_REPLAYS = 96
_REPLAYED_OPS = 2000000  # ops replayed per search on a large graph
_MIN_REPLAYS = 13        # one full round and the replay before it


def replays_for(num_ops):
    """Replays a search (`order.peaks.order_peaks`, the fewer_waits and
    prefetch stages) may spend on a graph of `num_ops` ops."""
    return max(_MIN_REPLAYS, min(MAX_REPLAYS, _REPLAYED_OPS // max(1,
                                                                   num_ops)))


# The fewer_waits stage's second pass and the prefetch stage run only where
# the step waits for copies at least this share of its time: they save at
# most that wait, and each change they try is a replay.
MIN_EXPOSED_SHARE = 0.01


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
