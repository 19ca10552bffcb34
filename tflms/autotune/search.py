"""The parameter search: binary searches over swapout_threshold,
swapin_ahead and swapin_groupby at one sync mode after another
(steps 3 of `tflms.autotune`), every plan replayed through `Simulations`.
"""

import collections

from tflms import planner
from tflms.autotune.report import cannot_fit
from tflms.settings import AUTO

_GIB = float(1 << 30)

# Replays remembered by content (see `Simulations.replay`).
_RECENT_REPLAYS = 4
# The binary searches resolve a parameter to 1/_SEARCH_STEPS of the graph's
# levels (exactly, up to that many levels): a fixed number of plays per
# search whatever the depth, instead of one more per doubling.
_SEARCH_STEPS = 1024


class Simulations:
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
        if (self.smallest is None
                or result.peak_device_bytes < self.smallest[0]):
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


def search(sims, requested, max_level, log):
    sync = requested.sync_mode
    while True:
        found = _search_at_sync(sims, requested, sync, max_level)
        if found is not None:
            return found
        if sync >= 3:
            raise cannot_fit(sims, requested)
        log.info("[Simulator] Nothing fits with sync_mode %d; trying "
                 "sync_mode %d" % (sync, sync + 1))
        sync += 1
