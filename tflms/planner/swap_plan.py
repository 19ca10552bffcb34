"""Which tensors to swap and how: `make_plan` turns `SwapParams` into the
swaps of a `Plan` (candidate tensors, swap-in groups, triggers, waits);
`wait_for_ordering` makes synchronous swap-ins respect ordering edges."""

import bisect
import dataclasses

from tflms import graph_index as gi
from tflms.planner.triggers import TriggerFinder
from tflms.planner.types import Plan, SwapInPlan, SwapPlan


def candidate_edges(index, roles):
    """All (producer, output, consumer, slot, distance) that could be swapped.

    A candidate is a data edge from a source op's output of known rank >= 2
    to a sink op at a strictly higher level, but for an edge into an
    ``IdentityN`` slot whose output nothing in the step reads
    (`GraphIndex.hands_on_unread`): Grappler removes that read, and a
    swap-in rerouted there would never run. Sorted by producer, output,
    consumer level, consumer id, slot, so plans built from it are
    deterministic.
    """
    levels = index.levels
    edges = []
    for p in sorted(roles.sources):
        for out, (shape, itemsize) in enumerate(
                zip(index.output_shapes[p], index.output_itemsizes[p])):
            if shape is None or len(shape) < 2 or itemsize == 0:
                continue
            held = _held_by_views(index, p, out)
            for consumer, slot in index.consumers[p][out]:
                if (consumer not in roles.sinks
                        or index.hands_on_unread(consumer, slot)
                        or levels[consumer] <= held):
                    continue
                distance = levels[consumer] - levels[p]
                if distance > 0:
                    edges.append((p, out, consumer, slot, distance))
    edges.sort(key=lambda e: (e[0], e[1], levels[e[2]], e[2], e[3]))
    return edges


# Views of their input's buffer (a reshape of the logits): while one is
# read, the buffer it views stays on the device.
_VIEWS = gi.BUFFER_FORWARDING_TYPES - {"IdentityN"}


def _held_by_views(index, p, out):
    """The last level at which a view of tensor ``(p, out)`` (a reader
    that hands on its buffer, `_VIEWS`, and views of views) is read: the
    buffer stays on the device until then whatever the plan swaps, so a
    swap-in for a reader at or before it would only add a copy beside it
    (-1 without views). Keras 3's accuracy reads GPT-2's logits beside a
    reshape of them that the loss reads later."""
    levels = index.levels
    views = [c for c, _ in index.consumers[p][out]
             if index.types[c] in _VIEWS]
    # A view of a view is read no later than its own readers.
    return max((levels[c] for view in views
                for c in index.readers_through((view, 0), _VIEWS)),
               default=-1)


def wait_for_ordering(plan, ordering_edges):
    """`plan` with each synchronous swap-in also waiting for the first ops
    of the ordering edges into its consumers.

    A synchronous swap-in starts when its consumer's other inputs are ready
    (sync modes 2 and 3); an ordering edge ``(first, consumer)`` makes
    `first` one more of them, so the copy waits for it too instead of
    occupying the device while the consumer cannot run (in ResNet50's
    projection block, the second branch's swapped-in input would otherwise
    arrive while the first branch's tensors are still live). Only ops that
    precede *every* consumer of the swap-in are added: the path ``first ->
    consumer`` exists already, so no new ordering between graph ops, and no
    cycle, can follow.

    Args:
      plan: a `Plan`.
      ordering_edges: ``(first_id, then_id)`` control edges
        (`stages.order.peaks.order_peaks`).

    Returns:
      The plan, changed only in those swap-ins' triggers.
    """
    preds = {}
    for a, b in ordering_edges:
        preds.setdefault(b, set()).add(a)
    if not preds or not plan.swaps:
        return plan
    swaps, changed = [], False
    for swap in plan.swaps:
        ins, swap_changed = [], False
        for sin in swap.swap_ins:
            if sin.synchronous:
                common = None
                for c, _ in sin.consumers:
                    before = preds.get(c, set())
                    common = before if common is None else common & before
                extra = sorted((common or set()) - set(sin.triggers))
                if extra:
                    sin = dataclasses.replace(
                        sin, triggers=tuple(sin.triggers) + tuple(extra))
                    swap_changed = True
            ins.append(sin)
        if swap_changed:
            swap = dataclasses.replace(swap, swap_ins=tuple(ins))
            changed = True
        swaps.append(swap)
    return dataclasses.replace(plan, swaps=tuple(swaps)) if changed else plan


def _group_consumers(index, consumers, groupby):
    """Split consumers (sorted by level) into runs whose gaps are <=
    groupby."""
    levels = index.levels
    groups = []
    last_level = None
    for c in consumers:
        lvl = levels[c[0]]
        if groups and lvl - last_level <= groupby:
            groups[-1].append(c)
        else:
            groups.append([c])
        last_level = lvl
    return groups


def _sync_inputs(index, roles, consumer):
    """Device inputs of a consumer, which a synchronous swap-in waits on;
    never one TensorFlow may merge with the consumer (the wait would close
    a cycle through the merged node, see `fusions.fusion_partners`)."""
    fused = roles.fused_with.get(consumer, ())
    return tuple(p for p in index.predecessors(consumer)
                 if p in roles.waiters and p not in fused)


def _split_for_trigger(triggers, trigger, group):
    """The leading consumers of `group` that `trigger` may start a swap-in
    for (it reaches each through data edges and merges with none), and the
    rest, which get a swap-in of their own."""
    for k, (c, _) in enumerate(group[1:], 1):
        if not triggers.may_also_start(trigger, c):
            return group[:k], group[k:]
    return group, []


def make_plan(index, roles, params, batch_size=None, edges=None,
              only_tensors=None, triggers=None, deferral=()):
    """Plan swaps for the given parameters.

    Args:
      index: a `GraphIndex` whose levels are the planning levels (after
        serialization, if any).
      roles: `OpRoles` for the same index.
      params: `SwapParams`.
      batch_size: used for the size of each swapped tensor.
      edges: precomputed `candidate_edges(index, roles)` (optional).
      only_tensors: optional set of ``(producer, output)``; when given, only
        these tensors are swapped.
      triggers: a `TriggerFinder` for the same index and roles, to share
        between the plans of one search (default: a new one).
      deferral: `deferral_edges` to carry out with the swaps; the delayed
        ops' outputs are not swapped (they are made just before use).

    Returns:
      A `Plan`.
    """
    if edges is None:
        edges = candidate_edges(index, roles)
    threshold = params.swapout_threshold
    groupby = 0 if params.sync_swapin else params.swapin_groupby

    if triggers is None:
        triggers = TriggerFinder(index, roles)
    deferred = {op for _, op in deferral}
    swaps = []
    unplanned = 0
    # A tensor's swap depends only on its rerouted consumers and on the
    # parameters other than the threshold: the plans of one search share it.
    # Its consumers are sorted by distance, so those past the threshold are
    # the ones from the first such position on, which names them.
    # A groupby no smaller than the widest gap between those consumers puts
    # them all in one group, whatever its value (-1 in the key).
    memo = triggers.swap_memo_for(edges)
    settings = (params.swapin_ahead, params.sync_mode, batch_size)
    for p, out, consumers, distances, widest in triggers.tensor_edges(edges):
        if p in deferred:
            continue
        if only_tensors is not None and (p, out) not in only_tensors:
            continue
        first = bisect.bisect_right(distances, threshold)
        if first == len(distances):
            continue
        key = (p, out, first, groupby if groupby < widest[first] else -1,
               settings)
        known = memo.get(key)
        if known is None:
            known = memo[key] = _plan_swap(index, roles, params, triggers,
                                           batch_size, p, out,
                                           consumers[first:])
        swap, missed = known
        unplanned += missed
        if swap is not None:
            swaps.append(swap)
    return Plan(params=params, swaps=tuple(swaps),
                serialization_edges=tuple(index.planned_edges),
                num_levels=index.num_levels, unplanned_groups=unplanned,
                deferral_edges=tuple(deferral))


def _plan_swap(index, roles, params, triggers, batch_size, p, out,
               consumers):
    """The `SwapPlan` of tensor ``(p, out)`` read by `consumers` far away
    (None if no swap-in can be started in time), and how many swap-in
    groups were left on the device."""
    groupby = 0 if params.sync_swapin else params.swapin_groupby
    unplanned = 0
    swap_ins = []
    pending = _group_consumers(index, consumers, groupby)
    while pending:
        group = pending.pop(0)
        first = group[0][0]
        trigger = None
        if not params.sync_swapin:
            trigger = triggers.find(p, first, params.swapin_ahead)
        if trigger is not None:
            group, rest = _split_for_trigger(triggers, trigger, group)
            if rest:
                pending.insert(0, rest)
            if (swap_ins and not swap_ins[-1].synchronous
                    and swap_ins[-1].triggers == (trigger,)):
                # Two groups that would start at the same moment are one
                # swap-in (Grappler would merge the twins anyway).
                merged = swap_ins[-1].consumers + tuple(group)
                swap_ins[-1] = SwapInPlan(merged, (trigger,), False)
            else:
                swap_ins.append(SwapInPlan(tuple(group), (trigger,),
                                           False))
            continue
        inputs = _sync_inputs(index, roles, first)
        inputs = tuple(i for i in inputs
                   if index.levels[i] > index.levels[p])
        if inputs:
            swap_ins.append(SwapInPlan(tuple(group), inputs, True))
        else:
            # Nothing can hold the swap-in back: it would run right after
            # the swap-out and keep the tensor on the device, so moving
            # it would only cost transfers.
            unplanned += 1
    if not swap_ins:
        return None, unplanned
    waiters = ()
    if params.sync_swapout:
        rerouted = {c for s in swap_ins for c, _ in s.consumers}
        remaining = set(index.fanouts[p]) | set(index.control_outputs[p])
        fused = roles.fused_with.get(p, ())
        waiters = tuple(sorted(c for c in remaining - rerouted
                               if c in roles.waiters and c not in fused))
    return SwapPlan(
        producer=p, output=out,
        nbytes=gi.tensor_bytes(index, p, out, batch_size),
        swap_ins=tuple(swap_ins), waiters=waiters), unplanned
