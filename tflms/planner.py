"""Plan a swapping rewrite from an indexed graph, without touching it.

The planner answers, from a `GraphIndex` and `OpRoles`: which tensors to
swap out, which consumers read each swap-in, which op triggers each
swap-in, which ops wait for a transfer (sync modes), and which control
edges serialize levels. The result is a `Plan`, plain data that the
rewriter applies in one pass and the simulator can replay.

Picture of one swap with two swap-in groups::

    before:  (src) --t--> (near) ...... (far1) (far2) ......... (far3)

    after:   (src) --t--> (near)
               |
               +--t--> [swapout] --+--> [swapin A] --> (far1) (far2)
                        (cpu)      |        ^ ctrl
                                   |     (trigger A)
                                   +--> [swapin B] --> (far3)
                                            ^ ctrl
                                         (trigger B)

Every new edge goes from a lower level to a higher one of the planning
levels (a swap-out sits just after its source, a swap-in just before its
earliest consumer, a trigger at least `swapin_ahead` levels before that),
so a plan can never create a cycle.
"""

import array
import bisect
import dataclasses
import enum

import numpy as np

from tflms import analysis
from tflms import graph_index as gi

__all__ = [
    "SwapParams",
    "SwapInPlan",
    "SwapPlan",
    "RecomputePlan",
    "RECOMPUTABLE_TYPES",
    "TIMED_RECOMPUTABLE_TYPES",
    "MAX_RECOMPUTE_OPS",
    "Plan",
    "TriggerFinder",
    "TRIGGER_SEARCH_LEVELS",
    "DEFERRABLE_TYPES",
    "candidate_edges",
    "deferral_edges",
    "find_trigger",
    "wait_for_ordering",
    "make_plan",
    "plan_recompute",
    "retrigger_swaps",
    "with_recomputes",
    "serialization_edges",
    "requirement_masks",
    "levels_over_size",
]

# How far back from the latest allowed level the trigger search looks.
TRIGGER_SEARCH_LEVELS = 10

# Ops that make a tensor from a shape and a scalar alone. The gradient of a
# v1 ``tf.cond`` (Keras' learning-phase conds around every batch norm) builds
# such zeros for the branch that is not taken; they depend only on the
# forward shapes, so TensorFlow makes them during the forward pass and holds
# them until the backward Merge reads them. Making one later costs a control
# edge, not a transfer.
DEFERRABLE_TYPES = frozenset({"Fill"})


class SyncMode(enum.IntFlag):
    """What a plan makes wait for its copies (the ``sync_mode`` setting).

    Two independent choices, as TFLMSv2 numbered them: bit 1 makes the
    early readers of a swapped tensor wait until its copy to the host has
    finished (nothing new is allocated while it still occupies the device),
    bit 2 makes each swap-in a synchronous copy just before its reader
    instead of one started ahead. ``SyncMode(3)`` is both. It is an int to
    every reader (settings, command line, logs: 0 to 3); `text` says what
    it means.
    """

    NONE = 0
    SWAPOUT = 1
    SWAPIN = 2

    # The digit users set and logs print, also inside reprs of plans.
    def __repr__(self):
        return str(int(self))

    __str__ = __repr__

    @property
    def swapouts_wait(self):
        """Readers wait for the swap-out's copy to the host."""
        return bool(self & SyncMode.SWAPOUT)

    @property
    def swapins_sync(self):
        """Swap-ins are copied just before their reader."""
        return bool(self & SyncMode.SWAPIN)

    @property
    def text(self):
        return _SYNC_TEXT[int(self)]


_SYNC_TEXT = {
    0: "asynchronous copies between host and device",
    1: "device waits for swap-outs, swap-ins asynchronous",
    2: "swap-outs asynchronous, device waits for swap-ins",
    3: "device waits for swap-outs and swap-ins",
}


@dataclasses.dataclass(frozen=True)
class SwapParams:
    """Resolved (non-negative) swapping parameters.

    Before planning, the requested ones may hold -1 (auto) for the first
    three; `sync_mode` is always a `SyncMode` (the search starts from it).
    """

    swapout_threshold: int
    swapin_ahead: int
    swapin_groupby: int
    sync_mode: SyncMode

    def __post_init__(self):
        if not isinstance(self.sync_mode, SyncMode):
            object.__setattr__(self, "sync_mode", SyncMode(self.sync_mode))

    @property
    def sync_swapout(self):
        return self.sync_mode.swapouts_wait

    @property
    def sync_swapin(self):
        return self.sync_mode.swapins_sync

    def describe(self):
        """The parameters as logs and errors name them."""
        return ("swapout_threshold %d, swapin_ahead %d, swapin_groupby %d, "
                "sync_mode %d" % (self.swapout_threshold, self.swapin_ahead,
                                  self.swapin_groupby, self.sync_mode))


@dataclasses.dataclass(frozen=True)
class SwapInPlan:
    """One swap-in of a swapped tensor.

    Attributes:
      consumers: ``(op_id, input_slot)`` pairs rerouted to the swap-in.
      triggers: op ids the swap-in waits on through control edges.
      synchronous: True when the triggers are the first consumer's other
        inputs (sync_mode 2/3, or no trigger op was found in time).
    """

    consumers: tuple
    triggers: tuple
    synchronous: bool

    @property
    def first_consumer(self):
        return self.consumers[0][0]


@dataclasses.dataclass(frozen=True)
class SwapPlan:
    """Swap-out of one tensor and its swap-ins.

    Attributes:
      producer, output: the swapped tensor.
      nbytes: its static size (None if unknown).
      swap_ins: tuple of `SwapInPlan`, earliest first.
      waiters: device ops that wait for the swap-out (sync_mode 1/3).
    """

    producer: int
    output: int
    nbytes: object
    swap_ins: tuple
    waiters: tuple


@dataclasses.dataclass(frozen=True)
class RecomputePlan:
    """A tensor made again, just before its late readers, instead of kept.

    The ops that made it are cloned (same type, attributes and device) and
    the late readers read the last clone's output; the originals stay as
    they are, so the early readers and everything else see no change, and
    the original tensor's buffer is freed after its early readers.

    Attributes:
      producer, output: the recomputed tensor.
      nbytes: its static size (None if unknown).
      ops: the original op ids cloned, in topological order; the last one
        is `producer`.
      inputs: per clone, one source per input slot, each
        ``('tensor', op, output)`` (an original tensor still on the device
        then), ``('clone', k, output)`` (an output of the k-th clone) or
        ``('swapin', op, output, j)`` (the device copy of the j-th swap-in
        of tensor ``(op, output)`` of the same plan's swaps).
      consumers: ``(op_id, input_slot)`` pairs rerouted to the last clone.
      trigger: the op every clone waits on through a control edge, so the
        clones run just before the first late reader (found as a
        swap-in's trigger is).
      earlier_swap_ins: ``(op, output, j)`` of the swap-ins among `inputs`
        that the plan's swaps start later than the clones need them: the
        plan starts them at `trigger` instead (`retrigger_swaps`). The
        batch-norm input that its gradient reads late is swapped anyway;
        brought back a little earlier it also feeds the clones.
    """

    producer: int
    output: int
    nbytes: object
    ops: tuple
    inputs: tuple
    consumers: tuple
    trigger: int
    earlier_swap_ins: tuple = ()

    @property
    def first_consumer(self):
        return min(c for c, _ in self.consumers)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the rewriter will do, in a deterministic order."""

    params: SwapParams
    swaps: tuple
    serialization_edges: tuple
    num_levels: int
    unplanned_groups: int = 0
    deferral_edges: tuple = ()
    recomputes: tuple = ()

    @property
    def control_edges(self):
        """Serialization and deferral edges: control edges between existing
        ops, which the rewriter adds and the simulator replays."""
        return self.serialization_edges + self.deferral_edges

    @property
    def num_swap_ins(self):
        return sum(len(s.swap_ins) for s in self.swaps)

    def swapout_bytes(self):
        return sum(s.nbytes or 0 for s in self.swaps)

    def swapin_bytes(self):
        return sum((s.nbytes or 0) * len(s.swap_ins) for s in self.swaps)

    def moved_bytes(self):
        """Bytes copied between device and host per step, both ways."""
        return self.swapout_bytes() + self.swapin_bytes()

    def recompute_bytes(self):
        """Bytes of the tensors made again instead of kept."""
        return sum(r.nbytes or 0 for r in self.recomputes)


def candidate_edges(index, roles):
    """All (producer, output, consumer, slot, distance) that could be swapped.

    A candidate is a data edge from a source op's output of known rank >= 2
    to a sink op at a strictly higher level. Sorted by producer, output,
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
            for consumer, slot in index.consumers[p][out]:
                if consumer not in roles.sinks:
                    continue
                distance = levels[consumer] - levels[p]
                if distance > 0:
                    edges.append((p, out, consumer, slot, distance))
    edges.sort(key=lambda e: (e[0], e[1], levels[e[2]], e[2], e[3]))
    return edges


def deferral_edges(index, roles, extra_edges=()):
    """Control edges ``(trigger, op)`` that delay `DEFERRABLE_TYPES` ops
    until shortly before their first reader.

    An op qualifies when it is an active device op outside loops whose
    output has rank >= 2 and whose earliest successor (data, control, or
    `extra_edges` such as serialization) is at least three levels later. Its
    trigger is found as a swap-in's is (`find_trigger` with
    ``swapin_ahead=1``): an ancestor of that successor at a level in
    ``(level(op), level(successor) - 1)``. Every descendant of the op is at
    or after that successor, so the trigger is none of them and no cycle can
    close; and the op moves to the trigger's next level, before all of its
    successors, so no other op's level changes.

    Args:
      index: a `GraphIndex` with the planning levels (after serialization,
        whose edges it holds in `planned_edges`).
      roles: its `OpRoles`.
      extra_edges: more control edges not in the graph.

    Returns:
      A tuple of ``(trigger_id, op_id)``, sorted by op id.
    """
    levels = index.levels
    extra = {}
    for a, b in tuple(index.planned_edges) + tuple(extra_edges):
        extra.setdefault(a, []).append(b)
    edges = []
    for op, t in enumerate(index.types):
        if (t not in DEFERRABLE_TYPES or op not in roles.device_ops
                or op in roles.inactive or index.in_v1_loop[op]):
            continue
        shape = index.output_shapes[op][0] if index.output_shapes[op] else None
        if shape is None or len(shape) < 2:
            continue
        successors = list(index.successors(op)) + extra.get(op, [])
        if not successors:
            continue
        first = min(successors, key=lambda c: (levels[c], c))
        if levels[first] - levels[op] < 3:
            continue
        trigger = find_trigger(index, roles, op, first, 1)
        if trigger is not None:
            edges.append((trigger, op))
    return tuple(edges)


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
        (`ordering.order_peaks`).

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
    """Split consumers (sorted by level) into runs whose gaps are <= groupby."""
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


def _trigger_window(levels, src, first_consumer, ahead):
    """Levels ``[lower, upper)`` where a swap-in trigger may sit: after the
    source, `ahead` levels before the consumer, the last
    `TRIGGER_SEARCH_LEVELS` of that span."""
    upper = levels[first_consumer] - ahead
    return max(levels[src] + 1, upper - TRIGGER_SEARCH_LEVELS), upper


def find_trigger(index, roles, src, first_consumer, ahead):
    """The op that starts a swap-in: a *data* ancestor of the consumer that
    TensorFlow cannot merge with it (`may_trigger`), on the managed device
    and on the consumer's own device (towers of a multi-tower model start
    their own swap-ins), active, outside conditionals and loops, at a level
    in ``(level(src), level(consumer) - ahead)``, as late as possible; ties
    go to the lowest id.

    Why data ancestors only: the edges ``trigger -> swap-in -> consumer``
    then add no ordering between two graph ops that the graph's own data
    edges did not already impose, so no merge TensorFlow makes at run time
    on the unchanged graph can close a cycle through the swap-in (see
    `analysis.fusion_partners`). An ancestor through control edges only,
    such as the `BiasAddGrad` that `tf.gradients`' ``tuple`` identities make
    every sibling gradient wait for, gives no such guarantee.
    """
    levels = index.levels
    lower, upper = _trigger_window(levels, src, first_consumer, ahead)
    if upper <= lower:
        return None
    ancestors = analysis.ancestors_within(index, first_consumer, lower,
                                          data_only=True)
    best = None
    for a in ancestors:
        if levels[a] >= upper or not may_trigger(index, roles, a,
                                                 first_consumer):
            continue
        if best is None or (levels[a], -a) > (levels[best], -best):
            best = a
    return best


def may_trigger(index, roles, op, consumer):
    """True if `op` may start a swap-in read by `consumer`, given that it is
    a data ancestor of it: a trigger op on the consumer's device that
    TensorFlow will not merge with the consumer."""
    return (op in roles.triggers
            and op not in roles.fused_with.get(consumer, ())
            and analysis.same_device(index.devices[op],
                                     index.devices[consumer]))


def _data_reaches(index, op, consumer):
    """True if a path of data edges leads from `op` to `consumer`: a walk
    back from the consumer over data inputs, no lower than `op`'s level,
    that stops when it meets `op`."""
    levels = index.levels
    floor = levels[op]
    seen = {consumer}
    stack = [consumer]
    while stack:
        for p in index.fanins[stack.pop()]:
            if p == op:
                return True
            if p not in seen and levels[p] > floor:
                seen.add(p)
                stack.append(p)
    return False


_UNKNOWN = object()  # a fast search could not answer


def _int_array(values):
    return array.array("q", np.asarray(values, dtype=np.int64).tobytes())
# Ops with several inputs above the trigger window that one spine search
# follows before it leaves the answer to the walk.
_BRANCH_LIMIT = 256


class TriggerFinder:
    """`find_trigger` for many swap-ins of one index, fast on deep graphs.

    The full search walks every ancestor of the consumer down to the
    trigger window, ``swapin_ahead`` levels times the graph's width, for
    every swap-in of every plan a search tries. But the latest allowed level
    is usually held by an op on the consumer's *critical path*: following
    from the consumer its lowest-id data input one level below goes down
    exactly one level per step (a Kahn level is one more than the highest
    input's; when a control input holds that level the chain ends),
    and binary lifting over that chain reaches any level in O(log levels)
    steps. When that op may start a swap-in it is taken: it has the level
    the full search would pick, and the simulator sees only levels. When it
    may not, the full search's answer is computed by `_latest_trigger`
    (same answer, logarithmic time on chain-shaped graphs), and only where
    that cannot answer does the full search walk the graph. Answers are
    remembered per (consumer, ahead, lowest allowed level) across the plans
    of one search.
    """

    def __init__(self, index, roles):
        self.index = index
        self.roles = roles
        self._cache = {}
        self._reaches = {}
        self._jumps = None
        self._spine = None
        self._best_by_device = {}
        # make_plan's candidate edges by tensor, and its answers per tensor,
        # shared by the plans of a search (valid for one list of edges).
        self._edges = None
        self._tensor_edges = ()
        self._swap_memo = {}

    def _build_jumps(self):
        index = self.index
        levels = index.levels
        chain = np.full(index.num_ops, -1, dtype=np.int64)
        for v in range(index.num_ops):
            below = levels[v] - 1
            for p in index.fanins[v]:  # data inputs, increasing ids
                if levels[p] == below:
                    chain[v] = p
                    break
        # jumps[k][v]: the op 2**k levels below v on its chain (-1: none;
        # serialization edges can leave an op without an input one level
        # below, and the full search then answers).
        jumps = [chain]
        while (1 << len(jumps)) <= index.num_levels:
            prev = jumps[-1]
            jumps.append(np.where(prev >= 0, prev[np.maximum(prev, 0)], -1))
        self._jumps = jumps

    def _on_chain(self, op, levels_down):
        if self._jumps is None:
            self._build_jumps()
        k = 0
        while levels_down and op >= 0:
            if levels_down & 1:
                op = int(self._jumps[k][op])
            levels_down >>= 1
            k += 1
        return op

    def find(self, src, first_consumer, ahead):
        """The trigger for a swap-in of `src` read first by
        `first_consumer`, or None (same contract as `find_trigger`)."""
        levels = self.index.levels
        key = (first_consumer, ahead, levels[src] + 1)
        if key in self._cache:
            return self._cache[key]
        lower, upper = _trigger_window(levels, src, first_consumer, ahead)
        trigger = None
        if upper > lower:
            op = self._on_chain(first_consumer,
                                levels[first_consumer] - (upper - 1))
            if op >= 0 and may_trigger(self.index, self.roles, op,
                                       first_consumer):
                trigger = op
            else:
                trigger = self._latest_trigger(first_consumer, lower, upper)
                if trigger is _UNKNOWN:
                    trigger = find_trigger(self.index, self.roles, src,
                                           first_consumer, ahead)
        self._cache[key] = trigger
        return trigger

    # ---- the full search without the walk --------------------------------
    # `find_trigger` answers with the best data ancestor of the consumer
    # below `upper` that may trigger, best meaning highest level, then
    # lowest id (or None if that one is below `lower`). Its walk covers
    # every ancestor between the consumer and the window: `swapin_ahead`
    # levels of the graph for every swap-in, which on a deep graph is most
    # of the planning time. The same best op follows from three arrays:
    #
    # * best[v]: the best op that may trigger among v and its data
    #   ancestors (one pass in level order; per consumer device, since a
    #   trigger must be on its consumer's device);
    # * the *spine* of v: its data input of highest level (ties: lowest id),
    #   and side[v], the highest level of its other data inputs;
    # * rest[v]: the best of best[] over those other inputs.
    #
    # While the spine ops from the consumer down to `upper` have their other
    # inputs below `upper` (side < upper), the ancestors below `upper` are
    # those of the other inputs of these ops plus those of the first spine
    # op below `upper`, so the answer is the best of their rest[] and that
    # op's best[]: a path maximum, answered by binary lifting over the spine
    # in O(log levels). An op with a second input at or above `upper` (a
    # join, as in a residual block) starts a spine search from each such
    # input; each join is expanded once. Ranks encode (level, -id) as one
    # integer.

    def _build_spine(self):
        index = self.index
        levels = index.levels
        n = index.num_ops
        spine = np.full(n, -1, dtype=np.int64)
        side = np.full(n, -1, dtype=np.int64)
        for v in range(n):
            ins = index.fanins[v]
            if not ins:
                continue
            top = ins[0]
            for p in ins[1:]:
                if levels[p] > levels[top]:
                    top = p
            spine[v] = top
            high = -1
            for p in ins:
                if p != top and levels[p] > high:
                    high = levels[p]
            side[v] = high
        jumps, sides = [spine], [side]
        while (1 << len(jumps)) <= index.num_levels:
            prev, prev_side = jumps[-1], sides[-1]
            nxt = np.maximum(prev, 0)
            jumps.append(np.where(prev >= 0, prev[nxt], -1))
            # side over the 2**k ops from v (only used where the jump exists)
            sides.append(np.where(prev >= 0,
                                  np.maximum(prev_side, prev_side[nxt]),
                                  prev_side))
        # array('q') reads single entries as Python ints several times
        # faster than numpy does, and the searches read one at a time.
        self._spine = (_int_array(spine), [_int_array(j) for j in jumps],
                       [_int_array(x) for x in sides])

    def _best_tables(self, device):
        """rest[] lifted like the spine, for consumers placed on `device`."""
        tables = self._best_by_device.get(device)
        if tables is not None:
            return tables
        index, roles = self.index, self.roles
        levels = index.levels
        n = index.num_ops
        spine = self._spine[0]
        same = {}
        best = [-1] * n
        for level_ops in index.ops_by_level:
            for v in level_ops:
                b = -1
                if v in roles.triggers:
                    d = index.devices[v]
                    ok = same.get(d)
                    if ok is None:
                        ok = same[d] = analysis.same_device(d, device)
                    if ok:
                        b = levels[v] * n + (n - 1 - v)
                for p in index.fanins[v]:
                    if best[p] > b:
                        b = best[p]
                best[v] = b
        rest = np.full(n, -1, dtype=np.int64)
        for v in range(n):
            top = spine[v]
            r = -1
            for p in index.fanins[v]:
                if p != top and best[p] > r:
                    r = best[p]
            rest[v] = r
        rests = [rest]
        for jump in self._spine[1][:-1]:
            jump = np.frombuffer(jump, dtype=np.int64)
            prev = rests[-1]
            rests.append(np.where(jump >= 0,
                                  np.maximum(prev, prev[np.maximum(jump, 0)]),
                                  prev))
        # cap[u]: the best rank of all that may trigger below level u. A
        # search that found it can stop: nothing can beat it.
        cap = [-1] * (index.num_levels + 1)
        for lvl, level_ops in enumerate(index.ops_by_level):
            top = cap[lvl]
            for v in level_ops:
                if v in roles.triggers and levels[v] * n + (n - 1 - v) > top \
                        and same.get(index.devices[v]):
                    top = levels[v] * n + (n - 1 - v)
            cap[lvl + 1] = top
        tables = (best, [_int_array(r) for r in rests], cap)
        self._best_by_device[device] = tables
        return tables

    def _latest_trigger(self, consumer, lower, upper):
        """`find_trigger`'s answer for the window ``[lower, upper)``, or
        `_UNKNOWN` when the spines cannot give it cheaply."""
        index = self.index
        levels = index.levels
        if levels[consumer] < upper:
            return _UNKNOWN
        if self._spine is None:
            self._build_spine()
        spine, jumps, sides = self._spine
        best, rests, cap = self._best_tables(index.devices[consumer])
        most = cap[upper]
        found = -1
        top = len(jumps) - 1
        stack, branched = [consumer], set()
        while stack and found < most:
            v = stack.pop()
            # Down v's spine while the ops stay at or above `upper` and
            # their other inputs below it. Each spine step goes down at
            # least one level, so jumps longer than levels[v] - upper land
            # below `upper`: the lifting starts at the longest that can
            # land (a query costs the log of its distance, not of the depth).
            reach = max(levels[v] - upper, 0).bit_length() - 1
            for k in range(min(top, reach), -1, -1):
                w = jumps[k][v]
                if w >= 0 and levels[w] >= upper and sides[k][v] < upper:
                    r = rests[k][v]
                    if r > found:
                        found = r
                    v = w
            if sides[0][v] < upper:
                # The next spine op is below `upper` (or there is none).
                r = rests[0][v]
                below = spine[v]
                if below >= 0 and best[below] > r:
                    r = best[below]
                if r > found:
                    found = r
                continue
            # v has several inputs at or above `upper`: follow each.
            if v in branched:
                continue
            branched.add(v)
            if len(branched) > _BRANCH_LIMIT:
                return _UNKNOWN  # as slow as the walk: let it answer
            ins = [p for p in index.fanins[v] if best[p] > found]
            # Lowest level searched first: it reaches the window soonest,
            # and what it finds prunes the rest (best[] bounds a search).
            ins.sort(key=lambda p: -levels[p])
            for p in ins:
                if levels[p] >= upper:
                    stack.append(p)
                elif best[p] > found:
                    found = best[p]
        if found < 0:
            return None
        n = index.num_ops
        op = n - 1 - found % n
        if levels[op] < lower:
            return None
        if op in self.roles.fused_with.get(consumer, ()):
            return _UNKNOWN  # the next best may be anywhere: walk
        return op

    def _use_edges(self, edges):
        if edges is self._edges:
            return
        grouped = []
        for p, out, consumer, slot, distance in edges:
            if not grouped or grouped[-1][:2] != (p, out):
                grouped.append((p, out, [], [], []))
            grouped[-1][2].append((consumer, slot))
            grouped[-1][3].append(distance)
        for _, _, _, distances, widest in grouped:
            # widest[k]: the largest level gap between consecutive
            # consumers from the k-th on.
            gap = 0
            widest.extend([0] * len(distances))
            for k in range(len(distances) - 2, -1, -1):
                gap = max(gap, distances[k + 1] - distances[k])
                widest[k] = gap
        self._edges = edges
        self._tensor_edges = tuple(grouped)
        self._swap_memo = {}

    def tensor_edges(self, edges):
        """`candidate_edges` grouped by tensor: ``(producer, output,
        [(consumer, slot)], [distance], [widest gap from here on])``,
        distances ascending."""
        self._use_edges(edges)
        return self._tensor_edges

    def swap_memo_for(self, edges):
        """make_plan's memo of swaps for plans made from `edges`."""
        self._use_edges(edges)
        return self._swap_memo

    def _reaches_by_spine(self, op, consumer):
        """`_data_reaches` by the spines: True if `op` is a data ancestor of
        `consumer`, or `_UNKNOWN`. Only inputs above `op`'s level can lead
        to it, so a spine is followed (by lifting) while its other inputs
        are below that level, and each join above it is expanded once."""
        index = self.index
        levels = index.levels
        if self._spine is None:
            self._build_spine()
        spine, jumps, sides = self._spine
        floor = levels[op]
        top = len(jumps) - 1
        stack, branched = [consumer], set()
        while stack:
            v = stack.pop()
            # Only jumps shorter than levels[v] - floor can stay above it.
            reach = max(levels[v] - floor - 1, 0).bit_length() - 1
            for k in range(min(top, reach), -1, -1):
                w = jumps[k][v]
                if w >= 0 and levels[w] > floor and sides[k][v] < floor:
                    v = w
            if sides[0][v] < floor:
                if spine[v] == op:
                    return True
                continue
            if v in branched:
                continue
            branched.add(v)
            if len(branched) > _BRANCH_LIMIT:
                return _UNKNOWN
            if op in index.fanins[v]:
                return True
            # Lowest level searched first: it reaches `op`'s level soonest.
            stack.extend(sorted((p for p in index.fanins[v]
                                 if levels[p] > floor),
                                key=lambda p: -levels[p]))
        return False

    def may_also_start(self, trigger, consumer):
        """True if `trigger`, found for an earlier consumer of the same
        swap-in, may start it for `consumer` as well: it reaches `consumer`
        through data edges and TensorFlow does not merge the two."""
        key = (trigger, consumer)
        if key not in self._reaches:
            reaches = False
            if consumer not in self.roles.fused_with.get(trigger, ()):
                reaches = self._reaches_by_spine(trigger, consumer)
                if reaches is _UNKNOWN:
                    reaches = _data_reaches(self.index, trigger, consumer)
            self._reaches[key] = reaches
        return self._reaches[key]


def _sync_inputs(index, roles, consumer):
    """Device inputs of a consumer, which a synchronous swap-in waits on;
    never one TensorFlow may merge with the consumer (the wait would close
    a cycle through the merged node, see `analysis.fusion_partners`)."""
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
            known = memo[key] = _plan_swap(index, roles, params, groupby,
                                           triggers, batch_size, p, out,
                                           consumers[first:])
        swap, missed = known
        unplanned += missed
        if swap is not None:
            swaps.append(swap)
    return Plan(params=params, swaps=tuple(swaps),
                serialization_edges=tuple(index.planned_edges),
                num_levels=index.num_levels, unplanned_groups=unplanned,
                deferral_edges=tuple(deferral))


def _plan_swap(index, roles, params, groupby, triggers, batch_size, p, out,
               consumers):
    """The `SwapPlan` of tensor ``(p, out)`` read by `consumers` far away
    (None if no swap-in can be started in time), and how many swap-in
    groups were left on the device."""
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
            and (t not in _BATCH_NORM_TYPES or index.bn_is_training[op] is True))


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


def plan_recompute(index, roles, producer, output, consumers,
                   batch_size=None, swaps=(), recomputes=(), triggers=None,
                   clone_types=RECOMPUTABLE_TYPES):
    """The cheapest way to make tensor ``(producer, output)`` again for its
    late readers `consumers`, or None.

    Walks back from the producer over data inputs: an input that is on the
    device when the first late reader runs (see `_input_source`) is read
    as it is; any other input's producer must be cloned too (it must be of
    `clone_types`, see `_may_clone`), up to `MAX_RECOMPUTE_OPS`
    ops. Cloning exactly the producers of the inputs that are not available
    is the smallest set that can work. The clones wait on a trigger found
    as a swap-in's is, `len(ops)` levels ahead of the first late reader, so
    they run just before it and not as soon as their inputs exist.

    Args:
      index: a `GraphIndex` with the planning levels.
      roles: its `OpRoles`.
      producer, output: the tensor.
      consumers: ``(op_id, input_slot)`` pairs of its late readers.
      batch_size: for the tensor's size.
      swaps, recomputes: the plan's other `SwapPlan`s and `RecomputePlan`s
        (their rerouted readers do not keep a tensor on the device; their
        swap-ins may be read).
      triggers: a `TriggerFinder` for the same index and roles.
      clone_types: the op types that may be cloned: `RECOMPUTABLE_TYPES`
        (cheap ops), or `TIMED_RECOMPUTABLE_TYPES` (convolutions and matrix
        products too) where a step-time model judges each recompute.

    Returns:
      A `RecomputePlan`, or None.
    """
    if not consumers or not _may_clone(index, roles, producer, clone_types):
        return None
    levels = index.levels
    consumers = tuple(sorted(consumers, key=lambda c: (levels[c[0]], c)))
    level = levels[consumers[0][0]]
    rerouted = _rerouted_edges(swaps, recomputes) | set(consumers)
    swaps_by_tensor = {(s.producer, s.output): s for s in swaps}
    recomputed = {(r.producer, r.output) for r in recomputes}
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
                source = _input_source(index, roles, tensor, level, rerouted,
                                       swaps_by_tensor)
            if source is not None:
                sources[tensor] = source
                continue
            q = tensor[0]
            if len(cloned) >= MAX_RECOMPUTE_OPS or not _may_clone(
                    index, roles, q, clone_types):
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
    if triggers is None:
        triggers = TriggerFinder(index, roles)
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
        nbytes=gi.tensor_bytes(index, producer, output, batch_size),
        ops=ops, inputs=inputs, consumers=consumers, trigger=trigger,
        earlier_swap_ins=earlier)


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


def with_recomputes(index, roles, plan, accept, batch_size=None,
                    triggers=None, clone_types=RECOMPUTABLE_TYPES):
    """`plan` with swaps replaced by recomputes where `accept` agrees.

    Each swapped tensor, most bytes moved first, is tried: its swap-ins'
    readers become a `plan_recompute` candidate, and the plan without that
    swap and with the recompute is offered to ``accept(candidate,
    current)``, which returns True to keep it (e.g. a replay that still
    fits the budget and a cost function that prefers it). Swaps whose
    swap-ins or tensors an accepted recompute reads are kept.

    Args:
      index, roles: as for `make_plan`.
      plan: a `Plan`.
      accept: callable ``(candidate Plan, current Plan) -> bool``.
      batch_size: for tensor sizes.
      triggers: a `TriggerFinder` for the same index and roles.
      clone_types: as for `plan_recompute`.

    Returns:
      A `Plan` (the same object when nothing was replaced).
    """
    if triggers is None:
        triggers = TriggerFinder(index, roles)
    order = sorted(plan.swaps, key=lambda s: (
        -(s.nbytes or 0) * (1 + len(s.swap_ins)), s.producer, s.output))
    current = plan
    pinned = set()  # tensors whose swaps or originals recomputes read
    for swap in order:
        tensor = (swap.producer, swap.output)
        if tensor in pinned:
            continue
        others = tuple(s for s in current.swaps if s is not swap)
        consumers = tuple(c for sin in swap.swap_ins for c in sin.consumers)
        rec = plan_recompute(index, roles, swap.producer, swap.output,
                             consumers, batch_size, others,
                             current.recomputes, triggers, clone_types)
        if rec is None:
            continue
        candidate = dataclasses.replace(
            current, swaps=retrigger_swaps(others, rec),
            recomputes=current.recomputes + (rec,))
        if accept(candidate, current):
            current = candidate
            pinned.add(tensor)
            pinned.update((src[1], src[2]) for srcs in rec.inputs
                          for src in srcs if src[0] != "clone")
    return current


def levels_over_size(index, roles, gib, batch_size=None):
    """Levels whose active device ops' outputs together exceed `gib` GiB."""
    limit = gib * (1 << 30)
    chosen = []
    for lvl, ops in enumerate(index.ops_by_level):
        total = 0
        for op in ops:
            if op in roles.device_ops and op not in roles.inactive:
                for out in range(len(index.output_shapes[op])):
                    total += gi.tensor_bytes(index, op, out, batch_size) or 0
        if total > limit:
            chosen.append(lvl)
    return chosen


# Ops that bring a step's data in: an op depends on the feeds of the data
# inputs among its ancestors.
_DATA_INPUT_TYPES = frozenset({
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
})

# Stateful ops without side effects: reading a variable, or passing a
# reference to one along, changes nothing.
_READ_ONLY_STATEFUL_TYPES = frozenset({
    "VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
    "VarIsInitializedOp", "IsVariableInitialized", "VariableShape",
    "ResourceGather", "ResourceGatherNd", "RefIdentity", "RefSwitch",
    "RefMerge", "RefEnter", "RefExit", "RefNextIteration",
})


def requirement_masks(index):
    """Per op, a bitmask of what running it requires besides computing: the
    data inputs it needs fed (placeholders) and the side effects it sets off
    (variable updates, random draws, iterator reads, checkpoint I/O...),
    over its data and control ancestors, itself included."""
    masks = [0] * index.num_ops
    bit = 0
    for level in index.ops_by_level:
        for op in level:
            mask = 0
            for p in index.predecessors(op):
                mask |= masks[p]
            t = index.types[op]
            if t in _DATA_INPUT_TYPES or (
                    index.is_stateful[op]
                    and t not in _READ_ONLY_STATEFUL_TYPES):
                mask |= 1 << bit
                bit += 1
            masks[op] = mask
    return masks


def serialization_edges(index, roles, slices, extra_levels=(),
                        excluded=frozenset()):
    """Control edges that make the ops of the chosen levels run one by one.

    A control edge ``a -> b`` makes every run of `b` run `a` first, so only
    edges that cannot change what a fetch does are made:

    * stateful ops (variable updates, random numbers, checkpoint I/O,
      iterators...) are never chained;
    * only ops that depend on a placeholder or a side effect are chained:
      the activations of a step. Initializers, the Saver's ops and
      computations on variables alone stay runnable on their own;
    * `b` waits only for an op whose `requirement_masks` are a subset of
      its own: no fetch needs a feed, or sets off a side effect, it did not
      before. With several train ops, or gradient accumulation, one never
      updates the variables of another; an evaluation branch on another
      placeholder is never tied to the training step; an op made under
      ``tf.control_dependencies([counter.assign_add(1)])`` never makes the
      forward pass count.

    The eligible ops are taken in level order, and within a level by id
    with ops TensorFlow may merge (`analysis.fusion_partners`) next to each
    other; each is chained after the latest earlier one that it may wait
    for. Ops in one level
    never depend on each other and every edge goes forward in that order,
    so no cycle can close.

    Args:
      index: a `GraphIndex` (original levels).
      roles: `OpRoles`.
      slices: `slice` objects (`Settings.serialization_levels`).
      extra_levels: more level indices (e.g. from `levels_over_size`).
      excluded: op ids that must not be chained (e.g. variable
        initializers, which must stay runnable without the training inputs).

    Returns:
      A tuple of ``(from_id, to_id)`` edges, and the sorted chosen levels.
    """
    all_levels = list(range(index.num_levels))
    chosen = set(extra_levels)
    for s in slices:
        chosen.update(all_levels[s])
    masks = None
    last_by_mask = {}  # requirement mask -> (position, op) of its latest op
    edges = []
    position = 0
    for lvl in sorted(chosen):
        # Ops TensorFlow may merge at run time (`analysis.fusion_partners`)
        # stay next to each other in the chain: an op chained between two
        # of them would sit on a cycle through the merged node.
        fused = roles.fused_with
        in_order = sorted(index.ops_by_level[lvl],
                          key=lambda o: (min(fused.get(o, frozenset()) | {o}), o))
        for op in in_order:
            if (op in roles.device_ops and op not in roles.inactive
                    and op not in excluded
                    and not index.is_stateful[op]
                    and not index.in_v1_cond[op] and not index.in_v1_loop[op]
                    and index.types[op] not in analysis.NEVER_SWAPPED_TYPES
                    and index.types[op] not in gi.CONTROL_FLOW_V1_TYPES):
                if masks is None:
                    masks = requirement_masks(index)
                mask = masks[op]
                if not mask:
                    continue
                before = [last for m, last in last_by_mask.items()
                          if m & ~mask == 0]
                if before:
                    edges.append((max(before)[1], op))
                last_by_mask[mask] = (position, op)
                position += 1
    existing = set()
    for a, b in edges:
        if a in index.control_inputs[b]:
            existing.add((a, b))
    return tuple(e for e in edges if e not in existing), sorted(chosen)
