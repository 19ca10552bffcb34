"""Find swapping parameters that make one training step fit the device.

`tune` is what `LMS.run` calls when any of swapout_threshold, swapin_ahead
or swapin_groupby is -1. It works only on plain data (`GraphIndex`,
`OpRoles`) through the simulator:

1. The budget is ``autotune_gpu_mem`` GiB, or the GPU's memory as
   TensorFlow reports it, times ``TF_LMS_SIMULATOR_MEM_RATIO`` (default 0.9).
2. With every parameter on auto, a graph that already fits needs no LMS
   (``TuneOutcome.params`` is None).
3. Otherwise the parameters are searched as TFLMSv2 does: the largest
   swapout_threshold that fits (fewest swaps) with swapin_ahead 1 and
   swapin_groupby 0, then the largest swapin_ahead (earliest swap-ins), then
   the largest swapin_groupby (fewest swap-ins). If even the most aggressive
   plan does not fit, sync_mode is raised one step at a time up to 3.
   Parameters the user set are kept.
4. Beyond TFLMSv2: a threshold swaps *every* tensor read that far away,
   including tensors that are not live when memory peaks. When the threshold
   is on auto, `select_tensors` keeps only the tensors that are needed: it
   repeatedly looks at the levels still over budget and adds the candidate
   tensors that free the most over-budget bytes per byte moved, re-simulating
   after each round. The selection is returned as ``only_tensors`` and is
   used only if it fits and moves no more bytes than the threshold alone.
5. Steps 3 and 4 count copies as instant. With ``by_step_time`` (as
   `LMS.run` tunes) and a link that is not ``'instant'``, the final choice
   is by time: among the few fitting plans the search ended with (the
   threshold plan, the plans it had before raising swapin_groupby and
   swapin_ahead, and the selection), the one with the least step time
   predicted by `tflms.steptime` on ``gpu`` and ``interconnect`` is used,
   ties going to fewer bytes moved. Otherwise the selection rule of 4
   stands.
6. The chosen plan is replayed once more with its copies timed on ``gpu``
   and ``interconnect`` (a swapped tensor stays on the device until its
   copy to the host has finished). If it no longer fits, steps 3-5 run
   again for a lower budget, then with synchronous swap-outs
   (`choice.fit_in_time`); ``interconnect='instant'`` skips this check.

Every plan accepted here has been replayed by the simulator and fits the
budget; see `tflms.simulator` for what it counts. A plan is never chosen
over the unmodified graph when that one fits and the plan needs no less
memory. When nothing fits, `AutotuneError` states the budget, the peak
without LMS and the smallest plan's peak, and carries the `PlotData` of
that search, which the caller draws (`tflms.plots`) when ``autotune_plot``
is set.

The modules, in the order `tune` uses them:

  tuner.py      `tune` and its `TuneOutcome`: the replay without LMS, the
                steps below
  search.py     step 3: `Simulations` (plans and replays, memoised) and the
                binary searches over the parameters, sync mode by sync mode
  selection.py  step 4: `select_tensors` (a greedy cover of the levels
                over budget, checked by replays) and `prune_swaps`
  choice.py     steps 5 and 6: the choice among the fitting plans (by
                predicted step time or bytes moved) and its check with
                copies timed (`fit_in_time`)
  report.py     `AutotuneError`, the message when nothing fits, and
                `PlotData`, what the memory plots show
"""

from tflms.autotune.report import AutotuneError, PlotData
from tflms.autotune.selection import select_tensors
from tflms.autotune.tuner import TuneOutcome, tune
from tflms.budget import (DEFAULT_MEM_RATIO, MEM_RATIO_ENV, NoGpuError,
                          device_budget, host_budget, mem_ratio)
from tflms.settings import AUTO

__all__ = [
    "AUTO",
    "MEM_RATIO_ENV",
    "DEFAULT_MEM_RATIO",
    "AutotuneError",
    "NoGpuError",
    "PlotData",
    "TuneOutcome",
    "mem_ratio",
    "device_budget",
    "host_budget",
    "select_tensors",
    "tune",
]
