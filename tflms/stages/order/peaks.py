"""Ordering edges: run one op of a crowded level before another.

Kahn levels say which ops *may* run together, not in which order the
executor runs them. When a level holds an op that frees a large buffer (the
last reader of a swapped-in copy, say) and another that allocates one (a
convolution's input gradient), the step's peak depends on which goes
first, and TensorFlow does not promise either. Near the largest size a GPU
can train, that choice decides whether the step fits: in a 3D U-Net's last
decoder level the filter gradient reads the swapped-in concat while the
input gradient writes a tensor as large as it; in a ResNet's first
projection block the two branches' batch-norm gradients each hold a
swapped-in input and a new output at once.

`order_peaks` lowers a plan's peak greedily, one control edge
``(first, then)`` per round, each candidate judged by a full replay. A
candidate is either a large reader at the peak level (or a few levels
after it) before a large allocator at the peak level, or, for a tensor
made before the peak and read only after it, an edge from an op just
before its first reader to its producer (what deferral does for fills,
for any op). An edge is refused when the second op reaches the first
(`_closes_cycle`). The edges found for one plan are added to the planning
index (`graph_index.with_planned_edges`, like serialization), so every
plan the tuner makes afterwards keeps them and chooses its triggers around
them.

A control edge changes when an op runs, never what it computes. It is
only placed between ops that may carry one (`OpRoles.triggers` as the
first, `OpRoles.waiters` as the second: active device ops outside
conditionals and loops) on the same device. TensorFlow may merge some ops
with a partner at run time (`OpRoles.fused_with`); the merged node takes
over the edge, so an edge is refused when the second op or its partners
reach the first op or its partners through the graph and the edges found
so far (`_closes_cycle`).

Pure: reads the index and replays plans through a `SimulationModel`.
"""

import dataclasses

import numpy as np

from tflms import analysis
from tflms import graph_index as gi
from tflms import planner
from tflms import dag_levels
from tflms.stages import timed

__all__ = ["order_peaks", "OrderingResult"]

_PAIRS_PER_ROUND = 12

# An op takes part only if it allocates (second op) or reads (first op) at
# least this share of the peak: small ops do not move a peak, and leaving
# them out keeps a round to a few replays.
_MIN_SHARE = 1.0 / 64

# Early tensors are counted down to a smaller share: several of a few
# percent each (a U-Net's loss gradients at full resolution) add up.
_MIN_EARLY_SHARE = 1.0 / 256

# How many levels after the peak a first op may be: the last reader of a
# buffer live at the peak often waits a level or two for a swap-in.
_READER_WINDOW = 3


@dataclasses.dataclass(frozen=True)
class OrderingResult:
    """What `order_peaks` found.

    Attributes:
      edges: ``(first_id, then_id)`` control edges, in the order found.
      result: the `SimulationResult` of the plan with them (detail=False).
      peak_before: the plan's peak without them.
      replays: replays spent.
    """

    edges: tuple
    result: object
    peak_before: int
    replays: int


def _excess(result, budget):
    """Bytes over the budget summed over the levels: lowers when a crowded
    level is relieved even if another level has the same peak."""
    over = result.device_timeline - budget
    return int(over[over > 0].sum())


def _eligible(index, roles, op):
    return (op in roles.triggers or op in roles.waiters) and \
        not index.in_v1_loop[op]


def _planned_preds(index):
    """op -> the ops its planned edges (serialization, ordering) wait on."""
    preds = {}
    for a, b in index.planned_edges:
        preds.setdefault(b, []).append(a)
    return preds


def _closes_cycle(ordered, roles, first, then, preds=None):
    """True if the edge ``first -> then`` would close a cycle in the graph
    with the edges found so far (`ordered`: the index with them planned;
    `preds`: its `_planned_preds`, made here when not given), counting the
    merges TensorFlow may make: the merged node of `first` takes over the
    edge, so a path from `then` (or a partner of it) to `first` (or a
    partner of it) would be a cycle."""
    group_first = {first} | set(roles.fused_with.get(first, ()))
    group_then = {then} | set(roles.fused_with.get(then, ()))
    if group_first & group_then:
        return True
    extra = _planned_preds(ordered) if preds is None else preds
    lowest = min(ordered.levels[v] for v in group_then)
    for v in group_first:
        if ordered.levels[v] > lowest and analysis.ancestors_within(
                ordered, v, lowest, extra_preds=extra) & group_then:
            return True
    return False


def _sizes(model, index, op):
    """(bytes the op allocates, bytes of device buffers it reads)."""
    allocated = 0
    for k in range(len(index.output_shapes[op])):
        b = model.buffer_of(op, k)
        if b >= 0 and int(model.buf_alloc[b]) == op:
            allocated += model.tensor_size(op, k)
    read = 0
    for p, k in index.inputs[op]:
        if model.buffer_of(p, k) >= 0:
            read += model.tensor_size(p, k)
    return allocated, read


def _candidate_pairs(model, index, roles, result):
    """Edges worth a replay at the plan's peak level L: a large reader at
    L or shortly after (its reads may be the last of a buffer live at the
    peak) before a large allocator at L, largest first."""
    levels = result.levels[:index.num_ops]
    peak = result.peak_level
    floor = max(1, int(result.peak_device_bytes * _MIN_SHARE))
    window = np.flatnonzero((levels >= peak)
                            & (levels <= peak + _READER_WINDOW))
    readers, allocators = [], []
    for op in window.tolist():
        if not _eligible(index, roles, op):
            continue
        allocated, read = _sizes(model, index, op)
        if read >= floor and op in roles.triggers:
            readers.append((levels[op], -read, op))
        if (allocated >= floor and op in roles.waiters
                and levels[op] == peak):
            allocators.append((-allocated, op))
    readers.sort()
    allocators.sort()
    pairs = []
    for _, b in allocators:
        for _, _, a in readers:
            if a != b and analysis.same_device(index.devices[a],
                                               index.devices[b]):
                pairs.append((a, b))
    return pairs[:_PAIRS_PER_ROUND]


# Ops that pass a tensor on without computing: `tf.gradients` wraps every
# gradient in ``tuple/control_dependency`` identities and a ``group_deps``
# no-op, which read it right away; the tensor is needed by what reads them.
_PASSING_TYPES = gi.GRAPPLER_IDENTITY_TYPES | {"NoOp", "IdentityN"}


def _real_readers(index, op):
    """The ops that read `op`'s outputs, through `_PASSING_TYPES`."""
    readers, stack, seen = [], list(index.successors(op)), set()
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        if index.types[c] in _PASSING_TYPES:
            stack.extend(index.successors(c))
        else:
            readers.append(c)
    return readers


def _early_pairs(model, ordered, roles, result):
    """Edges that delay an op made long before the peak and read only after
    it (a loss gradient that needs nothing but the labels and shapes, made
    during the forward pass): from an op just before its first reader
    (`planner.find_trigger` with ``swapin_ahead`` 1, on the index with the
    edges found so far), largest first."""
    index = ordered
    levels = result.levels[:index.num_ops]
    peak = result.peak_level
    floor = max(1, int(result.peak_device_bytes * _MIN_EARLY_SHARE))
    early = []
    for op in np.flatnonzero(levels < peak).tolist():
        if (op not in roles.waiters or index.in_v1_loop[op]
                or index.is_stateful[op]):
            continue
        allocated, _ = _sizes(model, index, op)
        if allocated < floor:
            continue
        readers = _real_readers(index, op)
        if not readers or min(levels[c] for c in readers) <= peak:
            continue
        early.append((-allocated, op,
                      min(readers, key=lambda c: (index.levels[c], c))))
    early.sort()
    pairs = []
    for _, op, first in early[:_PAIRS_PER_ROUND]:
        trigger = planner.find_trigger(index, roles, op, first, 1)
        if trigger is not None:
            pairs.append((trigger, op))
    return pairs


def order_peaks(model, plan, budget, max_replays=timed.MAX_REPLAYS,
                target=None, overflow_from=None):
    """Greedy control edges that lower `plan`'s peak toward `target`.

    Args:
      model: the `simulator.SimulationModel` of the planning index (its
        index and roles are used).
      plan: a `planner.Plan` of that index.
      budget: device bytes; overflow above it breaks ties between edges
        that leave the peak where it is.
      max_replays: replays to spend at most.
      target: stop once the peak is at most this many bytes (default: the
        budget).
      overflow_from: bytes above which the levels' overflow breaks ties
        (default: the budget). The planning stages pass the step's floor
        (`tflms.floor`), which does not depend on the budget: the edges
        are then the same at every budget, a larger budget stopping at a
        prefix of them, so a plan found at one budget is found at every
        larger one.

    Returns:
      An `OrderingResult` (edges empty when no edge lowered the peak).
    """
    index, roles = model.index, model.roles
    target = budget if target is None else target
    result = model.replay(plan, detail=False)
    before = result.peak_device_bytes
    edges = []
    ordered = index
    preds = _planned_preds(ordered)
    spent = 1
    tried = set()
    overflow_from = budget if overflow_from is None else overflow_from
    key = (result.peak_device_bytes, _excess(result, overflow_from))
    while result.peak_device_bytes > target and spent < max_replays:
        best = None
        for pair in (_candidate_pairs(model, index, roles, result)
                     + _early_pairs(model, ordered, roles, result)):
            if pair in tried or spent >= max_replays:
                continue
            tried.add(pair)
            if _closes_cycle(ordered, roles, *pair, preds=preds):
                continue
            trial = planner.wait_for_ordering(dataclasses.replace(
                plan, serialization_edges=plan.serialization_edges
                + tuple(edges) + (pair,)), tuple(edges) + (pair,))
            spent += 1
            try:
                r = model.replay(trial, detail=False)
            except dag_levels.GraphCycleError:
                # A path through the plan's own edges (a sync mode's
                # waits) that the index does not hold.
                continue
            k = (r.peak_device_bytes, _excess(r, overflow_from))
            if k < key and (best is None or k < best[0]):
                best = (k, pair, r)
        if best is None:
            break
        key, pair, result = best
        edges.append(pair)
        ordered = gi.with_planned_edges(ordered, (pair,))
        preds.setdefault(pair[1], []).append(pair[0])
    return OrderingResult(edges=tuple(edges), result=result,
                          peak_before=before, replays=spent)
