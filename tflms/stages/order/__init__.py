"""Ordering: control edges between the ops at the memory peaks, then the
search again.

Two cases, both only with `Settings.order_peaks` and auto-tuning:

* the search found nothing that fits (`Planned.failure`): the most
  aggressive plans the settings allow are replayed and the ops of their
  crowded levels ordered (`peaks.order_peaks`) until the peak comes
  under the budget or the replays run out; the search runs again on the
  index with each set of edges, in rounds that order further what the last
  round could not fit. The first round tries two orderings of known
  shapes before those: the broadcast terms of each sum one after the other
  (`broadcast`), then those with the optimizer's per-variable updates
  one after the other (`updates`), then those with the chains that
  reduce a large tensor run before its other reader makes a large output
  (`reductions`). Between edges that leave the peak
  where it is, the one that lowers the memory above the step's floor
  (`tflms.floor`) most is taken, whatever the budget: a larger budget stops
  at a prefix of the edges a smaller one finds, and never loses a plan the
  smaller one had;
* the plan it found needs synchronous swap-ins (`sync_mode` 2 or 3), so
  memory, not the link, decides its step: ordering as far as it goes leaves
  room for earlier, asynchronous swap-ins, and the plan of the search on
  the ordered index is kept when its predicted step is shorter.
"""

from tflms import autotune
from tflms import floor
from tflms import graph_index as gi
from tflms import planner
from tflms._logging import Logger
from tflms.settings import AUTO
from tflms.stages import timed
from tflms.stages import tuning
from tflms.stages.order import broadcast
from tflms.stages.order import peaks
from tflms.planner import reductions
from tflms.stages.order import updates
from tflms.stages.records import Ordered

__all__ = ["stage", "peak_orderings", "ROUNDS"]

_GIB = float(1 << 30)

# Rounds of ordering and searching again when nothing fits: each round
# orders the peak of the plan the last search could not fit.
ROUNDS = 3


def stage(context, planned):
    """`planned` with ordering edges where they make a plan fit or faster.

    Raises:
      autotune.AutotuneError: the last search's, when no round fits.
    """
    if not (context.settings.autotune_requested
            and context.settings.order_peaks):
        return planned
    if planned.failure is not None:
        return _fit_by_ordering(context, planned)
    return _faster_ordered(context, planned)


def _with_ordering(context, index, edges):
    """The planning index with ordering `edges` planned, and its deferral
    edges (the delayed fills' triggers follow the new levels)."""
    ordered = gi.with_planned_edges(index, edges)
    return ordered, planner.deferral_edges(ordered, context.roles)


def _ordered(context, planned, outcome, index, deferral, edges):
    """`planned` with the tuner's `outcome` on the ordered `index`, its
    `deferral` edges and the ordering `edges`."""
    recorded = planned.with_record(Ordered(tuple(edges), tuple(deferral)))
    return tuning.with_outcome(context, recorded, outcome, index)


def _fit_by_ordering(context, planned):
    error = planned.failure
    index, deferral = planned.index, planned.deferral_edges
    found = ()
    for round_ in range(ROUNDS):
        candidates = peak_orderings(context, index, deferral, found=found)
        if round_ == 0:
            candidates = _known_orderings_first(context, index,
                                                candidates)
        if not candidates:
            break
        lowest = None
        for edges in candidates:
            ordered, ordered_deferral = _with_ordering(context, index, edges)
            lowest = lowest or (ordered, ordered_deferral)
            context.log.info("[Simulator] Searching again with %d ordering "
                             "edges" % len(found + edges))
            try:
                outcome = tuning.tune(context, ordered, ordered_deferral,
                                     found + edges)
            except autotune.AutotuneError as err:
                error = _closest(error, err)
                continue
            return _ordered(context, planned, outcome, ordered,
                            ordered_deferral, found + edges)
        # Nothing fitted with any of them: order the lowest peak further.
        found += candidates[0]
        index, deferral = lowest
    raise error


def _known_orderings_first(context, index, candidates):
    """`candidates` with two known orderings tried first, when the graph
    has them: the edges that make the broadcast terms of each sum one after
    the other (`broadcast.sum_edges`: Keras 3's unfused batch-norm
    gradients), then those together with the edges that apply the
    optimizer's updates one variable after another
    (`updates.chain_edges`: Keras 3's optimizers update every variable
    at the end of the step)."""
    known = []
    sum_terms = broadcast.sum_edges(index, context.roles,
                                    context.batch_size)
    if sum_terms:
        known.append(sum_terms)
        context.log.info(
            "[Simulator] Nothing fits in %.2f GiB; trying first %d edges "
            "that make the broadcast terms of sums (unfused batch-norm "
            "gradients) one after the other" % (
                context.budget_bytes / _GIB, len(sum_terms)), 1)
    # Found on the index with the broadcast edges, so that together they
    # close no cycle.
    update_chains = updates.chain_edges(
        gi.with_planned_edges(index, sum_terms) if sum_terms else index,
        context.roles, context.target.onednn_cpu)
    if update_chains:
        known.append(sum_terms + update_chains)
        context.log.info(
            "[Simulator] Nothing fits in %.2f GiB; trying %s%d edges that "
            "apply the optimizer's updates one variable after another" % (
                context.budget_bytes / _GIB, "those and " if sum_terms
                else "first ", len(update_chains)), 1)
    # Last of the known ones (a step where those fit keeps its plan).
    base = known[-1] if known else ()
    reductions_first = reductions.reduction_edges(
        gi.with_planned_edges(index, base) if base else index,
        context.roles, context.batch_size)
    if reductions_first:
        known.append(base + reductions_first)
        context.log.info(
            "[Simulator] Nothing fits in %.2f GiB; trying %s%d edges that "
            "run the chains reducing a large tensor (a metric of the "
            "logits) before its other reader makes a large output" % (
                context.budget_bytes / _GIB, "those and " if base
                else "first ", len(reductions_first)), 1)
    return known + [c for c in candidates if c not in known]


def _closest(error, other):
    """Of two failed searches, the one whose smallest plan came closest to
    the budget: the error names that plan, the one worth telling the user
    about (the last round's may be further away)."""
    mine, theirs = error.smallest_peak_bytes, other.smallest_peak_bytes
    if theirs is not None and (mine is None or theirs < mine):
        return other
    return error


def _faster_ordered(context, planned):
    outcome = planned.tune
    if (outcome is None or outcome.params is None
            or outcome.params.sync_mode < 2 or outcome.step_time is None):
        return planned
    candidates = peak_orderings(context, planned.index,
                                planned.deferral_edges, target=0)
    if not candidates:
        return planned
    edges = candidates[0]
    ordered, ordered_deferral = _with_ordering(context, planned.index, edges)
    try:
        other = tuning.tune(context, ordered, ordered_deferral, edges,
                           log=Logger())
    except autotune.AutotuneError:
        return planned
    before = outcome.step_time.with_lms_s
    after = (other.step_time.with_lms_s if other.step_time is not None
             else float("inf"))
    keep = other.params is not None and after < before
    context.log.info(
        "[Simulator] The plan needs synchronous swap-ins (sync_mode %d); "
        "with %d ordering edges the search finds sync_mode %s, predicted "
        "step %.1f ms instead of %.1f ms: %s" % (
            outcome.params.sync_mode, len(edges),
            other.params.sync_mode if other.params else "-",
            after * 1e3, before * 1e3,
            "keeping the ordered plan" if keep else
            "keeping the plan without them"))
    if not keep:
        return planned
    return _ordered(context, planned, other, ordered, ordered_deferral,
                    edges)


def peak_orderings(context, index, deferral, target=None, found=()):
    """Ordering edges for the most aggressive plans the settings allow
    (every parameter on auto at its smallest), one set per sync mode from
    the requested one up, each lowering that plan's peak to `target` bytes
    (default: the budget) or as far as the replays go. `found`: ordering
    edges already in the index (earlier rounds).

    Returns:
      The distinct non-empty edge tuples, lowest ordered peak first (then
      the higher sync mode: its plans also fit when copies take time).
      Different sync modes may order the same level in opposite ways, so
      the sets are tried one at a time, never merged.
    """
    budget = context.budget_bytes
    model = context.model(index)
    # Ties broken by the memory above the step's floor, not above the
    # budget: the edges found then do not depend on the budget, and a
    # larger budget stops at a prefix of them (answers that hold: a plan
    # found at one budget is found at every larger one).
    overflow_from = floor.step_floor(
        context.model(context.given_index)).floor_bytes
    requested = context.requested

    def given(value, smallest):
        return smallest if value == AUTO else value

    results = []
    for sync in range(requested.sync_mode, 4):
        params = planner.SwapParams(
            given(requested.swapout_threshold, 1),
            given(requested.swapin_ahead, 1),
            given(requested.swapin_groupby, 0), sync)
        plan = planner.wait_for_ordering(
            planner.make_plan(index, context.roles, params,
                              batch_size=context.batch_size,
                              deferral=deferral), found)
        result = peaks.order_peaks(
            model, plan, budget, target=target,
            max_replays=timed.replays_for(index.num_ops),
            overflow_from=overflow_from)
        if result.edges:
            results.append((result.result.peak_device_bytes, -sync, result,
                            params))
    results.sort(key=lambda r: (r[0], r[1]))
    orderings, seen = [], set()
    for _, _, result, params in results:
        if result.edges in seen:
            continue
        seen.add(result.edges)
        orderings.append(result.edges)
        context.log.info(
            "[Simulator] %s; ordering %d pairs of operations at the memory "
            "peaks lowers the plan with %s from %.2f to %.2f GiB (%s)" % (
                ("Nothing fits in %.2f GiB" % (budget / _GIB)
                 if target is None else "Ordering the memory peaks"),
                len(result.edges), params.describe(),
                result.peak_before / _GIB,
                result.result.peak_device_bytes / _GIB,
                "; ".join("%s before %s" % (index.names[a], index.names[b])
                          for a, b in result.edges[:3])
                + (" ..." if len(result.edges) > 3 else "")), 1)
    return orderings
