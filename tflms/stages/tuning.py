"""The tuner's search as the stages run it: `tune` on a planning index, and
`with_outcome`, a `Planned` holding what it found. The swaps stage searches
on the planning index it is given; the order stage again on the indexes it
orders.
"""

import dataclasses

from tflms import autotune
from tflms import planner
from tflms.stages.records import Tuned

__all__ = ["tune", "with_outcome", "edges_only_plan"]

_GIB = float(1 << 30)


def tune(context, index, deferral, ordering_edges=(), log=None):
    """`autotune.tune` on `index`, saying so when LMS is not needed."""
    if log is not None:
        context = dataclasses.replace(context, log=log)
    outcome = autotune.tune(context, index, deferral_edges=deferral,
                            ordering_edges=ordering_edges)
    if outcome.params is None:
        context.log.info("LMS is not necessary: the model fits in %.2f GiB "
                         "without swapping. Turned LMS off."
                         % (outcome.budget_bytes / _GIB))
    return outcome


def with_outcome(context, planned, outcome, index):
    """`planned` with the tuner's `outcome`, planned on `index` (with the
    deferral edges `planned` records for it)."""
    # The baseline is the step as given, whatever edges LMS plans: the
    # tuner's own replay without LMS is it only on the given index.
    without = outcome.without_lms
    plan, with_lms = outcome.plan, outcome.with_lms
    if index is not context.given_index:
        without = context.model(context.given_index).replay(None, detail=True)
        if plan is None and not without.fits(outcome.budget_bytes):
            # The step fits without swapping only with the edges LMS
            # planned (ordering, serialization): turning LMS off would drop
            # them, and the step as given does not fit. A plan of those
            # edges alone is applied.
            plan = edges_only_plan(index, planned.deferral_edges)
            with_lms = context.model(index).replay(plan, detail=True)
            context.log.info(
                "[Simulator] The step fits in %.2f GiB without swapping only "
                "with the %d control edges LMS planned (%.2f GiB without "
                "them): applying those edges alone"
                % (outcome.budget_bytes / _GIB, len(plan.control_edges),
                   without.peak_device_bytes / _GIB))
    return dataclasses.replace(
        planned, index=index, plan=plan, without_lms=without,
        with_lms=with_lms, step_time=outcome.step_time,
        failure=None).with_record(Tuned(outcome))


def edges_only_plan(index, deferral):
    """A plan that swaps nothing and adds the planning index's control edges
    (serialization, ordering) and the deferral edges."""
    return planner.Plan(params=planner.SwapParams(0, 0, 0, 0), swaps=(),
                        serialization_edges=tuple(index.planned_edges),
                        num_levels=index.num_levels,
                        deferral_edges=tuple(deferral))
