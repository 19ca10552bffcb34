"""The tensor selection (step 4 of `tflms.autotune`): of a threshold
plan's swaps, only those needed where memory is over budget, chosen by a
greedy cover of the over-budget levels and checked by replays.
"""

import dataclasses

import numpy as np

# Rounds of select-and-replay before giving up on a selection; each round
# usually closes most of the remaining gap, so a few suffice.
_SELECTION_ROUNDS = 12
# Replays spent removing unneeded swaps from the chosen selection.
_PRUNE_REPLAYS = 48
# Most candidate pools the tensor selection tries (see
# `_selection_thresholds`); a bound, so that tuning stays linear in the graph.
_SELECTION_POOLS = 10


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


def select_best(sims, model, params, plan, budget):
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
