"""The final choice among the fitting plans (steps 5 and 6 of
`tflms.autotune`): by predicted step time or by bytes moved, then the
chosen plan checked with its copies timed and searched again while it
does not fit.
"""

import dataclasses

from tflms import steptime
from tflms.floor import step_floor
from tflms.autotune.report import AutotuneError, gib
from tflms.autotune.search import Simulations, search
from tflms.autotune.selection import select_best
from tflms.settings import AUTO

_GIB = float(1 << 30)

# Most searches run again when the chosen plan does not fit once its copies
# take time (see `fit_in_time`): for a lower budget, then with synchronous
# swap-outs. Each costs what the first search did.
_TIME_ROUNDS = 3


def choose(sims, model, requested, max_level, select, log, by_time=None):
    """Search the parameters for `sims.budget`, then (threshold on auto,
    `select`) the tensors; copies count as instant here. With `by_time`,
    the plan is the fastest of the fitting plans the search ended with
    (`fitting_candidates`, `_fastest`); without, the threshold plan or
    the selection when it moves fewer bytes.

    Args:
      by_time: a callable making the `steptime.StepTimeModel` that times
        the fitting plans, or None to choose by bytes moved.

    Returns:
      ``(params, plan, only_tensors, threshold_result, step_time,
      timed_plans)``: the chosen plan, the tensors it swaps when a
      selection was chosen (else None), the detailed replay of the
      threshold-only plan when a selection was tried, and (with
      `by_time`) the chosen plan's `steptime.StepTime` and how many
      plans were timed (else None and 0).

    Raises:
      AutotuneError: nothing fits `sims.budget`.
    """
    params = search(sims, requested, max_level, log)
    _, plan, _ = sims.cached(params)
    found = params
    only = None
    threshold_result = None
    final_plan = plan
    selection = None
    if select and requested.swapout_threshold == AUTO and plan.swaps:
        threshold_result = sims.replay(plan, detail=True)
        best = select_best(sims, model, params, plan, sims.budget)
        if best is not None:
            params, final_plan = best
            selection = best
            only = frozenset((s.producer, s.output) for s in final_plan.swaps)
            log.info("[Simulator] Swapping %d chosen tensors "
                     "(swapout_threshold %d) is enough: %.3f GiB moved to "
                     "the host instead of %.3f GiB with the threshold "
                     "alone" % (
                         len(final_plan.swaps), params.swapout_threshold,
                         final_plan.swapout_bytes() / _GIB,
                         plan.swapout_bytes() / _GIB))
    if by_time is None:
        return params, final_plan, only, threshold_result, None, 0
    candidates = fitting_candidates(sims, requested, found, selection)
    (params, final_plan, only), step_time = _fastest(
        candidates, by_time(), sims.replay, sims.budget, log)
    return (params, final_plan, only, threshold_result, step_time,
            len(candidates))


def fit_in_time(sims, time_model, requested, max_level, select, chosen,
                by_time=None):
    """The chosen plan checked with its copies' duration, and planned again
    for a smaller budget while it does not fit.

    The search replays hundreds of plans with instant copies; only the
    plan it ends with is timed (`steptime.replay_in_time`: one step-time
    prediction and one more replay). When copies that take time push that
    plan over the budget by some excess, the search runs again, at most
    `_TIME_ROUNDS` times: first for the plan's peak with instant copies
    less that excess (so the next plan frees at least that much more),
    then with synchronous swap-outs (sync_mode 1, or 3 from 2), whose
    readers wait for the copies instead of the copies holding memory.

    Args:
      sims: the `Simulations` `chosen` came from (its model and log are
        the search's).
      requested, max_level, select: as for `choose`.
      time_model: a callable making the `steptime.StepTimeModel`, or None
        to count copies as instant.
      chosen: what `choose` returned.
      by_time: what `choose` chose with (each search again chooses the
        same way); the plan chosen by predicted step time is checked here
        like any other.

    Returns:
      ``(chosen, final, replays)``: the plan that fits with copy times (as
      `choose` returns it), its detailed replay (with copy times), and
      the number of replays run in all.

    Raises:
      AutotuneError: no plan fits once its copies take their time.
    """
    budget = sims.budget
    model, log = sims.model, sims.log
    if time_model is None:
        return chosen, sims.replay(chosen[1], detail=True), sims.count
    time_model = time_model()
    without = sims.without
    link = time_model.interconnect.label
    count = 0
    planned_for = budget
    sync_out = chosen[0].sync_swapout
    for attempt in range(_TIME_ROUNDS + 1):
        lowered = 0
        if chosen is not None:
            instant = sims.replay(chosen[1])
            final, _ = steptime.replay_in_time(model, time_model, chosen[1],
                                               instant=instant)
            count += 1
            if final.fits(budget):
                return chosen, final, count + sims.count
            lowered = min(planned_for, instant.peak_device_bytes) - (
                final.peak_device_bytes - budget)
            requested = dataclasses.replace(
                requested, sync_mode=chosen[0].sync_mode)
        if attempt == _TIME_ROUNDS:
            break
        # Next: a plan whose peak with instant copies is lower by at least
        # what the copies' time added to this one; or, when that was tried
        # already (or leaves nothing), synchronous swap-outs at the full
        # budget: a swapped tensor's remaining readers wait for its copy to
        # the host, so it is not held longer than the plan says.
        if not sync_out and (attempt > 0 or lowered <= 0):
            sync_out = True
            requested = dataclasses.replace(
                requested, sync_mode=requested.sync_mode | 1)
            planned_for = budget
            how = "with sync_mode %d" % requested.sync_mode
        elif lowered > 0:
            planned_for = lowered
            how = "for %.3f GiB with instant copies" % (planned_for / _GIB)
        else:
            break
        log.info("[Simulator] With copies timed at %s the plan peaks at "
                 "%.3f GiB, over the %.3f GiB budget; searching again %s"
                 % (link, final.peak_device_bytes / _GIB,
                         budget / _GIB, how))
        count += sims.count
        sims = Simulations(sims.index, sims.roles, model, planned_for,
                           sims.batch_size, log, sims.deferral,
                           sims.ordering)
        sims.without = without
        try:
            chosen = choose(sims, model, requested, max_level, select, log,
                            by_time)
        except AutotuneError:
            chosen = None
    lowest = step_floor(model)
    raise AutotuneError(
        "LMS auto-tuning found no plan that fits in %s once its copies take "
        "the time they take at interconnect=%r (%s): the last plan found "
        "peaks at %s with them, because swapped tensors "
        "stay on the device until their copy to the host has finished. Use "
        "the interconnect this machine has (a faster one finishes copies "
        "sooner), sync_mode=1 or 3 (operations wait for the swap-outs), a "
        "smaller batch size, a larger lms.autotune_gpu_mem, or "
        "interconnect='instant' to plan as if copies took no time. No plan "
        "can go below %s." % (
            gib(budget), time_model.interconnect.name, link,
            gib(final.peak_device_bytes), lowest.describe()),
        floor=lowest)


def fitting_candidates(sims, requested, found, selection):
    """The fitting plans the final choice is made among.

    They are the threshold plan `found`, the plans at its threshold before
    the search raised swapin_groupby and then swapin_ahead (swap-ins later
    or more numerous: they moved more bytes or overlapped less, but which
    costs more time depends on the compute they hide behind), and the
    tensor `selection` (``(params, plan)`` or None). Only plans whose
    replay fitted are offered; a handful, so timing them costs a few
    replays.

    Returns:
      A list of ``(params, plan, only_tensors, replay or None)``.
    """
    start_a = 1 if requested.swapin_ahead == AUTO else requested.swapin_ahead
    start_g = (0 if requested.swapin_groupby == AUTO
               else requested.swapin_groupby)
    offered = [found,
               dataclasses.replace(found, swapin_groupby=start_g),
               dataclasses.replace(found, swapin_ahead=start_a,
                                   swapin_groupby=start_g)]
    candidates = []
    seen = set()
    for params in offered:
        fitted = None if params in seen else sims.fitting(params)
        seen.add(params)
        if fitted is not None:
            candidates.append((params, fitted[0], None, fitted[1]))
    if selection is not None:
        params, plan = selection
        candidates.append((params, plan, frozenset(
            (s.producer, s.output) for s in plan.swaps), None))
    return candidates


def _fastest(candidates, timer, replay, budget, log):
    """The candidate with the least predicted step time (ties: fewer bytes
    moved, then fewer swaps, then the earlier one) and its `StepTime`.
    A candidate without a replay is replayed (to time it at its own
    levels); one whose replay does not fit `budget` is never returned, nor
    timed.

    Raises:
      AutotuneError: no candidate fits (a bug in the search: it offers only
        plans it saw fit).
    """
    best = best_key = best_step = None
    for k, (params, plan, only, result) in enumerate(candidates):
        if result is None:
            result = replay(plan)
        if not result.fits(budget):
            continue
        step = timer.predict(plan, result.levels, result.num_levels)
        key = (step.with_lms_s, plan.moved_bytes(), len(plan.swaps), k)
        log.info(
            "[Simulator] %s%s: %d swaps, %.3f GiB moved, predicted step "
            "%.1f ms (%.1f ms exposed transfer)" % (
                params.describe(), " (selected tensors)" if only else "",
                len(plan.swaps), plan.moved_bytes() / _GIB,
                step.with_lms_s * 1e3, step.exposed_transfer_s * 1e3), 1)
        if best_key is None or key < best_key:
            best, best_key, best_step = (params, plan, only), key, step
    if best is None:
        raise AutotuneError(
            "none of the %d plans offered for the final choice fits the "
            "budget of %s; this is a bug in the search, please report it"
            % (len(candidates), gib(budget)))
    log.info("[Simulator] Chose the fastest of %d fitting plans on %s over "
             "%s: predicted step %.1f ms (%.1f ms without LMS), %.1f ms of "
             "it exposed transfer, %.3f GiB moved" % (
                 len(candidates), timer.gpu.name, timer.interconnect.label,
                 best_step.with_lms_s * 1e3, best_step.without_lms_s * 1e3,
                 best_step.exposed_transfer_s * 1e3,
                 best[1].moved_bytes() / _GIB))
    return best, best_step
