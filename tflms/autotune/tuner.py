"""`tune`, auto-tuning's entry point (see `tflms.autotune` for the steps):
the replay without LMS, the search, the final choice and its check with
copies timed, and the `TuneOutcome`.
"""

import dataclasses
import functools
from typing import TYPE_CHECKING, FrozenSet, Optional, Tuple

from tflms import steptime
from tflms.autotune.choice import choose, fit_in_time
from tflms.autotune.report import AutotuneError, with_plot_data
from tflms.autotune.search import Simulations
from tflms.settings import AUTO

if TYPE_CHECKING:
    from tflms.planner import Plan, SwapParams
    from tflms.simulator import SimulationResult
    from tflms.steptime import StepTime

_GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True, eq=False)
class TuneOutcome:
    """What auto-tuning decided.

    Attributes:
      params: the `planner.SwapParams` to use, or None when the graph fits
        without LMS.
      only_tensors: None, or a frozenset of ``(producer_id, output)``: swap
        only these tensors (with `params`).
      budget_bytes: device bytes the plan had to fit in.
      without_lms: `simulator.SimulationResult` of the unmodified graph.
      with_lms: `simulator.SimulationResult` of the chosen plan (None when
        params is None).
      plan: the chosen `planner.Plan`, the one `with_lms` replayed (None
        when params is None).
      threshold_only: result of the plan found by the threshold search
        alone (None when params is None or the user set the threshold).
      simulations: number of replays run.
      step_time: `steptime.StepTime` of the chosen plan, when the plan was
        chosen by predicted step time (``by_step_time`` and a link that is
        not ``'instant'``), else None.
      timed_plans: how many fitting plans were timed to choose it.
    """

    params: Optional["SwapParams"]
    only_tensors: Optional[FrozenSet[Tuple[int, int]]]
    budget_bytes: int
    without_lms: Optional["SimulationResult"] = None
    with_lms: Optional["SimulationResult"] = None
    plan: Optional["Plan"] = None
    threshold_only: Optional["SimulationResult"] = None
    simulations: int = 0
    step_time: Optional["StepTime"] = None
    timed_plans: int = 0


def _all_auto(p):
    return (p.swapout_threshold == AUTO and p.swapin_ahead == AUTO
            and p.swapin_groupby == AUTO)


def tune(context, index, deferral_edges=(), ordering_edges=()):
    """Choose swapping parameters for the step by simulation.

    Args:
      context: the `context.PlanningContext`: settings (the requested
        parameters, -1 meaning auto; the batch size; `gpu` and
        `interconnect`, the hardware the chosen plan's copies are timed on:
        the plan returned fits the budget with swapped tensors held on the
        device until their copy to the host has finished, and
        ``interconnect="instant"`` counts copies as instant), roles, log,
        budgets, and whether the final choice is by predicted step time
        (`choice.choose`) or by bytes moved.
      index: the planning index (the step with the serialization and
        ordering edges planned so far).
      deferral_edges: `planner.deferral_edges` that every plan carries out
        (the replay without LMS does not).
      ordering_edges: the `stages.order.peaks.order_peaks` edges among the
        index's planned edges: synchronous swap-ins into their second ops also
        wait for their first (`planner.wait_for_ordering`).

    Returns:
      A `TuneOutcome`.

    Raises:
      simulator.BatchSizeError: a size needs the batch size.
      AutotuneError: nothing fits.
    """
    log = context.log
    roles = context.roles
    batch_size = context.batch_size
    requested = context.requested
    select = context.judging.select
    budget = context.budget_bytes
    model = context.model(index)
    link = context.interconnect
    time_model = None
    if link.bytes_per_s != steptime.INSTANT.bytes_per_s:
        # Made only when a plan is checked: timing every op is the costliest
        # model to make, which a step that fits without LMS (or a search
        # that finds nothing) should not pay.
        time_model = functools.partial(context.timer, index)
    # With instant copies every fitting plan takes the same time (no copy
    # is waited for): the choice is by bytes moved, with no model to make.
    by_time = time_model if context.judging.by_step_time else None
    if model.unknown_tensors:
        log.info("%d tensors have no static size and count as 0 bytes in "
                 "the simulation (first: %s)"
                 % (len(model.unknown_tensors), model.unknown_tensors[0]), 1)
    sims = Simulations(index, roles, model, budget, batch_size, log,
                       deferral_edges, ordering_edges)
    sims.serialized = bool(context.settings.serialization
                           or context.settings.serialization_by_size)
    log.info("[Simulator] Searching values for swapout_threshold, "
             "swapin_ahead, swapin_groupby and sync_mode for a budget of "
             "%.2f GiB" % (budget / _GIB))
    without = sims.replay(None, detail=True)
    sims.without = without
    log.info("[Simulator] Without LMS one step peaks at %.2f GiB at level %d "
             "(%s)" % (without.peak_device_bytes / _GIB, without.peak_level,
                       without.peak_op))

    def not_needed():
        return TuneOutcome(params=None, only_tensors=None,
                           budget_bytes=budget, without_lms=without,
                           simulations=sims.count)

    if _all_auto(requested) and without.fits(budget):
        return not_needed()

    max_level = index.num_levels
    try:
        chosen = choose(sims, model, requested, max_level, select, log,
                        by_time)
    except AutotuneError as err:
        raise with_plot_data(err, sims, index, roles, batch_size,
                             without) from None
    (params, final_plan, only, threshold_result, step_time, timed), final, \
        count = fit_in_time(sims, time_model, requested, max_level, select,
                            chosen, by_time)
    log.info("[Simulator] With LMS one step peaks at %.2f GiB of %.2f GiB at "
             "level %d (%s)" % (final.peak_device_bytes / _GIB, budget / _GIB,
                                final.peak_level, final.peak_op))
    if (without.fits(budget)
            and final.peak_device_bytes >= without.peak_device_bytes):
        # Only reachable with some parameters fixed by the user: the step
        # fits as it is and the plan would only add transfers.
        log.info("[Simulator] The plan needs %.3f GiB, no less than the "
                 "%.3f GiB the step needs without LMS, which fits; "
                 "not swapping." % (final.peak_device_bytes / _GIB,
                                    without.peak_device_bytes / _GIB))
        return not_needed()
    # The host budget is the `host` stage's (tflms/stages/host.py).
    return TuneOutcome(params=params, only_tensors=only, budget_bytes=budget,
                       without_lms=without, with_lms=final, plan=final_plan,
                       threshold_only=threshold_result, simulations=count,
                       step_time=step_time, timed_plans=timed)
