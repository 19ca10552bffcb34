"""Prefetch: swap-ins something waits for, started earlier where memory
allows and the step gets shorter.

The tuner starts every swap-in the same number of levels (`swapin_ahead`)
before its first reader, the most the memory peak lets it. Away from the
peak that is often too late: late in the backward phase device memory may
stay far under the budget while reader after reader waits for a swap-in
started a level or two ahead. This stage gives each swap-in that
something waits for (its first reader, or the clones of a recompute that
reads it), earliest in the step first, a trigger early enough for the copy
to end before the waiting op would otherwise start, and keeps it where a
replay with copies timed still fits the budget and predicts a shorter step;
where it does not fit, triggers half as far back are tried. The trigger is
a data ancestor of the earliest reader of the swap-in and of those clones
(`TriggerFinder.find`), so the control edge into the swap-in closes no
cycle. Only plans the tuner chose by predicted step time, and whose step
waits for copies at least `timed.MIN_EXPOSED_SHARE` of its time, are
changed; at most `timed.replays_for` timed replays are spent.
"""

import dataclasses

from tflms.planner.triggers import TriggerFinder
from tflms.planner.types import SwapInPlan
from tflms.stages import timed
from tflms.stages.records import Prefetched

__all__ = ["stage"]

# Triggers tried per swap-in: the one early enough for the copy, then
# halfway back towards the tuner's where that goes over the budget.
_TRIES_PER_SWAP_IN = 3


def stage(context, planned):
    """`planned` with the swap-ins something waits for started earlier,
    where that fits the budget and shortens the predicted step."""
    plan = planned.plan
    step = planned.step_time
    if not (planned.autotuned and context.judging.by_step_time
            and plan is not None and plan.swaps and step is not None):
        return planned
    if step.exposed_transfer_s < timed.MIN_EXPOSED_SHARE * step.with_lms_s:
        return planned
    index = planned.index
    model = context.model(index)
    timer = context.timer(index)
    finder = TriggerFinder(index, context.roles)
    budget = context.budget_bytes
    current, best = plan, step
    tried, moved = set(), []
    replays = timed.replays_for(index.num_ops)
    accepted = True
    while accepted and replays > 0:
        # The swap-ins to try, from the latest timing: made again only
        # after a change was kept.
        accepted = False
        for s, key, reader, end_by_s in _waiting(index, current, best,
                                                 tried):
            tried.add(key)
            for trigger in _triggers(index, finder, current, s, key[2],
                                     reader, best, end_by_s):
                if replays <= 0:
                    break
                replays -= 1
                candidate = _retriggered(current, s, key[2], trigger)
                fitting = timed.fitting_replay(model, timer, candidate,
                                               budget)
                if fitting is not None and (
                        fitting[1].with_lms_s < best.with_lms_s):
                    current, best, accepted = candidate, fitting[1], True
                    moved.append(key)
                    break
            if accepted or replays <= 0:
                break
    if not moved:
        return planned
    final, step = timed.replay_at_link(model, timer, current)
    context.log.info(
        "[Simulator] %d swap-ins start earlier, where memory allows: %s"
        % (len(moved), timed.outcome(context, final, budget, step,
                                     planned.step_time)))
    recorded = planned.with_record(Prefetched(
        planned.record(Prefetched).swap_ins + tuple(moved)))
    return recorded.with_plan(current, final, step)


def _waiting(index, plan, step, skipped):
    """The swap-ins the step waited for, not in `skipped`, earliest wait
    first, as ``(position of the swap, (producer, output, j), reader, when
    the copy should end)``. What waited is the swap-in's first reader, or
    the clones of a recompute reading it (`SwapInTiming.needed_s`: when
    it would have started without the wait, the moment the copy should
    end by); `reader` is the lowest of the swap-in's first reader and the
    recomputes' readers, the op its trigger must come before."""
    levels = index.levels
    lowest = _lowest_readers(index, plan)
    found = []
    for s, (swap, timing) in enumerate(zip(plan.swaps, step.swaps)):
        for j, (sin, copy) in enumerate(zip(swap.swap_ins, timing.swap_ins)):
            key = (swap.producer, swap.output, j)
            if key in skipped or sin.synchronous or not sin.triggers:
                continue
            # The copy was there when it was needed (up to the rounding of
            # two sums of the same times, which is no wait to remove).
            if copy.end_s <= copy.needed_s + 1e-9 * max(1.0, copy.needed_s):
                continue
            reader = min([sin.first_consumer] + lowest.get(key, []),
                         key=lambda op: (levels[op], op))
            found.append((copy.needed_s, s, key, reader))
    found.sort()
    return [(s, key, reader, needed_s)
            for needed_s, s, key, reader in found]


def _lowest_readers(index, plan):
    """``{swap-in key: [op]}``: for each recompute reading a swap-in, its
    lowest-level reader, which the swap-in's trigger must come before
    besides the swap-in's own readers. A recompute reading another's
    clones (a ``('recompute', ...)`` source) has its first reader at or
    after that one's (`planner.recompute_plan._shared_clones`), so the readers
    of the clones a swap-in feeds directly are the lowest."""
    levels = index.levels
    lowest = {}
    for rec in plan.recomputes:
        keys = [src[1:] for src in rec.sources("swapin")]
        if keys:
            low = min((c for c, _ in rec.consumers),
                      key=lambda op: (levels[op], op))
            for key in keys:
                lowest.setdefault(key, []).append(low)
    return lowest


def _triggers(index, finder, plan, s, j, reader, step, end_by_s):
    """Triggers to try for swap-in `j` of ``plan.swaps[s]``, whose
    earliest reader is `reader`: the nearest whose op ends early enough
    for the copy to end by `end_by_s`, then triggers halfway back towards
    the current one.

    Each is a data ancestor of `reader` at a lower level
    (`TriggerFinder.find`), so it comes before every reader of the
    swap-in and of the clones reading it: no cycle through the swap-in."""
    producer = plan.swaps[s].producer
    sin = plan.swaps[s].swap_ins[j]
    copy = step.swaps[s].swap_ins[j]
    levels = index.levels
    ahead_now = max(0, levels[reader] - max(levels[t] for t in sin.triggers))
    most = levels[reader] - levels[producer] - 1
    ready_by_s = end_by_s - (copy.end_s - copy.start_s)
    # The smallest ahead whose trigger ends by then (a trigger further back
    # ends no later, so the search halves).
    low, high, chosen = ahead_now + 1, most, None
    while low <= high:
        mid = (low + high) // 2
        trigger = finder.find(producer, reader, mid)
        if trigger is None:
            high = mid - 1
        elif step.op_end_s[trigger] <= ready_by_s:
            chosen, high = (mid, trigger), mid - 1
        else:
            low = mid + 1
    if chosen is None:
        # No trigger ends early enough: the earliest there is.
        for mid in range(most, ahead_now, -1):
            trigger = finder.find(producer, reader, mid)
            if trigger is not None:
                chosen = (mid, trigger)
                break
    if chosen is None:
        return []
    out = [chosen]
    ahead = chosen[0]
    while len(out) < _TRIES_PER_SWAP_IN:
        ahead = (ahead + ahead_now) // 2
        if ahead <= ahead_now:
            break
        trigger = finder.find(producer, reader, ahead)
        if trigger is not None:
            out.append((ahead, trigger))
    # Only triggers below the current ones start the copy earlier.
    lowest_now = min(levels[t] for t in sin.triggers)
    return [t for _, t in out if levels[t] < lowest_now]


def _retriggered(plan, s, j, trigger):
    """`plan` with swap-in `j` of ``plan.swaps[s]`` started by `trigger`
    alone."""
    swap = plan.swaps[s]
    swap = dataclasses.replace(swap, swap_ins=tuple(
        SwapInPlan(sin.consumers, (trigger,), False) if n == j else sin
        for n, sin in enumerate(swap.swap_ins)))
    return dataclasses.replace(
        plan, swaps=plan.swaps[:s] + (swap,) + plan.swaps[s + 1:])
