"""Recompute: a swapped tensor made again by cloning the cheap ops that made
it, just before its late readers (`Recomputer`: `plan`, `with_recomputes`,
`with_shared_clones`)."""

import dataclasses

from tflms import graph_index as gi
from tflms.planner.triggers import TriggerFinder
from tflms.planner.types import RecomputePlan, SwapInPlan


# Ops a recompute may clone: deterministic, stateless kernels that cost
# little next to a transfer of their output, and whose value depends on
# their data inputs alone (the clone computes the same kernel on the same
# inputs, so the value is bit-identical). Fused batch norm qualifies in
# training mode only: it normalises with the statistics of its own input
# then, and the clone's moving-statistics outputs are never read (the
# update ops keep reading the original's).
RECOMPUTABLE_TYPES = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "LeakyRelu",
    "BiasAdd", "Add", "AddV2", "Sub", "Mul",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3",
    "ConcatV2", "MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D",
    "Reshape", "Cast", "Identity", "Pad",
})
# Ops a recompute may also clone when each recompute is judged by predicted
# step time (auto-tuning): deterministic like the ones above, but their cost
# is in FLOPs, so a clone pays only where the copies it saves are exposed
# and take longer than it does. On the GPU a clone runs with the original's
# shapes and attributes, so TensorFlow's autotuner picks the same
# convolution algorithm for both; cuDNN's forward algorithms are
# deterministic (its nondeterminism is in the backward passes' atomics).
# Transposed convolutions (`Conv2DBackpropInput`...) are left out for that
# reason: their kernel is a backward-data pass.
TIMED_RECOMPUTABLE_TYPES = RECOMPUTABLE_TYPES | frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2",
})
_BATCH_NORM_TYPES = frozenset({
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})

# At most this many ops are cloned to recompute one tensor: a longer chain
# costs compute time and holds more intermediate buffers.
MAX_RECOMPUTE_OPS = 4
# The same limit where each recompute is judged by predicted step time (a
# chain is taken only where it shortens the step): long enough for a
# residual block's output, made again from the block's input and its last
# convolution's input (convolution, bias, batch norm, the shortcut's add,
# ReLU, with the shortcut's batch norm where it has one).
MAX_TIMED_RECOMPUTE_OPS = 6

# Tensors on the device for the whole step: constants, and snapshots of
# resource variables (a later update of the variable copies on write, so
# the snapshot a clone reads is the one the original read). Reads of v1
# reference variables are not: an op reading the variable later could see
# an updated value.
_RESIDENT_INPUT_TYPES = frozenset({"Const", "ReadVariableOp"})


def _may_clone(index, roles, op, clone_types=RECOMPUTABLE_TYPES):
    """True if a recompute may clone `op`: a deterministic op of
    `clone_types` on the managed device, active, outside control-flow
    frames and collectives."""
    t = index.types[op]
    return (t in clone_types
            and op in roles.device_ops and op not in roles.inactive
            and not index.is_stateful[op]
            and not index.in_v1_cond[op] and not index.in_v1_loop[op]
            and not index.calls_collective[op]
            and (t not in _BATCH_NORM_TYPES
                 or index.bn_is_training[op] is True))


def _rerouted_edges(plan_swaps, plan_recomputes):
    """``(consumer, slot)`` edges a plan reroutes away from the original
    tensors (to swap-ins or clones)."""
    edges = set()
    for swap in plan_swaps:
        for sin in swap.swap_ins:
            edges.update(sin.consumers)
    for rec in plan_recomputes:
        edges.update(rec.consumers)
    return edges


def _input_source(index, roles, tensor, level, rerouted, swaps_by_tensor):
    """Where a clone running just before `level` reads `tensor` without
    cloning its producer: ``('tensor', op, output)`` when the original is on
    the device until then (resident, or read by an op at `level` or later
    that the plan does not reroute), ``('swapin', op, output, j)`` when a
    swap-in of it started before `level` and is read at or after it, or
    ``('later', op, output, j)`` when the first swap-in read at or after
    `level` starts too late (it can be started earlier), else None."""
    q, k = tensor
    if index.types[q] in _RESIDENT_INPUT_TYPES and q not in roles.inactive:
        return ("tensor", q, k)
    if (q not in roles.device_ops or q in roles.inactive
            or index.is_stateful[q] or index.in_v1_cond[q]
            or index.in_v1_loop[q]):
        return None
    levels = index.levels
    for c, slot in index.consumers[q][k]:
        if levels[c] >= level and (c, slot) not in rerouted:
            return ("tensor", q, k)
    swap = swaps_by_tensor.get(tensor)
    if swap is not None:
        for j, sin in enumerate(swap.swap_ins):
            started = max(levels[t] for t in sin.triggers)
            last = max(levels[c] for c, _ in sin.consumers)
            if started + 1 < level <= last:
                return ("swapin", q, k, j)
        for j, sin in enumerate(swap.swap_ins):
            if min(levels[c] for c, _ in sin.consumers) >= level:
                return ("later", q, k, j)
    return None


def _shared_clones(index, recomputes, level):
    """``{op: (recompute, n)}``: the ops the plan's `recomputes` clone whose
    clones a recompute first read at `level` may read: the n-th clone of
    `recompute`, of those whose first late reader runs at or before
    `level`, the latest such (its clone is kept the shortest time).

    Such a recompute's clones, and everything they wait on (its trigger,
    the swap-ins it reads), run before its first late reader, so at levels
    below `level`: no reader at `level` or later leads to them, and reading
    one of its clones adds no cycle."""
    levels = index.levels
    shared = {}
    for rec in recomputes:
        first = min(levels[c] for c, _ in rec.consumers)
        if first > level:
            continue
        for n, op in enumerate(rec.ops):
            known = shared.get(op)
            if known is None or first > known[0]:
                shared[op] = (first, rec, n)
    return {op: (rec, n) for op, (_, rec, n) in shared.items()}


def retrigger_swaps(swaps, recompute):
    """`swaps` with the swap-ins `recompute` needs earlier
    (`RecomputePlan.earlier_swap_ins`) started by its trigger."""
    if not recompute.earlier_swap_ins:
        return tuple(swaps)
    wanted = {}
    for q, k, j in recompute.earlier_swap_ins:
        wanted.setdefault((q, k), set()).add(j)
    out = []
    for swap in swaps:
        js = wanted.get((swap.producer, swap.output))
        if js:
            swap = dataclasses.replace(swap, swap_ins=tuple(
                SwapInPlan(sin.consumers, (recompute.trigger,), False)
                if j in js else sin
                for j, sin in enumerate(swap.swap_ins)))
        out.append(swap)
    return tuple(out)


def _swapin_readers(recomputes):
    """``{tensor: [recomputes reading a swap-in of it]}``."""
    readers = {}
    for rec in recomputes:
        for src in rec.sources("swapin"):
            got = readers.setdefault(src[1:3], [])
            if rec not in got:
                got.append(rec)
    return readers


def _held(recomputes):
    """Tensors the plan recomputes, or whose originals recomputes read."""
    held = set()
    for rec in recomputes:
        held.add((rec.producer, rec.output))
        held.update(src[1:3] for src in rec.sources("tensor"))
    return held


class Recomputer:
    """Plans recomputes on one index: `plan` makes one tensor again for its
    late readers, `with_recomputes` and `with_shared_clones` replace a
    plan's swaps and recomputes by cheaper ones where a callback agrees.

    The rules of what may be cloned travel with the object, the same for
    every recompute of a search.

    Args:
      index: a `GraphIndex` with the planning levels.
      roles: its `OpRoles`.
      batch_size: for tensor sizes.
      triggers: a `TriggerFinder` for the same index and roles, shared
        with the search's swaps (default: a new one).
      clone_types: the op types that may be cloned: `RECOMPUTABLE_TYPES`
        (cheap ops), or `TIMED_RECOMPUTABLE_TYPES` (convolutions and matrix
        products too) where a step-time model judges each recompute.
      max_ops: the most ops cloned for one tensor (`MAX_RECOMPUTE_OPS`, or
        `MAX_TIMED_RECOMPUTE_OPS` where each recompute is timed).
    """

    def __init__(self, index, roles, batch_size=None, triggers=None,
                 clone_types=RECOMPUTABLE_TYPES, max_ops=MAX_RECOMPUTE_OPS):
        self.index = index
        self.roles = roles
        self.batch_size = batch_size
        self.triggers = (TriggerFinder(index, roles) if triggers is None
                         else triggers)
        self.clone_types = clone_types
        self.max_ops = max_ops

    def plan(self, producer, output, consumers, swaps=(), recomputes=(),
             shared_from=None, rerouted=()):
        """The cheapest way to make tensor ``(producer, output)`` again for its
        late readers `consumers`, or None.

        Walks back from the producer over data inputs: an input that is on the
        device when the first late reader runs (see `_input_source`) is read
        as it is, and so is one whose producer another of the plan's
        recomputes clones before then (`_shared_clones`: that clone is kept
        for this one); any other input's producer must be cloned too (it must
        be of `clone_types`, see `_may_clone`), up to `max_ops` ops. Cloning
        exactly the producers of the inputs that are not available is the
        smallest set that can work. The clones wait on a trigger found
        as a swap-in's is, `len(ops)` levels ahead of the first late reader, so
        they run just before it and not as soon as their inputs exist.

        Args:
          producer, output: the tensor.
          consumers: ``(op_id, input_slot)`` pairs of its late readers.
          swaps, recomputes: the plan's other `SwapPlan`s and `RecomputePlan`s
            (their rerouted readers do not keep a tensor on the device; their
            swap-ins may be read).
          shared_from: the recomputes whose clones may be read (each must come
            before this one in the plan's `recomputes`); default: those of
            `recomputes`, which the plan holds before this one.
          rerouted: more ``(consumer, slot)`` edges the plan reroutes (the late
            readers of a tensor about to be recomputed as well).

        Returns:
          A `RecomputePlan`, or None.
        """
        index, roles = self.index, self.roles
        if not consumers or not _may_clone(index, roles, producer,
                                           self.clone_types):
            return None
        levels = index.levels
        consumers = tuple(sorted(consumers, key=lambda c: (levels[c[0]], c)))
        level = levels[consumers[0][0]]
        rerouted = (_rerouted_edges(swaps, recomputes) | set(consumers)
                    | set(rerouted))
        swaps_by_tensor = {(s.producer, s.output): s for s in swaps}
        recomputed = {(r.producer, r.output) for r in recomputes}
        shared = _shared_clones(
            index, recomputes if shared_from is None else shared_from, level)
        cloned = {producer}
        sources = {}
        stack = [producer]
        while stack:
            op = stack.pop()
            for tensor in index.inputs[op]:
                if tensor[0] in cloned or tensor in sources:
                    continue
                source = None
                if tensor not in recomputed:
                    source = _input_source(index, roles, tensor, level,
                                           rerouted, swaps_by_tensor)
                if (source is None or source[0] == "later") and (
                        tensor[0] in shared):
                    # Another recompute clones this op before: its clone is
                    # read (kept until then) instead of cloned again, and
                    # instead of a swap-in started earlier for it.
                    rec, n = shared[tensor[0]]
                    source = ("recompute", rec.producer, rec.output, n,
                              tensor[1])
                if source is not None:
                    sources[tensor] = source
                    continue
                q = tensor[0]
                if len(cloned) >= self.max_ops or not _may_clone(
                        index, roles, q, self.clone_types):
                    return None
                cloned.add(q)
                stack.append(q)
        ops = tuple(sorted(cloned, key=lambda o: (levels[o], o)))
        position = {op: n for n, op in enumerate(ops)}
        earlier = tuple(sorted(
            src[1:] for src in sources.values() if src[0] == "later"))
        for key, src in sources.items():
            if src[0] == "later":
                sources[key] = ("swapin",) + src[1:]
        inputs = tuple(
            tuple(("clone", position[q], k) if q in position
                  else sources[(q, k)] for q, k in index.inputs[op])
            for op in ops)
        triggers = self.triggers
        # A swap-in started at the trigger runs one level before the clones.
        trigger = triggers.find(producer, consumers[0][0],
                                len(ops) + (1 if earlier else 0))
        if trigger is None:
            return None
        for q, k, j in earlier:
            sin = swaps_by_tensor[(q, k)].swap_ins[j]
            # The trigger must lead to the swap-in's own readers through data
            # edges, as any swap-in trigger does (`find_trigger` says why).
            if not all(triggers.may_also_start(trigger, c)
                       for c, _ in sin.consumers):
                return None
        return RecomputePlan(
            producer=producer, output=output,
            nbytes=gi.tensor_bytes(index, producer, output, self.batch_size),
            ops=ops, inputs=inputs, consumers=consumers, trigger=trigger,
            earlier_swap_ins=earlier)

    def with_recomputes(self, plan, accept, latest_first=False, unpin=False):
        """`plan` with swaps replaced by recomputes where `accept` agrees.

        Each swapped tensor, most bytes moved first, is tried: its swap-ins'
        readers become a `plan` candidate, and the plan without that
        swap and with the recompute is offered to ``accept(candidate,
        current)``, which returns True to keep it (e.g. a replay that still
        fits the budget and a cost function that prefers it). Swaps whose
        swap-ins or tensors an accepted recompute reads are kept, so the order
        matters: of tensors moving as many bytes, the one whose producer was
        added to the graph first is tried first, or the one made last in the
        step with `latest_first`.

        Args:
          plan: a `Plan`.
          accept: callable ``(candidate Plan, current Plan) -> bool``.
          latest_first: of swaps moving as many bytes, try the one whose
            tensor is made latest first.
          unpin: a swap kept only because recomputes read its swap-ins is
            tried too: those recomputes are planned again without it (cloning
            what made the tensor, or reading another's clones), and the
            tensor recomputed after them, all in one candidate.

        Returns:
          A `Plan` (the same object when nothing was replaced).
        """
        levels = self.index.levels
        order = sorted(plan.swaps, key=lambda s: (
            -(s.nbytes or 0) * (1 + len(s.swap_ins)),
            -levels[s.producer] if latest_first else 0, s.producer, s.output))
        current = plan
        # Tensors whose swap-ins the plan's recomputes read, and those
        # recomputed or whose originals they read: made again from each plan
        # taken, as an unpinned candidate plans recomputes again.
        readers = _swapin_readers(plan.recomputes)
        held = _held(plan.recomputes)
        for swap in order:
            tensor = (swap.producer, swap.output)
            if tensor in readers:
                if unpin:
                    candidate = self._unpinned(current, swap, readers[tensor])
                    if candidate is not None and accept(candidate, current):
                        current = candidate
                        readers = _swapin_readers(current.recomputes)
                        held = _held(current.recomputes)
                continue
            if tensor in held:
                continue
            others = tuple(s for s in current.swaps if s is not swap)
            consumers = tuple(c for sin in swap.swap_ins
                              for c in sin.consumers)
            rec = self.plan(swap.producer, swap.output, consumers, others,
                            current.recomputes)
            if rec is None:
                continue
            candidate = dataclasses.replace(
                current, swaps=retrigger_swaps(others, rec),
                recomputes=current.recomputes + (rec,))
            if accept(candidate, current):
                current = candidate
                readers = _swapin_readers(current.recomputes)
                held = _held(current.recomputes)
        return current

    def _unpinned(self, plan, swap, readers):
        """`plan` without `swap`, its tensor recomputed instead, and the
        recomputes that read its swap-ins (`readers`) planned again without
        it; None where one of them cannot be, or another recompute reads
        their clones."""
        keys = {(r.producer, r.output) for r in readers}
        for rec in plan.recomputes:
            if any(src[1:3] in keys for src in rec.sources("recompute")):
                return None
        levels = self.index.levels
        tensor = (swap.producer, swap.output)
        # The plan's own swap of the tensor: a recompute may have started its
        # swap-ins earlier (`retrigger_swaps`) since the search began.
        swap = next(s for s in plan.swaps if (s.producer, s.output) == tensor)
        consumers = tuple(c for sin in swap.swap_ins for c in sin.consumers)
        swaps = tuple(s for s in plan.swaps if s is not swap)
        kept = tuple(r for r in plan.recomputes if r not in readers)
        placed = ()
        for rec in sorted(readers, key=lambda r: (
                min(levels[c] for c, _ in r.consumers), r.producer)):
            again = self.plan(rec.producer, rec.output, rec.consumers, swaps,
                              kept + placed, rerouted=consumers)
            if again is None:
                return None
            swaps = retrigger_swaps(swaps, again)
            placed += (again,)
        rec = self.plan(swap.producer, swap.output, consumers, swaps,
                        kept + placed)
        if rec is None:
            return None
        return dataclasses.replace(plan, swaps=retrigger_swaps(swaps, rec),
                                   recomputes=kept + placed + (rec,))

    def with_shared_clones(self, plan, accept):
        """`plan` with recomputes that clone an op an earlier one clones
        reading that clone instead, where `accept` agrees.

        A recompute can read only clones made before its own (`plan`
        reads those of the recomputes a plan already holds), but a search that
        adds recomputes one at a time also adds some that run before ones it
        took earlier. Here the recomputes are taken in the order their clones
        run (first late reader's level), and each that clones an op an earlier
        one clones is planned again reading the earlier clones; the plan with
        it is offered to ``accept(candidate, current)``.

        Args:
          plan, accept: as for `with_recomputes`.

        Returns:
          A `Plan` (its recomputes in the order their clones run), or `plan`
          itself when no recompute was replaced.
        """
        levels = self.index.levels
        # Ties keep the plan's order, in which a recompute reading another's
        # clones comes after it.
        recs = [rec for _, _, rec in sorted(
            (min(levels[c] for c, _ in rec.consumers), k, rec)
            for k, rec in enumerate(plan.recomputes))]
        # Recomputes whose clones others read keep their clones as they are.
        read = {src[1:3] for rec in recs for src in rec.sources("recompute")}
        current = plan
        cloned = set()
        for k, rec in enumerate(recs):
            repeats = not cloned.isdisjoint(rec.ops)
            cloned.update(rec.ops)
            if not repeats or (rec.producer, rec.output) in read:
                continue
            earlier = tuple(recs[:k])
            again = self.plan(rec.producer, rec.output, rec.consumers,
                              current.swaps, earlier + tuple(recs[k + 1:]),
                              shared_from=earlier)
            if again is None or len(again.ops) >= len(rec.ops):
                continue
            candidate = dataclasses.replace(
                current, swaps=retrigger_swaps(current.swaps, again),
                recomputes=earlier + (again,) + tuple(recs[k + 1:]))
            if accept(candidate, current):
                current = candidate
                recs[k] = again
        return current
