"""The swap plan: auto-tuned, or made from the parameters the user fixed.

With any of swapout_threshold, swapin_ahead, swapin_groupby on auto
(`Settings.autotune_requested`), `autotune.tune` searches the parameters
whose plan the simulator says fits the budget. When nothing fits, the error
is recorded in `Planned.failure` if ordering may still help
(`Settings.order_peaks`; the `order` stage tries), else raised. With fixed
parameters the plan is `planner.make_plan`'s, unreplayed.
"""

import dataclasses

from tflms import autotune
from tflms import planner
from tflms.stages.records import Deferred
from tflms.stages import tuning

__all__ = ["stage"]


def stage(context, planned):
    """`planned` with its swap plan (or its failure to find one)."""
    deferral = planned.record(Deferred).edges
    if context.settings.autotune_requested:
        try:
            outcome = tuning.tune(context, planned.index, deferral)
        except autotune.AutotuneError as err:
            if not context.settings.order_peaks:
                raise
            return dataclasses.replace(planned, failure=err)
        return tuning.with_outcome(context, planned, outcome, planned.index)
    chosen = planner.make_plan(planned.index, context.roles,
                               context.requested,
                               batch_size=context.batch_size,
                               deferral=deferral)
    return dataclasses.replace(planned, plan=chosen)
