"""What auto-tuning says when nothing fits, and the memory plots it writes.

`AutotuneError` is the one exception of `tflms.autotune`; `cannot_fit`
words it for a search that found no plan (the budget, the peak without
LMS, the smallest plan's peak and what to try), and `with_plots` adds the
plots of that search when ``plot_dir`` is set.
"""

import os

from tflms import floor as floor_mod
from tflms import plots
from tflms.budget import MEM_RATIO_ENV
from tflms.settings import AUTO

GIB = float(1 << 30)


class AutotuneError(ValueError):
    """No parameter set makes the simulated step fit the budget.

    Attributes:
      smallest_peak_bytes: the simulated peak of the smallest plan the
        search found (None when the error is not about one), so that of
        several failed searches the closest can be reported.
      floor: the step's `floor.StepFloor` (device memory no plan goes
        below, and the op that sets it), or None.
    """

    def __init__(self, message, smallest_peak_bytes=None, floor=None):
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes
        self.floor = floor


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


def plot_files(plot_dir, index, roles, batch_size, without, with_lms,
               budget, log, with_lms_fits=True):
    if not plot_dir:
        return ()
    return tuple(plots.write_plots(plot_dir, index, roles, without, with_lms,
                                   budget, batch_size=batch_size, log=log,
                                   with_lms_fits=with_lms_fits))


def with_plots(err, sims, plot_dir, index, roles, batch_size, without,
               budget, log):
    """`err`, naming the plots of the failed search when any were asked for.

    The plots of the step without LMS and of the smallest plan show where
    memory peaks and what swapping could not move, which is what a user
    needs to pick a smaller batch or serialization.
    """
    if not plot_dir:
        return err
    smallest = None
    if sims.smallest is not None:
        smallest = sims.cached(sims.smallest[1])[2]
    files = plot_files(plot_dir, index, roles, batch_size, without,
                       smallest, budget, log, with_lms_fits=False)
    pictures = [f for f in files if f.endswith(".png")]
    if not pictures:
        return AutotuneError(
            "%s (No memory plots: matplotlib is missing; the distance "
            "histogram is in %s.)" % (err, os.path.abspath(plot_dir)),
            err.smallest_peak_bytes, err.floor)
    return AutotuneError("%s Memory plots of the step without LMS and with "
                         "the smallest plan: %s" % (
                             err, ", ".join(os.path.abspath(f)
                                            for f in pictures)),
                         err.smallest_peak_bytes)
