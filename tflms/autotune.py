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
   (`_fit_in_time`); ``interconnect='instant'`` skips this check.

Every plan accepted here has been replayed by the simulator and fits the
budget; see `tflms.simulator` for what it counts. A plan is never chosen
over the unmodified graph when that one fits and the plan needs no less
memory. When nothing fits, `AutotuneError` states the budget, the peak
without LMS and the smallest plan's peak, and names the memory plots
(written even then when ``plot_dir`` is set).
"""

import collections
import dataclasses
import functools
import os

import numpy as np

from tflms import planner
from tflms import plots
from tflms import steptime
from tflms.budget import (DEFAULT_MEM_RATIO, MEM_RATIO_ENV, NoGpuError,
                          device_budget, host_budget, mem_ratio)
from tflms.settings import AUTO

__all__ = [
    "AUTO",
    "MEM_RATIO_ENV",
    "DEFAULT_MEM_RATIO",
    "AutotuneError",
    "NoGpuError",
    "TuneOutcome",
    "mem_ratio",
    "device_budget",
    "host_budget",
    "select_tensors",
    "tune",
]

_GIB = float(1 << 30)

# Rounds of select-and-replay before giving up on a selection; each round
# usually closes most of the remaining gap, so a few suffice.
_SELECTION_ROUNDS = 12
# Replays spent removing unneeded swaps from the chosen selection.
_PRUNE_REPLAYS = 48
# Replays remembered by content (see `_Simulations.replay`).
_RECENT_REPLAYS = 4
# The binary searches resolve a parameter to 1/_SEARCH_STEPS of the graph's
# levels (exactly, up to that many levels): a fixed number of plays per
# search whatever the depth, instead of one more per doubling.
_SEARCH_STEPS = 1024
# Most candidate pools the tensor selection tries (see
# `_selection_thresholds`); a bound, so that tuning stays linear in the graph.
_SELECTION_POOLS = 10
# Most searches run again when the chosen plan does not fit once its copies
# take time (see `_fit_in_time`): for a lower budget, then with synchronous
# swap-outs. Each costs what the first search did.
_TIME_ROUNDS = 3


class AutotuneError(ValueError):
    """No parameter set makes the simulated step fit the budget.

    Attributes:
      smallest_peak_bytes: the simulated peak of the smallest plan the
        search found (None when the error is not about one), so that of
        several failed searches the closest can be reported.
    """

    def __init__(self, message, smallest_peak_bytes=None):
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes


@dataclasses.dataclass(frozen=True, eq=False)
class TuneOutcome:
    """What auto-tuning decided.

    Attributes:
      params: the `planner.SwapParams` to use, or None when the graph fits
        without LMS.
      only_tensors: None, or a frozenset of ``(producer_id, output)``: swap
        only these tensors (with `params`).
      budget_bytes: device bytes the plan had to fit in.
      host_budget_bytes: host bytes available to this process.
      without_lms: `simulator.SimulationResult` of the unmodified graph.
      with_lms: `simulator.SimulationResult` of the chosen plan (None when
        params is None).
      plan: the chosen `planner.Plan`, the one `with_lms` replayed (None
        when params is None).
      threshold_only: result of the plan found by the threshold search
        alone (None when params is None or the user set the threshold).
      simulations: number of replays run.
      plot_files: paths of the files written to plot_dir.
      step_time: `steptime.StepTime` of the chosen plan, when the plan was
        chosen by predicted step time (``by_step_time`` and a link that is
        not ``'instant'``), else None.
      timed_plans: how many fitting plans were timed to choose it.
    """

    params: object
    only_tensors: object
    budget_bytes: int
    host_budget_bytes: int = 0
    without_lms: object = None
    with_lms: object = None
    plan: object = None
    threshold_only: object = None
    simulations: int = 0
    plot_files: tuple = ()
    step_time: object = None
    timed_plans: int = 0


# ---- budgets -------------------------------------------------------------
# ---- the search ----------------------------------------------------------
class _Simulations:
    """Plans and replays with memoisation and the "Found" log lines."""

    def __init__(self, index, roles, model, budget, batch_size, log,
                 deferral=(), ordering=()):
        self.index = index
        self.deferral = tuple(deferral)
        self.ordering = tuple(ordering)
        self.roles = roles
        self.model = model
        self.budget = budget
        self.batch_size = batch_size
        self.log = log
        self.edges = planner.candidate_edges(index, roles)
        self.count = 0
        self._cache = {}
        self._no_swaps = {}  # control edges -> replay of a plan without swaps
        self._recent = collections.OrderedDict()  # (swaps, edges) -> result
        # Shared by the dozens of plans one search makes.
        self._triggers = planner.TriggerFinder(index, roles)
        self.smallest = None  # (peak, params) of the lowest peak seen
        self.serialized = False  # the index holds serialization edges
        self.without = None   # SimulationResult of the unmodified graph

    def plan(self, params):
        plan = planner.make_plan(self.index, self.roles, params,
                                 batch_size=self.batch_size, edges=self.edges,
                                 triggers=self._triggers,
                                 deferral=self.deferral)
        return planner.wait_for_ordering(plan, self.ordering)

    def replay(self, plan, detail=False):
        self.count += 1
        if plan is not None and not plan.swaps and not detail:
            # Every candidate pool of the tensor selection starts from the
            # plan without swaps; replaying it once is enough, and sharing
            # its levels lets the model reuse its freed_levels answers.
            key = plan.control_edges
            result = self._no_swaps.get(key)
            if result is None:
                result = self._no_swaps[key] = self.model.replay(plan, False)
            return result
        if plan is None or detail:
            return self.model.replay(plan, detail=detail)
        # Candidate pools at nearby thresholds often select the same swaps;
        # the last few replays are kept (a result holds per-level arrays).
        key = (plan.swaps, plan.control_edges)
        result = self._recent.get(key)
        if result is None:
            result = self.model.replay(plan, detail=False)
            self._recent[key] = result
            if len(self._recent) > _RECENT_REPLAYS:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(key)
        return result

    def play(self, params):
        """True if the plan for `params` fits; logs it when it does."""
        if params in self._cache:
            return self._cache[params][0]
        plan = self.plan(params)
        result = self.replay(plan)
        ok = result.fits(self.budget)
        self._cache[params] = (ok, plan, result)
        if self.smallest is None or result.peak_device_bytes < self.smallest[0]:
            self.smallest = (result.peak_device_bytes, params)
        if ok:
            self.log.info("[Simulator] Found a parameter set: %s"
                          % params.describe())
        self.log.info("[Simulator] %s: peak %.3f GiB of %.3f GiB" % (
            params.describe(), result.peak_device_bytes / _GIB,
            self.budget / _GIB), 1)
        return ok

    def cached(self, params):
        return self._cache[params]

    def fitting(self, params):
        """``(plan, result)`` of `params` if it was played and fitted, else
        None."""
        ok, plan, result = self._cache.get(params, (False, None, None))
        return (plan, result) if ok else None


def _largest_passing(passes, known_good, high, resolution=1):
    """Largest value in [known_good, high] that passes, by binary search.

    Assumes `passes(known_good)` is True and the property is (mostly)
    monotone; a value is only returned if it was seen to pass. The search
    stops once fewer than `resolution` values are left undecided, so the
    answer is at most ``resolution - 1`` below the largest (exact for 1).
    """
    best, lo, hi = known_good, known_good + 1, high
    while hi - lo + 1 >= resolution and lo <= hi:
        mid = (lo + hi) // 2
        if passes(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _search_at_sync(sims, requested, sync, max_level):
    """Threshold, then ahead, then groupby at one sync mode; None if the
    most aggressive plan already does not fit."""
    auto_t = requested.swapout_threshold == AUTO
    auto_a = requested.swapin_ahead == AUTO
    auto_g = requested.swapin_groupby == AUTO
    t = 1 if auto_t else requested.swapout_threshold
    a = 1 if auto_a else requested.swapin_ahead
    g = 0 if auto_g else requested.swapin_groupby

    def params(t_, a_, g_):
        return planner.SwapParams(t_, a_, g_, sync)

    step = _search_resolution(max_level)
    if not sims.play(params(t, a, g)):
        return None
    if auto_t:
        t = _largest_passing(lambda v: sims.play(params(v, a, g)), t,
                             max_level, step)
    swapin_sync = params(t, a, g).sync_swapin
    # With synchronous swap-ins, ahead and groupby are not used.
    if auto_a and not swapin_sync:
        a = _largest_passing(lambda v: sims.play(params(t, v, g)), a,
                             max_level, step)
    if auto_g and not swapin_sync:
        if sims.play(params(t, a, max_level)):
            g = max_level
        else:
            g = _largest_passing(lambda v: sims.play(params(t, a, v)), g,
                                 max_level, step)
    return params(t, a, g)


def _search_resolution(max_level):
    """How close to the largest passing value a search gets in a graph of
    `max_level` levels: exact up to `_SEARCH_STEPS` levels, then within
    1/_SEARCH_STEPS of the depth (75 levels of a 77,000-level graph)."""
    return max(1, max_level // _SEARCH_STEPS)


def _cannot_fit(sims, requested):
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
        facts = " Without LMS one step needs %s." % _gib(
            without.peak_device_bytes)
        if peak >= without.peak_device_bytes:
            facts += (" No plan lowers that peak: what is live at it (level "
                      "%d, %s) is needed right then." % (
                          without.peak_level, without.peak_op or "?"))
        if without.resident_device_bytes:
            facts += (" %s of the peak are variables, optimizer slots and "
                      "constants, which stay on the device."
                      % _gib(without.resident_device_bytes))
    # Serialization already on is no advice; serializing other levels is.
    serialization = (
        "serializing more levels (this search ran with serialization on)"
        if sims.serialized else
        "serialization (lms.serialization or serialization_by_size) to run "
        "large levels one op at a time")
    # `_search` raises this only after trying every sync mode from the
    # requested one to 3, so a sync_mode is never advice here.
    tried = ("sync_mode %d" % requested.sync_mode if requested.sync_mode >= 3
             else "sync_modes %d to 3" % max(requested.sync_mode, 0))
    return AutotuneError(
        "LMS auto-tuning found no parameter set that fits in %s (searched "
        "%s): the smallest plan it found (%s) needs %s, %s too "
        "much.%s Try a smaller batch size, %s, or a larger "
        "lms.autotune_gpu_mem / %s if the GPU really has more memory.%s"
        % (_gib(sims.budget), tried, params.describe(), _gib(peak),
           _gib(peak - sims.budget, exact=True), facts, serialization,
           MEM_RATIO_ENV, hint), smallest_peak_bytes=peak)


def _gib(nbytes, exact=False):
    """``'1.234 GiB (1263.6 MiB)'``: GiB as asked, MiB for small graphs, and
    the exact bytes when asked (a tiny miss would otherwise print as 0)."""
    text = "%.3f GiB (%.1f MiB" % (nbytes / _GIB, nbytes / float(1 << 20))
    return text + (", %d bytes)" % nbytes if exact else ")")


def _search(sims, requested, max_level, log):
    sync = requested.sync_mode
    while True:
        found = _search_at_sync(sims, requested, sync, max_level)
        if found is not None:
            return found
        if sync >= 3:
            raise _cannot_fit(sims, requested)
        log.info("[Simulator] Nothing fits with sync_mode %d; trying "
                 "sync_mode %d" % (sync, sync + 1))
        sync += 1


# ---- tensor selection ----------------------------------------------------
def select_tensors(model, plan, budget, replay=None, rounds=_SELECTION_ROUNDS,
                   prune=True):
    """Pick a subset of a plan's swaps that still fits the budget.

    Starting from no swaps, each round replays the current subset, finds
    the levels still over budget and their excess bytes, and greedily adds
    the swaps that free the most excess per byte moved (bytes out plus bytes
    back in), until the estimated excess is gone; then it replays again.
    Estimates come from `SimulationModel.freed_levels`; only replays decide.

    Args:
      model: a `simulator.SimulationModel`.
      plan: a `planner.Plan` (usually the threshold search's plan); its
        swaps are the candidates.
      budget: device bytes.
      replay: callable(plan) -> SimulationResult (default `model.replay`
        without details).
      rounds: most select-and-replay rounds.
      prune: afterwards drop swaps the fitting subset does not need, each
        removal checked by a replay.

    Returns:
      ``(subset_plan, result)`` for a subset that fits, or None.
    """
    replay = replay or (lambda p: model.replay(p, detail=False))
    swaps = plan.swaps
    if not swaps:
        return None
    sizes = np.array([model.tensor_size(s.producer, s.output) for s in swaps],
                     dtype=np.float64)
    moved = sizes * np.array([1 + len(s.swap_ins) for s in swaps],
                             dtype=np.float64)
    chosen = np.zeros(len(swaps), dtype=bool)

    def subset_of(mask):
        return dataclasses.replace(
            plan, swaps=tuple(s for s, c in zip(swaps, mask) if c))

    for _ in range(rounds):
        subset = subset_of(chosen)
        result = replay(subset)
        if result.fits(budget):
            if prune:
                return prune_swaps(subset, budget, replay, result,
                                   model=model)
            return subset, result
        excess = result.device_timeline - budget
        over = np.nonzero(excess > 0)[0]
        # cover[i]: the ranges [lo, hi) of over-budget levels (indices into
        # `over`) at which swap i frees its bytes.
        cover = [[] for _ in swaps]
        rows, starts, ends = [], [], []
        for i, s in enumerate(swaps):
            if chosen[i] or sizes[i] == 0:
                continue
            for a, z in model.freed_levels(s, result.levels):
                rows.append(i)
                starts.append(a)
                ends.append(z + 1)
        los = np.searchsorted(over, starts).tolist()
        his = np.searchsorted(over, ends).tolist()
        for i, lo, hi in zip(rows, los, his):
            if lo < hi:
                cover[i].append((lo, hi))
        picked = _greedy_cover(cover, sizes, moved,
                               excess[over].astype(np.float64))
        if picked:
            chosen[picked] = True
        else:
            # Nothing left covers the excess by the estimates: add every
            # remaining candidate and let the replays and pruning decide.
            rest = ~chosen & (sizes > 0)
            if not rest.any():
                return None
            chosen |= rest
    return None


def _greedy_cover(cover, sizes, moved, need):
    """Candidates (row ids) that together free `need` bytes at every level.

    `cover[i]` lists disjoint ``[lo, hi)`` ranges of the levels (indices of
    `need`) at which candidate i frees ``sizes[i]`` bytes. Scores every
    candidate once, by the still-needed bytes it frees per byte moved, walks
    them best first (ties: smaller tensor, then lower id) taking each one
    that still frees a needed byte, until nothing is needed; then drops
    picks that the others make redundant, most expensive first (a small
    tensor taken early can be made useless by a larger, necessary one).
    Re-scoring after each pick would cost O(picks * rows * levels), cubic in
    the graph; the select-and-replay rounds of `select_tensors` correct what
    a static score misses.

    Byte counts are whole numbers, so the work is done in int64 (exactly
    what float64 gave). Scores come from prefix sums, one per distinct
    tensor size; the walks use `_BlockMax`, so a range costs O(sqrt(levels))
    however long it is (ranges span most of a deep graph's levels).
    """
    need = np.maximum(need, 0).astype(np.int64)
    isizes = np.asarray(sizes).astype(np.int64)
    gain = _cover_gains(cover, isizes, need)
    score = gain / np.maximum(moved, 1)
    order = np.lexsort((np.arange(len(sizes)), sizes, -score))
    remaining = _BlockMax(need)
    picked = []
    for i in order:
        if gain[i] <= 0 or remaining.top() <= 0:
            break
        if not any(remaining.max(lo, hi) > 0 for lo, hi in cover[i]):
            continue
        picked.append(int(i))
        size = int(isizes[i])
        for lo, hi in cover[i]:
            remaining.add(lo, hi, -size)
    if not picked:
        return []
    # freed[j]: bytes the picks free at level j (a difference array).
    delta = np.zeros(len(need) + 1, dtype=np.int64)
    for i in picked:
        for lo, hi in cover[i]:
            delta[lo] += isizes[i]
            delta[hi] -= isizes[i]
    freed = np.cumsum(delta[:-1])
    target = np.minimum(need, freed)  # what the picks can cover at all
    # A pick is redundant when freed - size >= target on all its ranges,
    # that is when max(target - freed) <= -size there.
    shortfall = _BlockMax(target - freed)
    dropped = set()
    for i in sorted(picked, key=lambda r: (-moved[r], r)):
        size = int(isizes[i])
        if all(shortfall.max(lo, hi) <= -size for lo, hi in cover[i]):
            for lo, hi in cover[i]:
                shortfall.add(lo, hi, size)
            dropped.add(i)
    return [i for i in picked if i not in dropped]


def _cover_gains(cover, sizes, need):
    """gain[i]: sum over candidate i's ranges of min(need, sizes[i])."""
    gain = np.zeros(len(cover), dtype=np.int64)
    rows, los, his = [], [], []
    for i, ranges in enumerate(cover):
        for lo, hi in ranges:
            rows.append(i)
            los.append(lo)
            his.append(hi)
    if not rows:
        return gain.astype(np.float64)
    rows = np.asarray(rows, dtype=np.int64)
    los = np.asarray(los, dtype=np.int64)
    his = np.asarray(his, dtype=np.int64)
    row_sizes = sizes[rows]
    for size in np.unique(row_sizes):
        mine = row_sizes == size
        prefix = np.concatenate(
            ([0], np.cumsum(np.minimum(need, size), dtype=np.int64)))
        np.add.at(gain, rows[mine], prefix[his[mine]] - prefix[los[mine]])
    return gain.astype(np.float64)


class _BlockMax:
    """Range add and range max over an int64 array, by blocks of about
    sqrt(n) entries with a pending add per block: each call is a few numpy
    operations on at most a block or the block maxima."""

    _EMPTY = -(1 << 62)  # padding and the max of an empty range

    def __init__(self, values):
        n = len(values)
        width = max(16, int(np.sqrt(n)))
        blocks = max(1, -(-n // width))
        padded = np.full(blocks * width, self._EMPTY, dtype=np.int64)
        padded[:n] = values
        self.width = width
        self.values = padded.reshape(blocks, width)
        self.pending = np.zeros(blocks, dtype=np.int64)
        self.block_max = self.values.max(axis=1)

    def top(self):
        """The largest value."""
        return int(self.block_max.max())

    def max(self, lo, hi):
        """The largest value in [lo, hi) (`_EMPTY` if the range is)."""
        if lo >= hi:
            return self._EMPTY
        b0, s = divmod(lo, self.width)
        b1, e = divmod(hi - 1, self.width)
        v, pend = self.values, self.pending
        if b0 == b1:
            return int(v[b0, s:e + 1].max() + pend[b0])
        best = int(v[b0, s:].max() + pend[b0])
        best = max(best, int(v[b1, :e + 1].max() + pend[b1]))
        if b1 > b0 + 1:
            best = max(best, int(self.block_max[b0 + 1:b1].max()))
        return best

    def add(self, lo, hi, amount):
        """Add `amount` to every value in [lo, hi)."""
        if lo >= hi:
            return
        b0, s = divmod(lo, self.width)
        b1, e = divmod(hi - 1, self.width)
        v, pend = self.values, self.pending
        if b0 == b1:
            v[b0, s:e + 1] += amount
            self.block_max[b0] = v[b0].max() + pend[b0]
            return
        v[b0, s:] += amount
        self.block_max[b0] = v[b0].max() + pend[b0]
        v[b1, :e + 1] += amount
        self.block_max[b1] = v[b1].max() + pend[b1]
        if b1 > b0 + 1:
            pend[b0 + 1:b1] += amount
            self.block_max[b0 + 1:b1] += amount


def prune_swaps(plan, budget, replay, result, limit=_PRUNE_REPLAYS,
                model=None):
    """Drop swaps a fitting plan does not need.

    Tries removing one swap at a time, the most bytes moved first, and keeps
    each removal whose replay still fits (at most `limit` tries). With a
    `model`, a removal that by `SimulationModel.freed_levels` would put a
    level of the current replay over the budget is not replayed at all: the
    swap is kept. (A selection usually needs every swap it made, and a
    replay of a deep graph costs as much as planning it.)

    Returns:
      ``(plan, result)``.
    """
    swaps = list(plan.swaps)
    order = sorted(range(len(swaps)), key=lambda i: (
        -(swaps[i].nbytes or 0) * (1 + len(swaps[i].swap_ins)), i))
    keep = [True] * len(swaps)
    for i in order[:limit]:
        if model is not None and _removal_overflows(model, swaps[i], result,
                                                    budget):
            continue
        keep[i] = False
        trial = dataclasses.replace(
            plan, swaps=tuple(s for s, k in zip(swaps, keep) if k))
        trial_result = replay(trial)
        if trial_result.fits(budget):
            plan, result = trial, trial_result
        else:
            keep[i] = True
    return plan, result


def _removal_overflows(model, swap, result, budget):
    """True if, by the estimates, not swapping `swap` puts some level of
    `result` (a replay that fits) over `budget`."""
    size = model.tensor_size(swap.producer, swap.output)
    if not size:
        return False
    timeline = result.device_timeline
    return any(int(timeline[a:z + 1].max()) + size > budget
               for a, z in model.freed_levels(swap, result.levels))


def _selection_thresholds(found, most=_SELECTION_POOLS):
    """Thresholds whose swaps are the candidate pools for selection: the
    one found, then halving down to 1 (a lower threshold offers more tensors
    and longer gaps to choose from). When halving would take more than
    `most` pools (a threshold above 2**(most - 1)), `most` thresholds spaced
    evenly on a log scale between the one found and 1 instead."""
    values = []
    t = found
    while t >= 1:
        values.append(t)
        t //= 2
    if values[-1] != 1:
        values.append(1)
    if len(values) <= most:
        return values
    ratio = found ** (1.0 / (most - 1))
    spaced = [found] + [int(found / ratio ** k) for k in range(1, most - 1)]
    return sorted(set(spaced + [1]), reverse=True)


def _select_best(sims, model, params, plan, budget):
    """The selection moving the fewest bytes over a few candidate pools, or
    None if none moves fewer bytes than the threshold-only `plan`.

    Returns:
      ``(params, subset_plan)``.
    """
    best = None
    best_key = (plan.swapout_bytes(), plan.swapin_bytes(), len(plan.swaps))
    for t in _selection_thresholds(params.swapout_threshold):
        trial = dataclasses.replace(params, swapout_threshold=t)
        pool = plan if t == params.swapout_threshold else sims.plan(trial)
        picked = select_tensors(model, pool, budget, replay=sims.replay,
                                prune=False)
        if picked is None:
            continue
        subset = picked[0]
        key = (subset.swapout_bytes(), subset.swapin_bytes(),
               len(subset.swaps))
        if key < best_key:
            best, best_key = (trial, subset, picked[1]), key
    if best is None:
        return None
    trial, subset, result = best
    subset, _ = prune_swaps(subset, budget, sims.replay, result, model=model)
    return trial, subset


def _choose(sims, model, requested, max_level, select, log, by_time=None):
    """Search the parameters for `sims.budget`, then (threshold on auto,
    `select`) the tensors; copies count as instant here. With `by_time`,
    the plan is the fastest of the fitting plans the search ended with
    (`_fitting_candidates`, `_fastest`); without, the threshold plan or
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
    params = _search(sims, requested, max_level, log)
    _, plan, _ = sims.cached(params)
    found = params
    only = None
    threshold_result = None
    final_plan = plan
    selection = None
    if select and requested.swapout_threshold == AUTO and plan.swaps:
        threshold_result = sims.replay(plan, detail=True)
        best = _select_best(sims, model, params, plan, sims.budget)
        if best is not None:
            params, final_plan = best
            selection = best
            only = frozenset((s.producer, s.output) for s in final_plan.swaps)
            log.info("[Simulator] Swapping %d chosen tensors (swapout_threshold "
                     "%d) is enough: %.3f GiB moved to the host instead of "
                     "%.3f GiB with the threshold alone" % (
                         len(final_plan.swaps), params.swapout_threshold,
                         final_plan.swapout_bytes() / _GIB,
                         plan.swapout_bytes() / _GIB))
    if by_time is None:
        return params, final_plan, only, threshold_result, None, 0
    candidates = _fitting_candidates(sims, requested, found, selection)
    (params, final_plan, only), step_time = _fastest(
        candidates, by_time(), sims.replay, sims.budget, log)
    return (params, final_plan, only, threshold_result, step_time,
            len(candidates))


def _fit_in_time(sims, model, time_model, requested, max_level, select, log,
                 chosen, by_time=None):
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
      sims: the `_Simulations` `chosen` came from.
      time_model: a callable making the `steptime.StepTimeModel`, or None
        to count copies as instant.
      chosen: what `_choose` returned.
      by_time: what `_choose` chose with (each search again chooses the
        same way); the plan chosen by predicted step time is checked here
        like any other.

    Returns:
      ``(chosen, final, replays)``: the plan that fits with copy times (as
      `_choose` returns it), its detailed replay (with copy times), and
      the number of replays run in all.

    Raises:
      AutotuneError: no plan fits once its copies take their time.
    """
    budget = sims.budget
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
        sims = _Simulations(sims.index, sims.roles, model, planned_for,
                            sims.batch_size, log, sims.deferral,
                            sims.ordering)
        sims.without = without
        try:
            chosen = _choose(sims, model, requested, max_level, select, log,
                             by_time)
        except AutotuneError:
            chosen = None
    raise AutotuneError(
        "LMS auto-tuning found no plan that fits in %s once its copies take "
        "the time they take at interconnect=%r (%s): the last plan found "
        "peaks at %s with them, because swapped tensors "
        "stay on the device until their copy to the host has finished. Use "
        "the interconnect this machine has (a faster one finishes copies "
        "sooner), sync_mode=1 or 3 (operations wait for the swap-outs), a "
        "smaller batch size, a larger lms.autotune_gpu_mem, or "
        "interconnect='instant' to plan as if copies took no time." % (
            _gib(budget), time_model.interconnect.name, link,
            _gib(final.peak_device_bytes)))


# ---- entry point ---------------------------------------------------------
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
        ``interconnect="instant"`` counts copies as instant; the memory
        plots), roles, log, budgets, and whether the final choice is by
        predicted step time (`_fastest`) or by bytes moved.
      index: the planning index (the step with the serialization and
        ordering edges planned so far).
      deferral_edges: `planner.deferral_edges` that every plan carries out
        (the replay without LMS does not).
      ordering_edges: the `ordering.order_peaks` edges among the index's
        planned edges: synchronous swap-ins into their second ops also
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
    select = context.select
    plot_dir = context.plot_dir
    budget = context.budget_bytes
    host_limit = context.host_budget_bytes
    model = context.model(index)
    link = context.interconnect
    time_model = None
    if link.bytes_per_s != steptime.INSTANT.bytes_per_s:
        # Made only when a plan is checked: timing every op costs about a
        # second per 100,000 ops, which a step that fits without LMS (or a
        # search that finds nothing) should not pay.
        time_model = functools.partial(context.timer, index)
    # With instant copies every fitting plan takes the same time (no copy
    # is waited for): the choice is by bytes moved, with no model to make.
    by_time = time_model if context.by_step_time else None
    if model.unknown_tensors:
        log.info("%d tensors have no static size and count as 0 bytes in "
                 "the simulation (first: %s)"
                 % (len(model.unknown_tensors), model.unknown_tensors[0]), 1)
    sims = _Simulations(index, roles, model, budget, batch_size, log,
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
        files = _plots(plot_dir, index, roles, batch_size, without, None,
                       budget, log)
        return TuneOutcome(params=None, only_tensors=None,
                           budget_bytes=budget, host_budget_bytes=host_limit,
                           without_lms=without, simulations=sims.count,
                           plot_files=files)

    if _all_auto(requested) and without.fits(budget):
        return not_needed()

    max_level = index.num_levels
    try:
        chosen = _choose(sims, model, requested, max_level, select, log,
                         by_time)
    except AutotuneError as err:
        raise _with_plots(err, sims, plot_dir, index, roles, batch_size,
                          without, budget, log) from None
    (params, final_plan, only, threshold_result, step_time, timed), final, \
        count = _fit_in_time(sims, model, time_model, requested, max_level,
                             select, log, chosen, by_time)
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
    files = _plots(plot_dir, index, roles, batch_size, without, final, budget,
                   log)
    return TuneOutcome(params=params, only_tensors=only, budget_bytes=budget,
                       host_budget_bytes=host_limit, without_lms=without,
                       with_lms=final, plan=final_plan,
                       threshold_only=threshold_result,
                       simulations=count, plot_files=files,
                       step_time=step_time, timed_plans=timed)


def _fitting_candidates(sims, requested, found, selection):
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
            % (len(candidates), _gib(budget)))
    log.info("[Simulator] Chose the fastest of %d fitting plans on %s over "
             "%s: predicted step %.1f ms (%.1f ms without LMS), %.1f ms of "
             "it exposed transfer, %.3f GiB moved" % (
                 len(candidates), timer.gpu.name, timer.interconnect.label,
                 best_step.with_lms_s * 1e3, best_step.without_lms_s * 1e3,
                 best_step.exposed_transfer_s * 1e3,
                 best[1].moved_bytes() / _GIB))
    return best, best_step


def _plots(plot_dir, index, roles, batch_size, without, with_lms, budget,
           log, with_lms_fits=True):
    if not plot_dir:
        return ()
    return tuple(plots.write_plots(plot_dir, index, roles, without, with_lms,
                                   budget, batch_size=batch_size, log=log,
                                   with_lms_fits=with_lms_fits))


def _with_plots(err, sims, plot_dir, index, roles, batch_size, without,
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
    files = _plots(plot_dir, index, roles, batch_size, without, smallest,
                   budget, log, with_lms_fits=False)
    pictures = [f for f in files if f.endswith(".png")]
    if not pictures:
        return AutotuneError(
            "%s (No memory plots: matplotlib is missing; the distance "
            "histogram is in %s.)" % (err, os.path.abspath(plot_dir)),
            err.smallest_peak_bytes)
    return AutotuneError("%s Memory plots of the step without LMS and with "
                         "the smallest plan: %s" % (
                             err, ", ".join(os.path.abspath(f)
                                            for f in pictures)),
                         err.smallest_peak_bytes)
