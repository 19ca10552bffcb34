"""What auto-tuning says when nothing fits, and what its plots show.

`AutotuneError` is the one exception of `tflms.autotune`; `cannot_fit`
words it for a search that found no plan (the budget, the peak without
LMS, the smallest plan's peak and what to try), and `with_plot_data` gives
it the `PlotData` of that search. `PlotData` is what the memory plots
show; the planning core writes no file: `tflms.plots` draws it for the
caller (`LMS.run`) when the settings ask.
"""

import dataclasses
from typing import TYPE_CHECKING, Optional

from tflms import floor as floor_mod
from tflms.errors import LMSError
from tflms.budget import MEM_RATIO_ENV
from tflms.settings import AUTO

if TYPE_CHECKING:
    from tflms.analysis import OpRoles
    from tflms.graph_index.index import GraphIndex
    from tflms.simulator import SimulationResult

GIB = float(1 << 30)


@dataclasses.dataclass(frozen=True, eq=False)
class PlotData:
    """What the memory plots and the distance histogram show.

    Attributes:
      index, roles, batch_size: the planning index, its `OpRoles` and the
        batch size (the histogram's edges and bytes).
      without_lms: the `SimulationResult` of the step without LMS.
      with_lms: that of the plan (or, when nothing fits, of the smallest
        plan the search found), or None.
      budget_bytes: the device budget (the plots' budget line).
      with_lms_fits: False when `with_lms` is the smallest plan of a
        search that found nothing under the budget.
    """

    index: "GraphIndex"
    roles: "OpRoles"
    batch_size: Optional[int]
    without_lms: "SimulationResult"
    with_lms: Optional["SimulationResult"]
    budget_bytes: int
    with_lms_fits: bool = True


class AutotuneError(LMSError, ValueError):
    """No parameter set makes the simulated step fit the budget.

    Attributes:
      smallest_peak_bytes: the simulated peak of the smallest plan the
        search found (None when the error is not about one), so that of
        several failed searches the closest can be reported.
      floor: the step's `floor.StepFloor` (device memory no plan goes
        below, and the op that sets it), or None.
      plot_data: the `PlotData` of the failed search (`with_plot_data`),
        or None.
      stage_seconds: ``(name, CPU seconds)`` of each planning stage until
        this was raised, when `pipeline.plan` raised it
        (`Planned.stage_seconds`); empty otherwise.
    """

    def __init__(self, message, smallest_peak_bytes=None, floor=None,
                 plot_data=None):
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes
        self.floor = floor
        self.plot_data = plot_data
        self.stage_seconds = ()


def cannot_fit(sims, requested):
    """The `AutotuneError` of a search (`sims`, a `search.Simulations`)
    that found no plan fitting its budget."""
    peak, params = sims.smallest
    without = getattr(sims, "without", None)
    fixed = [name for name in ("swapout_threshold", "swapin_ahead",
                               "swapin_groupby")
             if getattr(requested, name) != AUTO]
    hint = ""
    if fixed:
        hint = " You fixed %s; setting %s to -1 lets LMS search %s too." % (
            ", ".join(fixed), "it" if len(fixed) == 1 else "them",
            "it" if len(fixed) == 1 else "them")
    facts = ""
    if without is not None:
        facts = " Without LMS one step needs %s." % gib(
            without.peak_device_bytes)
        if peak >= without.peak_device_bytes:
            facts += (" No plan lowers that peak: what is live at it (level "
                      "%d, %s) is needed right then." % (
                          without.peak_level, without.peak_op or "?"))
        if without.resident_device_bytes:
            facts += (" %s of the peak are variables, optimizer slots and "
                      "constants, which stay on the device."
                      % gib(without.resident_device_bytes))
    lowest = floor_mod.step_floor(sims.model)
    facts += " No plan can go below %s." % lowest.describe()
    if lowest.floor_bytes > sims.budget:
        facts += (" That is over the budget, so no LMS setting fits this "
                  "step: a smaller batch, a GPU with more memory or a "
                  "smaller model does.")
    # Serialization already on is no advice; serializing other levels is.
    serialization = (
        "serializing more levels (this search ran with serialization on)"
        if sims.serialized else
        "serialization (lms.serialization or serialization_by_size) to run "
        "large levels one op at a time")
    # `search` raises this only after trying every sync mode from the
    # requested one to 3, so a sync_mode is never advice here.
    tried = ("sync_mode %d" % requested.sync_mode if requested.sync_mode >= 3
             else "sync_modes %d to 3" % max(requested.sync_mode, 0))
    return AutotuneError(
        "LMS auto-tuning found no parameter set that fits in %s (searched "
        "%s): the smallest plan it found (%s) needs %s, %s too "
        "much.%s Try a smaller batch size, %s, or a larger "
        "lms.autotune_gpu_mem / %s if the GPU really has more memory.%s"
        % (gib(sims.budget), tried, params.describe(), gib(peak),
           gib(peak - sims.budget, exact=True), facts, serialization,
           MEM_RATIO_ENV, hint), smallest_peak_bytes=peak, floor=lowest)


def gib(nbytes, exact=False):
    """``'1.234 GiB (1263.6 MiB)'``: GiB as asked, MiB for small graphs, and
    the exact bytes when asked (a tiny miss would otherwise print as 0)."""
    text = "%.3f GiB (%.1f MiB" % (nbytes / GIB, nbytes / float(1 << 20))
    return text + (", %d bytes)" % nbytes if exact else ")")


def with_plot_data(err, sims, index, roles, batch_size, without):
    """`err` carrying the `PlotData` of its failed search: the step
    without LMS and the smallest plan, which show where memory peaks and
    what swapping could not move (what a user needs to pick a smaller
    batch or serialization). The caller draws them (`plots`)."""
    smallest = None
    if sims.smallest is not None:
        smallest = sims.cached(sims.smallest[1])[2]
    err.plot_data = PlotData(index=index, roles=roles, batch_size=batch_size,
                             without_lms=without, with_lms=smallest,
                             budget_bytes=sims.budget, with_lms_fits=False)
    return err
