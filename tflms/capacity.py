"""How big can one train: the largest batch (or, with the batch fixed, the
longest sequence) a device budget holds without LMS, with LMS, and with
LMS within an overhead of the step without it.

`search(plan_at, ...)` asks a callable for one `BatchRow` per batch it
tries: ``start`` and twice it; from them, the largest batch without LMS
(every level's bytes grow linearly with the batch) and the batch above
it, and the largest batch the floor allows (it grows at least linearly);
then galloping (doubling from the largest batch with a plan) until a
batch has none, and a binary search between the last batch with a plan
and the first without. The largest batch without LMS and the largest
within the overhead are then searched between batches already tried (in
two batches, when the prediction held). Every answer comes with the
batch above it that was tried and failed, so each can be checked with
``tflms plan`` at both. The search relies on answers that hold: a plan
found at one batch is found at every smaller one, which the planner keeps
for the budget (`tflms.stages.order`) and the memory of a step keeps for
the batch (every activation grows with it).

``dimension="sequence"`` searches the sequence length the same way, with
the batch fixed: every level's bytes are then a polynomial of degree two
in the length (attention's scores are length x length), so the first
prediction comes from three lengths (``start``, twice and four times it;
one more from 1, a degenerate length) instead of two; the floor's bound
likewise. Rows carry the length in ``sequence`` and tokens per second
beside samples per second; the `Capacity` is the same, its JSON keys
named for the dimension (``max_sequence_with_lms``...).

`plan_row(index, roles, settings, batch)` is the callable's work for an
index whose batch dimension is free (the simulator sizes the first unknown
dimension with the batch: one index, one `OpRoles`, a plan per batch);
`tflms capacity` and `tflms.tf.live_capacity` trace a Keras 3 step once per
batch and call it on each trace's index.

Every number is a prediction: peaks from the simulator, steps from the
step-time model on the settings' ``gpu`` and ``interconnect``
(docs/capacity.md). `write_plot` draws samples per second against the
batch (matplotlib, lazily, as `tflms.plots`).

Pure: no TensorFlow.
"""

import dataclasses
import time
from typing import Optional

from tflms import autotune
from tflms import floor as floor_mod
from tflms import pipeline
from tflms import plots
from tflms import steptime
from tflms.target import Target

__all__ = ["BatchRow", "Capacity", "search", "plan_row", "write_plot",
           "DEFAULT_LIMIT", "DIMENSIONS"]

# The largest batch (or sequence length) galloping tries unless told
# otherwise.
DEFAULT_LIMIT = 1 << 20

# What `search` can search: the batch, or the sequence length with the
# batch fixed.
DIMENSIONS = ("batch", "sequence")

# The words each dimension's messages and labels use.
_WORDS = {"batch": "batch size", "sequence": "sequence length"}


@dataclasses.dataclass
class BatchRow:
    """One batch (or sequence length) tried.

    Attributes:
      batch: the batch size.
      peak_without_bytes: simulated device peak of the step without LMS.
      fits_without: that peak is within the budget.
      fits_with: LMS found a plan within the budget (or needs none).
      lms_needed: a plan swaps or orders something.
      peak_with_bytes: simulated peak with the plan (the step's own when
        LMS is not needed; None without a plan).
      floor_bytes, floor_op: the step's floor (`tflms.floor`) and the op
        that sets it.
      step_without_ms, step_with_ms: predicted step (step-time model);
        step_with_ms is None without a plan.
      swapout_bytes, swapin_bytes: bytes the plan moves each way per step.
      error: the tuner's message when no plan fits, else None.
      smallest_peak_bytes: the peak of the smallest plan the tuner found
        when none fits (None otherwise).
      oracle: the oracle's peaks (``tflms plan --oracle``'s), when asked.
      sequence: the sequence length the step was traced with, when the
        search is over the sequence (None when it is over the batch).
    """

    batch: int
    peak_without_bytes: int
    fits_without: bool
    fits_with: bool
    lms_needed: bool
    peak_with_bytes: Optional[int]
    floor_bytes: int
    floor_op: str
    step_without_ms: float
    step_with_ms: Optional[float]
    swapout_bytes: int = 0
    swapin_bytes: int = 0
    error: Optional[str] = None
    smallest_peak_bytes: Optional[int] = None
    oracle: Optional[dict] = None
    sequence: Optional[int] = None
    # The step's device memory per level without LMS: what `search`
    # extrapolates from (not in `as_dict`).
    timeline: object = dataclasses.field(default=None, repr=False,
                                         compare=False)

    @property
    def samples_per_s_without(self):
        """Predicted samples per second without LMS (None: does not fit)."""
        if not self.fits_without or not self.step_without_ms:
            return None
        return self.batch / (self.step_without_ms / 1e3)

    @property
    def samples_per_s_with(self):
        """Predicted samples per second with LMS (None: no plan)."""
        if not self.fits_with or not self.step_with_ms:
            return None
        return self.batch / (self.step_with_ms / 1e3)

    @property
    def overhead_pct(self):
        """The step with LMS over the step without it at this batch, in
        percent (None without a plan)."""
        if self.step_with_ms is None or not self.step_without_ms:
            return None
        return (self.step_with_ms / self.step_without_ms - 1.0) * 100.0

    @property
    def tokens_per_s_without(self):
        """Predicted tokens (batch x sequence length) per second without
        LMS (None: does not fit, or no sequence)."""
        rate = self.samples_per_s_without
        if rate is None or self.sequence is None:
            return None
        return rate * self.sequence

    @property
    def tokens_per_s_with(self):
        """Predicted tokens per second with LMS (None: no plan, or no
        sequence)."""
        rate = self.samples_per_s_with
        if rate is None or self.sequence is None:
            return None
        return rate * self.sequence

    def as_dict(self):
        out = {f.name: getattr(self, f.name)
               for f in dataclasses.fields(self) if f.name != "timeline"}
        out["samples_per_s_without"] = self.samples_per_s_without
        out["samples_per_s_with"] = self.samples_per_s_with
        out["overhead_pct"] = self.overhead_pct
        if self.sequence is None:
            del out["sequence"]  # a batch search's rows, as they were
        else:
            out["tokens_per_s_without"] = self.tokens_per_s_without
            out["tokens_per_s_with"] = self.tokens_per_s_with
        return out


@dataclasses.dataclass
class Capacity:
    """What `search` found.

    Attributes:
      budget_bytes: the device budget.
      largest_without_lms, largest_with_lms: the largest batch (sequence
        length, for a search over the sequence) that fits without LMS, and
        with a plan of LMS (None: not even the first one tried). Also
        ``max_batch_without_lms`` ... or ``max_sequence_without_lms`` ...,
        by the dimension searched, the names of the JSON keys.
      largest_within_overhead: the largest with a plan whose predicted
        step is within `max_overhead_pct` of the step without LMS at the
        same size (None when not asked, or none is).
      max_overhead_pct: the overhead asked for, or None.
      next_without_lms, next_with_lms, next_within_overhead: the size
        tried just above each answer that failed (None: none was, the
        limit was reached).
      limit: the largest size galloping would try.
      rows: every `BatchRow` tried, by size.
      seconds: the search's wall time.
      dimension: what was searched, one of `DIMENSIONS`.
      batch_size: the fixed batch of a search over the sequence (None for
        a search over the batch).
      limit_reason: why `limit` is where it is when the model sets it (a
        position embedding's length), else None (the caller's limit).
      without_offload: for a search with ``offload_optimizer``, the same
        search with the optimizer's state on the device (a `Capacity`,
        set by the caller: ``tflms capacity --offload-optimizer``), so
        that both answers and their predicted steps are reported; else
        None.
    """

    budget_bytes: int
    largest_without_lms: Optional[int]
    largest_with_lms: Optional[int]
    largest_within_overhead: Optional[int]
    max_overhead_pct: Optional[float]
    next_without_lms: Optional[int]
    next_with_lms: Optional[int]
    next_within_overhead: Optional[int]
    limit: int
    rows: list
    seconds: float = 0.0
    dimension: str = "batch"
    batch_size: Optional[int] = None
    limit_reason: Optional[str] = None
    without_offload: Optional["Capacity"] = None

    def _named(self, dimension, which):
        if self.dimension != dimension:
            raise AttributeError(
                "this search was over the %s, not the %s: read "
                "largest_%s (or max_%s_%s)" % (
                    self.dimension, dimension, which, self.dimension,
                    which))
        return getattr(self, "largest_" + which)

    # The JSON keys' names, each for its dimension only.
    max_batch_without_lms = property(lambda c: c._named("batch",
                                                        "without_lms"))
    max_batch_with_lms = property(lambda c: c._named("batch", "with_lms"))
    max_batch_within_overhead = property(lambda c: c._named(
        "batch", "within_overhead"))
    max_sequence_without_lms = property(lambda c: c._named(
        "sequence", "without_lms"))
    max_sequence_with_lms = property(lambda c: c._named("sequence",
                                                        "with_lms"))
    max_sequence_within_overhead = property(lambda c: c._named(
        "sequence", "within_overhead"))

    def size_of(self, row):
        """The size `row` was planned at in the dimension searched."""
        return getattr(row, self.dimension)

    def row(self, size):
        """The `BatchRow` of `size` (KeyError if not tried)."""
        for r in self.rows:
            if self.size_of(r) == size:
                return r
        raise KeyError(size)

    def as_dict(self):
        """The JSON file's content: ``max_<dimension>_without_lms``,
        ``..._with_lms``, ``..._within_overhead``, ``next_*``,
        ``budget_bytes``, ``max_overhead_pct``, ``limit``, ``seconds``,
        ``rows``; a search over the sequence adds ``dimension``,
        ``batch_size`` and ``limit_reason``; a search with
        ``offload_optimizer`` ``without_offload``, the same keys of the
        search without it."""
        out = {}
        for f in dataclasses.fields(self):
            name = f.name
            if name == "rows" or (self.dimension == "batch" and name in (
                    "dimension", "batch_size", "limit_reason")):
                continue
            if name == "without_offload":
                if self.without_offload is not None:
                    out[name] = self.without_offload.as_dict()
                continue
            if name.startswith("largest_"):
                name = "max_%s_%s" % (self.dimension,
                                      name[len("largest_"):])
            out[name] = getattr(self, f.name)
        out["rows"] = [r.as_dict() for r in self.rows]
        return out


def _largest(at, pred, lo, hi):
    """Binary search: the largest batch in [lo, hi) for which `pred` holds,
    knowing it holds at `lo` and fails at `hi`; returns (largest, hi)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(at(mid)):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _bracket(rows, pred):
    """(largest tried batch where `pred` holds, smallest tried batch above
    it where it fails), either None."""
    good = [b for b, r in rows.items() if pred(r)]
    if not good:
        return None, min(rows) if rows else None
    lo = max(good)
    above = [b for b, r in rows.items() if b > lo and not pred(r)]
    return lo, (min(above) if above else None)


def _predicted_without(b1, first, b2, second, budget):
    """The largest batch whose step fits `budget` without LMS if every
    level's bytes grow with the batch as they do from `first` (at batch
    `b1`) to `second` (at `b2`) (they do, for a step whose sizes are
    affine in the batch), or None."""
    t1, t2 = first.timeline, second.timeline
    if t1 is None or t2 is None or len(t1) != len(t2) or not len(t1):
        return None
    if b2 <= b1:
        return None
    best = None
    for v1, v2 in zip(t1.tolist(), t2.tolist()):
        if v2 > v1:
            b = b1 + (budget - v1) * (b2 - b1) // (v2 - v1)
            best = b if best is None else min(best, b)
        elif v2 > budget:
            return None
    return best


def _predicted_floor(b1, first, b2, second, budget):
    """The largest batch whose floor fits `budget` if it grows as it does
    from `first` to `second` (it grows at least that fast: the floor is
    the largest of sums affine in the batch), or None."""
    f1, f2 = first.floor_bytes, second.floor_bytes
    if b2 <= b1 or f2 <= f1:
        return None
    return b1 + (budget - f1) * (b2 - b1) // (f2 - f1)


def _fitted_largest(sizes, series, budget, limit):
    """The largest size in [sizes[-1], limit] at which every series of
    `series` (its values at `sizes`, followed through them by the
    polynomial of degree ``len(sizes) - 1``) is within `budget`, or None
    when one is over it already at ``sizes[-1]``. A prediction to try,
    in floating point: the search checks it by planning there."""
    import numpy as np
    values = np.asarray(series, dtype=np.float64)

    def fits(x):
        total = np.zeros(values.shape[0])
        for j, xj in enumerate(sizes):
            weight = 1.0
            for m, xm in enumerate(sizes):
                if m != j:
                    weight *= (x - xm) / float(xj - xm)
            total += weight * values[:, j]
        return bool((total <= budget).all())

    lo, hi = sizes[-1], limit
    if not fits(lo):
        return None
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _sequence_probes(at, with_lms, start, limit, budget):
    """The first lengths of a search over the sequence: `start` and then
    twice the last (while each has a plan) until three lengths of 2 or
    more are tried (length 1 is degenerate: attention over one key, whose
    ops can differ); from those three, every level's bytes as a
    polynomial of degree two in the length (the step's sizes are:
    attention's scores are length x length), the longest without LMS and
    the one above it, and the longest the floor allows."""
    probes = [start]
    while len([p for p in probes if p >= 2]) < 3 and \
            with_lms(at(probes[-1])) and probes[-1] < limit:
        probes.append(min(2 * probes[-1], limit))
    fitted = [p for p in probes if p >= 2]
    rows = [at(size) for size in fitted]
    if len(fitted) < 3 or any(r.timeline is None for r in rows) or \
            len({len(r.timeline) for r in rows}) != 1:
        return
    guess = _fitted_largest(fitted, list(zip(*[r.timeline.tolist()
                                                for r in rows])),
                            budget, limit)
    if guess is not None and fitted[-1] < guess < limit:
        at(guess)
        at(guess + 1)
    ceiling = _fitted_largest(fitted, [[r.floor_bytes for r in rows]],
                              budget, limit)
    if ceiling is not None and ceiling > fitted[-1]:
        at(ceiling)


def search(plan_at, budget_bytes, max_overhead_pct=None, start=1,
           limit=DEFAULT_LIMIT, progress=None, dimension="batch"):
    """The largest batches (or sequence lengths) that fit, by galloping
    then binary search.

    Args:
      plan_at: ``plan_at(size) -> BatchRow``: the step planned at a batch
        size, or at a sequence length with the batch fixed.
      budget_bytes: the device budget the rows were planned for.
      max_overhead_pct: also find the largest size whose predicted step
        with LMS is within this many percent of the step without LMS.
      start: the first size tried.
      limit: the largest size tried.
      progress: ``progress(text)`` before each size (optional).
      dimension: "batch" or "sequence" (`DIMENSIONS`); the caller of a
        search over the sequence records its fixed batch and the reason
        for its limit in the `Capacity` (``dataclasses.replace``).

    Returns:
      A `Capacity`.

    Raises:
      ValueError: `start`, `limit`, `max_overhead_pct` or `dimension` out
        of range.
    """
    if dimension not in DIMENSIONS:
        raise ValueError("dimension must be one of %s; got %r" % (
            ", ".join(DIMENSIONS), dimension))
    word = _WORDS[dimension]
    if not isinstance(start, int) or start < 1:
        raise ValueError("start must be a positive %s; got %r"
                         % (word, start))
    if not isinstance(limit, int) or limit < start:
        raise ValueError("limit must be a %s of at least start (%d); got %r"
                         % (word, start, limit))
    if max_overhead_pct is not None and not max_overhead_pct >= 0:
        raise ValueError("max_overhead_pct must be a percentage of 0 or "
                         "more; got %r" % (max_overhead_pct,))
    began = time.monotonic()
    rows = {}

    def at(size):
        if size not in rows:
            if progress is not None:
                progress("%s %d ..." % (dimension, size))
            rows[size] = plan_at(size)
        return rows[size]

    def with_lms(row):
        return row.fits_with

    def without_lms(row):
        return row.fits_without

    def within(row):
        return (row.fits_with and row.overhead_pct is not None
                and row.overhead_pct <= max_overhead_pct)

    # Two batches, then a jump to the batches the step's memory predicts:
    # the largest without LMS, checked with the one above it, and the
    # largest the floor allows, where galloping starts. (Three lengths
    # for the sequence: `_sequence_probes`.)
    first = at(start)
    if with_lms(first) and start < limit and dimension == "sequence":
        _sequence_probes(at, with_lms, start, limit, budget_bytes)
    elif with_lms(first) and start < limit:
        size = min(2 * start, limit)
        second = at(size)
        guess = _predicted_without(start, first, size, second, budget_bytes)
        if guess is not None and size < guess < limit:
            at(guess)
            at(guess + 1)
        ceiling = _predicted_floor(start, first, size, second, budget_bytes)
        lo, _ = _bracket(rows, with_lms)
        if ceiling is not None and lo < ceiling:
            at(min(ceiling, limit))

    # Galloping from the largest size with a plan: double until one has
    # none (or the limit), then binary search.
    lo, hi = _bracket(rows, with_lms)
    if lo is not None:
        while hi is None and lo < limit:
            nxt = min(lo * 2, limit)
            if with_lms(at(nxt)):
                lo = nxt
            else:
                hi = nxt
        if hi is not None:
            lo, hi = _largest(at, with_lms, lo, hi)
    best_with, next_with = lo, hi

    answers = []
    preds = [without_lms] + ([within] if max_overhead_pct is not None
                             else [])
    for pred in preds:
        lo, hi = _bracket(rows, pred)
        if lo is not None and hi is not None:
            lo, hi = _largest(at, pred, lo, hi)
        answers.append((lo, hi))
    best_without, next_without = answers[0]
    best_within = next_within = None
    if max_overhead_pct is not None:
        best_within, next_within = answers[1]
    return Capacity(
        budget_bytes=int(budget_bytes),
        largest_without_lms=best_without,
        largest_with_lms=best_with,
        largest_within_overhead=best_within,
        max_overhead_pct=max_overhead_pct,
        next_without_lms=next_without, next_with_lms=next_with,
        next_within_overhead=next_within, limit=limit,
        rows=[rows[b] for b in sorted(rows)],
        seconds=time.monotonic() - began, dimension=dimension)


def plan_row(index, roles, settings, batch, log=None, env=None,
             sequence=None, target=None):
    """The `BatchRow` of `index` planned with `settings` at `batch`: the
    pipeline `LMS.run` runs (`pipeline.plan`), the step-time model
    `tflms plan` reports (`steptime.predict_planned`).

    Args:
      index: the step's `GraphIndex` (the first unknown dimension of its
        shapes is the batch; a traced step's shapes may be static).
      roles: its `OpRoles` (`pipeline.classify`), shared by every batch.
      settings: `Settings` with auto-tuning on; its batch_size is
        replaced by `batch`.
      batch: the batch size.
      log: a `Logger` for the planning lines (default quiet).
      env: the environment the budget reads (default `os.environ`).
      sequence: the sequence length `index` was traced with, for a search
        over the sequence (recorded in the row).
      target: the `target.Target` `roles` were made on (default:
        `Target.of(settings)`); its `offload` (``offload_optimizer``) is
        what `index` is the `offload.planning_index` of, timed in the
        step.
    """
    settings = settings.replace(batch_size=batch)
    if target is None:
        target = Target.of(settings)
    try:
        planned = pipeline.plan(index, settings, roles=roles, log=log,
                                env=env, target=target)
    except autotune.AutotuneError as err:
        offload = target.offload
        without = pipeline.simulate_without(index, roles, settings, offload)
        step = steptime.StepTimeModel(
            index, roles, batch, gpu=settings.gpu,
            interconnect=settings.interconnect, offload=offload).predict()
        lowest = err.floor or floor_mod.floor_of(index, roles, batch)
        budget = autotune.device_budget(settings.autotune_gpu_mem,
                                        settings.gpu_device, env)
        return BatchRow(
            timeline=without.device_timeline,
            batch=batch, peak_without_bytes=int(without.peak_device_bytes),
            fits_without=bool(without.fits(budget)), fits_with=False,
            lms_needed=True, peak_with_bytes=None,
            floor_bytes=lowest.floor_bytes, floor_op=lowest.op_name,
            step_without_ms=step.without_lms_s * 1e3, step_with_ms=None,
            error=str(err), smallest_peak_bytes=err.smallest_peak_bytes,
            sequence=sequence)
    planned = pipeline.simulate_plan(planned)
    budget = planned.budget_bytes
    without = planned.without_lms
    shown = planned.with_lms if planned.plan is not None else without
    step = steptime.predict_planned(planned, gpu=settings.gpu,
                                    interconnect=settings.interconnect)
    lowest = pipeline.step_floor(planned)
    plan = planned.plan
    return BatchRow(
        timeline=without.device_timeline,
        batch=batch, peak_without_bytes=int(without.peak_device_bytes),
        fits_without=bool(without.fits(budget)),
        fits_with=bool(shown.fits(budget)), lms_needed=plan is not None,
        peak_with_bytes=int(shown.peak_device_bytes),
        floor_bytes=lowest.floor_bytes, floor_op=lowest.op_name,
        step_without_ms=step.without_lms_s * 1e3,
        step_with_ms=step.with_lms_s * 1e3,
        swapout_bytes=int(plan.swapout_bytes()) if plan else 0,
        swapin_bytes=int(plan.swapin_bytes()) if plan else 0,
        sequence=sequence)


def write_plot(capacity, path, title=None):
    """`plots.write_capacity_plot`: samples per second against the batch
    (tokens per second against the sequence length), as a PNG at `path`.

    Raises:
      ImportError: without matplotlib (`plots.MISSING_MATPLOTLIB`).
    """
    return plots.write_capacity_plot(capacity, path, title)
